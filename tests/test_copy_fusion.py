"""copy-fusion, structure (no jax): copies of a fusion's outputs become its extra outputs (XLA's CopyFusion), in
the entry computation only, under XLA's rules and the never-slower check. Numerics on XLA CPU:
test_copy_fusion_numerics.py."""

from __future__ import annotations

import pytest
from fusion_cases import entry_module
from hlopt.cost_model import register_cost_model, unregister_cost_model
from hlopt.hlo.ir import Module
from hlopt.passes.framework.base import PassResult
from hlopt.passes.fusion.copy_fusion import CopyFusion

from hlopt import hlo


@pytest.fixture
def slow_fusions():
    """A cost model that rates every fusion slower than its parts (test_fusion_trial's)."""
    from test_fusion_trial import _SlowFusions

    register_cost_model("slow-fusions-copy", _SlowFusions)
    yield "slow-fusions-copy"
    unregister_cost_model("slow-fusions-copy")

_BROADCAST = """%bcast (c: f32[]) -> f32[64,128] {
  %c = f32[] parameter(0)
  ROOT %b = f32[64,128]{1,0} broadcast(%c), dimensions={}
}
%zeros () -> f32[64,128] {
  %z = f32[] constant(0)
  ROOT %b = f32[64,128]{1,0} broadcast(%z), dimensions={}
}
%two () -> (f32[64,128], f32[64,128]) {
  %z = f32[] constant(0)
  %b = f32[64,128]{1,0} broadcast(%z), dimensions={}
  %e = f32[64,128]{1,0} exponential(%b)
  ROOT %t = (f32[64,128]{1,0}, f32[64,128]{1,0}) tuple(%b, %e)
}
%rowsum (x: f32[64,128]) -> f32[64] {
  %x = f32[64,128]{1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[64]{0} reduce(%x, %z), dimensions={1}, to_apply=%sum
}
"""

#: A zero-filled buffer copied twice (copy insertion's copies for two loops' initial states), and read itself.
COPIES_OF_A_FUSION = entry_module("""  %f = f32[64,128]{1,0} fusion(), kind=kLoop, calls=%zeros
  %c1 = f32[64,128]{1,0} copy(%f)
  %c2 = f32[64,128]{1,0} copy(%f)
  ROOT %o = (f32[64,128]{1,0}, f32[64,128]{1,0}, f32[64,128]{1,0}) tuple(%f, %c1, %c2)""", "",
    "(f32[64,128], f32[64,128], f32[64,128])", _BROADCAST)

#: The copied value is an output of a multi-output fusion read by a get-tuple-element with several users.
COPIES_THROUGH_A_GTE = entry_module("""  %f = (f32[64,128]{1,0}, f32[64,128]{1,0}) fusion(), kind=kLoop, calls=%two
  %g0 = f32[64,128]{1,0} get-tuple-element(%f), index=0
  %g1 = f32[64,128]{1,0} get-tuple-element(%f), index=1
  %c1 = f32[64,128]{1,0} copy(%g0)
  %c2 = f32[64,128]{1,0} copy(%g0)
  ROOT %o = (f32[64,128]{1,0}, f32[64,128]{1,0}, f32[64,128]{1,0}, f32[64,128]{1,0}) tuple(%g0, %g1, %c1, %c2)""",
    "", "(f32[64,128], f32[64,128], f32[64,128], f32[64,128])", _BROADCAST)

#: A lone broadcast of a constant with copies (nothing fused it: its other user is a tuple).
COPIES_OF_A_LONE_BROADCAST = entry_module("""  %z = f32[] constant(1)
  %b = f32[64,128]{1,0} broadcast(%z), dimensions={}
  %c1 = f32[64,128]{1,0} copy(%b)
  ROOT %o = (f32[64,128]{1,0}, f32[64,128]{1,0}) tuple(%b, %c1)""", "", "(f32[64,128], f32[64,128])")


def _run(text: str, **options) -> tuple[Module, Module, PassResult]:
    m = hlo.parse(text)
    before = m.clone()
    result = CopyFusion(**options).run_with_result(m)
    hlo.verify(m)
    return before, m, result


def _opcodes(m: Module) -> list[str]:
    return [i.opcode for i in m.entry.instructions]


def test_copies_of_a_fusion_become_its_outputs():
    _, m, r = _run(COPIES_OF_A_FUSION)
    assert r.changed and "copy" not in _opcodes(m)
    (f,) = [i for i in m.entry.instructions if i.opcode == "fusion"]
    assert f.shape.is_tuple and len(f.shape.elements) == 3 and str(f.attrs["kind"]) == "kLoop"
    assert [i.opcode for i in f.attrs["calls"].root.operands] == ["broadcast", "copy", "copy"]
    assert all(op.opcode == "get-tuple-element" and op.operand(0) is f for op in m.entry.root.operands)
    (e,) = r.explanations
    assert e.taken and e.rule == "copy" and e.launches_saved == 2 and e.after_us <= e.before_us


def test_copies_through_a_get_tuple_element_with_several_users():
    _, m, r = _run(COPIES_THROUGH_A_GTE)
    assert r.changed and "copy" not in _opcodes(m)
    (f,) = [i for i in m.entry.instructions if i.opcode == "fusion"]
    assert len(f.shape.elements) == 4
    assert {op.operand(0) for op in m.entry.root.operands} == {f}


def test_a_lone_broadcast_of_a_constant_is_wrapped_and_takes_its_copies():
    _, m, r = _run(COPIES_OF_A_LONE_BROADCAST)
    assert r.changed and _opcodes(m).count("fusion") == 1 and "copy" not in _opcodes(m)


def test_copies_of_a_parameter_or_a_reduction_stay():
    text = entry_module("""  %x = f32[64,128]{1,0} parameter(0)
  %r = f32[64]{0} fusion(%x), kind=kInput, calls=%rowsum
  %c1 = f32[64]{0} copy(%r)
  %c2 = f32[64,128]{1,0} copy(%x)
  ROOT %o = (f32[64]{0}, f32[64]{0}, f32[64,128]{1,0}) tuple(%r, %c1, %c2)""", "x: f32[64,128]",
                        "(f32[64], f32[64], f32[64,128])", _BROADCAST)
    _, m, r = _run(text)
    assert not r.changed and _opcodes(m).count("copy") == 2
    assert any(not e.taken and e.rule == "copy" for e in r.explanations)


def test_a_copy_that_changes_the_layout_stays():
    text = entry_module("""  %f = f32[64,128]{1,0} fusion(), kind=kLoop, calls=%zeros
  %c1 = f32[64,128]{0,1} copy(%f)
  ROOT %o = (f32[64,128]{1,0}, f32[64,128]{0,1}) tuple(%f, %c1)""", "", "(f32[64,128], f32[64,128]{0,1})",
                        _BROADCAST)
    _, m, r = _run(text)
    assert not r.changed and "copy" in _opcodes(m)


def test_a_fusion_whose_parameters_feed_a_broadcast_keeps_its_copies():
    text = entry_module("""  %x = f32[] parameter(0)
  %f = f32[64,128]{1,0} fusion(%x), kind=kLoop, calls=%bcast
  %c1 = f32[64,128]{1,0} copy(%f)
  ROOT %o = (f32[64,128]{1,0}, f32[64,128]{1,0}) tuple(%f, %c1)""", "x: f32[]", "(f32[64,128], f32[64,128])",
                        _BROADCAST)
    _, m, r = _run(text)
    assert not r.changed and any("elementwise" in e.reason for e in r.explanations)


def test_copies_outside_the_entry_computation_stay():
    text = """HloModule t

%zeros () -> f32[64,128] {
  %z = f32[] constant(0)
  ROOT %b = f32[64,128]{1,0} broadcast(%z), dimensions={}
}

%callee () -> (f32[64,128], f32[64,128]) {
  %f = f32[64,128]{1,0} fusion(), kind=kLoop, calls=%zeros
  %c1 = f32[64,128]{1,0} copy(%f)
  ROOT %o = (f32[64,128]{1,0}, f32[64,128]{1,0}) tuple(%f, %c1)
}

ENTRY %main () -> (f32[64,128], f32[64,128]) {
  ROOT %r = (f32[64,128]{1,0}, f32[64,128]{1,0}) call(), to_apply=%callee
}
"""
    _, m, r = _run(text)
    assert not r.changed


def test_a_model_that_rates_the_fusion_slow_refuses_it(slow_fusions):
    _, m, r = _run(COPIES_OF_A_FUSION, device=slow_fusions)
    assert not r.changed and _opcodes(m).count("copy") == 2
    assert any("slower as built" in e.reason for e in r.explanations)
