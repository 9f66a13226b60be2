"""horizontal-loop-fusion, structure (no jax): independent loop kernels of one shape feeding one consumer become
one kernel (XLA's HorizontalLoopFusion, kLoop form), in the entry computation only, under XLA's candidate rules
and the never-slower check. Numerics on XLA CPU: test_horizontal_loop_fusion_numerics.py."""

from __future__ import annotations

import pytest
from fusion_cases import entry_module
from hlopt.cost_model import register_cost_model, unregister_cost_model
from hlopt.hlo.ir import Module
from hlopt.passes.framework.base import PassResult
from hlopt.passes.framework.pipeline import run_pipeline
from hlopt.passes.fusion.horizontal_loop_fusion import HorizontalLoopFusion

from hlopt import hlo


@pytest.fixture
def slow_fusions():
    """A cost model that rates every fusion slower than its parts (test_fusion_trial's)."""
    from test_fusion_trial import _SlowFusions

    register_cost_model("slow-fusions-horizontal", _SlowFusions)
    yield "slow-fusions-horizontal"
    unregister_cost_model("slow-fusions-horizontal")


def _updates(shapes: list[str]) -> str:
    """An SGD-with-momentum step over tensors of `shapes`: per tensor m' = 0.9 m + g, p' = p - 0.01 m'."""
    body, params, outs, types = [], [], [], []
    for k, s in enumerate(shapes):
        n = 3 * k
        params += [f"p{k}: f32[{s}]", f"g{k}: f32[{s}]", f"m{k}: f32[{s}]"]
        body += [f"  %p{k} = f32[{s}] parameter({n})", f"  %g{k} = f32[{s}] parameter({n + 1})",
                 f"  %m{k} = f32[{s}] parameter({n + 2})",
                 f"  %b{k} = f32[{s}] broadcast(%mu), dimensions={{}}",
                 f"  %lb{k} = f32[{s}] broadcast(%lr), dimensions={{}}",
                 f"  %mm{k} = f32[{s}] multiply(%m{k}, %b{k})", f"  %mn{k} = f32[{s}] add(%mm{k}, %g{k})",
                 f"  %st{k} = f32[{s}] multiply(%mn{k}, %lb{k})", f"  %pn{k} = f32[{s}] subtract(%p{k}, %st{k})"]
        outs += [f"%pn{k}", f"%mn{k}"]
        types += [f"f32[{s}]"] * 2
    consts = ["  %mu = f32[] constant(0.9)", "  %lr = f32[] constant(0.01)"]
    result = "(" + ", ".join(types) + ")"
    root = f"  ROOT %o = {result} tuple({', '.join(outs)})"
    return entry_module("\n".join(consts + body + [root]), ", ".join(params), result)


#: Four updates of f32[64] and three of f32[32,8]: two groups.
UPDATES = _updates(["64", "64", "64", "64", "32,8", "32,8", "32,8"])

#: Parameters copied to outputs (state an optimizer passes through).
PARAMETER_COPIES = entry_module("""  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %c = f32[] parameter(2)
  %ca = f32[] copy(%a)
  %cb = f32[] copy(%b)
  %cc = f32[] copy(%c)
  ROOT %o = (f32[], f32[], f32[]) tuple(%ca, %cb, %cc)""", "a: f32[], b: f32[], c: f32[]", "(f32[], f32[], f32[])")


def _run(text: str, fuse_first: bool = True, **options) -> tuple[Module, Module, PassResult]:
    m = hlo.parse(text)
    before = m.clone()
    if fuse_first:
        run_pipeline(m, "priority-fusion,multi-output-fusion")
    result = HorizontalLoopFusion(**options).run_with_result(m)
    hlo.verify(m)
    return before, m, result


def _fusions(m: Module) -> list:
    return [i for i in m.entry.instructions if i.opcode == "fusion"]


def test_updates_of_one_shape_become_one_kernel_per_shape():
    _, m, r = _run(UPDATES)
    assert r.changed
    fusions = _fusions(m)
    assert len(fusions) == 2
    assert sorted(len(f.shape.elements) for f in fusions) == [6, 8]
    for f in fusions:
        assert str(f.attrs["kind"]) == "kLoop"
        dims = {tuple(s.dims) for s in f.shape.elements}
        assert len(dims) == 1
        consts = [i for i in f.attrs["calls"].instructions if i.opcode == "constant"]
        assert len(consts) == 2  # 0.9 and 0.01 once each: CSE after the merge, as XLA's horizontal fusion pipeline
    taken = [e for e in r.explanations if e.taken]
    assert len(taken) == 2 and all(e.rule == "horizontal" and e.after_us <= e.before_us for e in taken)
    assert sorted(e.launches_saved for e in taken) == [2, 3]


def test_parameter_copies_become_one_kernel():
    _, m, r = _run(PARAMETER_COPIES, fuse_first=False)
    assert r.changed and [i.opcode for i in m.entry.instructions].count("copy") == 0
    (f,) = _fusions(m)
    assert len(f.shape.elements) == 3


def test_a_kernel_read_elsewhere_stays_out():
    text = entry_module("""  %x = f32[64] parameter(0)
  %y = f32[64] parameter(1)
  %z = f32[64] parameter(2)
  %a = f32[64] exponential(%x)
  %b = f32[64] exponential(%y)
  %c = f32[64] exponential(%z)
  %d = f32[64] negate(%c)
  %t = (f32[64], f32[64], f32[64]) tuple(%a, %b, %c)
  ROOT %o = ((f32[64], f32[64], f32[64]), f32[64]) tuple(%t, %d)""", "x: f32[64], y: f32[64], z: f32[64]",
                        "((f32[64], f32[64], f32[64]), f32[64])")
    _, m, r = _run(text, fuse_first=False)
    assert r.changed
    (f,) = [i for i in _fusions(m) if i.shape.is_tuple]
    assert len(f.shape.elements) == 2
    assert any(i.opcode == "exponential" for i in m.entry.instructions)  # %c, also read by %d


def test_reductions_and_other_computations_are_left_alone():
    text = """HloModule t

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%callee (x: f32[64], y: f32[64]) -> (f32[64], f32[64]) {
  %x = f32[64] parameter(0)
  %y = f32[64] parameter(1)
  %a = f32[64] exponential(%x)
  %b = f32[64] exponential(%y)
  ROOT %o = (f32[64], f32[64]) tuple(%a, %b)
}

ENTRY %main (x: f32[64,32], y: f32[64,32], v: f32[64], w: f32[64]) -> (f32[64], f32[64], (f32[64], f32[64])) {
  %x = f32[64,32] parameter(0)
  %y = f32[64,32] parameter(1)
  %v = f32[64] parameter(2)
  %w = f32[64] parameter(3)
  %z = f32[] constant(0)
  %r1 = f32[64] reduce(%x, %z), dimensions={1}, to_apply=%sum
  %r2 = f32[64] reduce(%y, %z), dimensions={1}, to_apply=%sum
  %c = (f32[64], f32[64]) call(%v, %w), to_apply=%callee
  ROOT %o = (f32[64], f32[64], (f32[64], f32[64])) tuple(%r1, %r2, %c)
}
"""
    m = hlo.parse(text)
    r = HorizontalLoopFusion(loop_bodies=False).run_with_result(m)
    assert not r.changed
    r = HorizontalLoopFusion().run_with_result(m)  # the reductions stay; the callee's two kernels become one
    assert r.changed and [i.opcode for i in m.entry.instructions].count("reduce") == 2
    callee = next(c for c in m.computations if c.name == "callee")
    assert [i.opcode for i in callee.instructions].count("fusion") == 1


#: A loop body whose carried state is updated by three kernels of one shape; two read the same carried value.
LOOP = """HloModule t

%body (s: (s32[], f32[64], f32[64], f32[64])) -> (s32[], f32[64], f32[64], f32[64]) {
  %s = (s32[], f32[64], f32[64], f32[64]) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %a = f32[64] get-tuple-element(%s), index=1
  %b = f32[64] get-tuple-element(%s), index=2
  %c = f32[64] get-tuple-element(%s), index=3
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  %a1 = f32[64] exponential(%a)
  %b1 = f32[64] add(%b, %a)
  %c1 = f32[64] tanh(%c)
  ROOT %t = (s32[], f32[64], f32[64], f32[64]) tuple(%i1, %a1, %b1, %c1)
}

%cond (s: (s32[], f32[64], f32[64], f32[64])) -> pred[] {
  %s = (s32[], f32[64], f32[64], f32[64]) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[64], y: f32[64], z: f32[64]) -> (s32[], f32[64], f32[64], f32[64]) {
  %x = f32[64] parameter(0)
  %y = f32[64] parameter(1)
  %z = f32[64] parameter(2)
  %zero = s32[] constant(0)
  %init = (s32[], f32[64], f32[64], f32[64]) tuple(%zero, %x, %y, %z)
  ROOT %w = (s32[], f32[64], f32[64], f32[64]) while(%init), condition=%cond, body=%body
}
"""


def test_in_a_loop_body_no_two_kernels_of_a_group_read_one_carried_value():
    _, m, r = _run(LOOP, fuse_first=False)
    assert r.changed
    body = next(c for c in m.computations if c.name == "body")
    (f,) = [i for i in body.instructions if i.opcode == "fusion"]
    fused = {i.opcode for i in f.attrs["calls"].instructions}
    assert len(f.shape.elements) == 2 and "tanh" in fused  # %c1 with %a1 or %b1, not both (they read %a)


def test_a_model_that_rates_the_fusion_slow_refuses_it(slow_fusions):
    _, m, r = _run(PARAMETER_COPIES, fuse_first=False, device=slow_fusions)
    assert not r.changed and not _fusions(m)
    assert any("slower as built" in e.reason for e in r.explanations)


def test_a_variadic_root_is_no_candidate():
    text = """HloModule t

%pair (a: f32[], b: s32[], c: f32[], d: s32[]) -> (f32[], s32[]) {
  %a = f32[] parameter(0)
  %b = s32[] parameter(1)
  %c = f32[] parameter(2)
  %d = s32[] parameter(3)
  %gt = pred[] compare(%a, %c), direction=GT
  %v = f32[] select(%gt, %a, %c)
  %i = s32[] select(%gt, %b, %d)
  ROOT %t = (f32[], s32[]) tuple(%v, %i)
}

%argmax (x: f32[8,16], y: s32[8,16]) -> (f32[8], s32[8]) {
  %x = f32[8,16] parameter(0)
  %y = s32[8,16] parameter(1)
  %z = f32[] constant(0)
  %zi = s32[] constant(0)
  ROOT %r = (f32[8], s32[8]) reduce(%x, %y, %z, %zi), dimensions={1}, to_apply=%pair
}

ENTRY %main (x: f32[8,16], y: s32[8,16], v: f32[8,16], w: s32[8,16]) -> ((f32[8], s32[8]), (f32[8], s32[8])) {
  %x = f32[8,16] parameter(0)
  %y = s32[8,16] parameter(1)
  %v = f32[8,16] parameter(2)
  %w = s32[8,16] parameter(3)
  %f1 = (f32[8], s32[8]) fusion(%x, %y), kind=kLoop, calls=%argmax
  %f2 = (f32[8], s32[8]) fusion(%v, %w), kind=kLoop, calls=%argmax
  ROOT %o = ((f32[8], s32[8]), (f32[8], s32[8])) tuple(%f1, %f2)
}
"""
    m = hlo.parse(text)
    f1 = next(i for i in m.entry.instructions if i.name == "f1")
    from hlopt.passes.fusion.horizontal_loop_fusion import horizontal_candidate

    assert horizontal_candidate(f1) is not None
    assert not HorizontalLoopFusion().run_with_result(m).changed
