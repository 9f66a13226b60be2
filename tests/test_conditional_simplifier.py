"""conditional-simplifier: the module texts and the checks by structure alone (no jax). Numerics on XLA CPU
(before vs after, same inputs, the predicate both ways) and the corpus: test_conditional_simplifier_numerics.py."""

from __future__ import annotations

import numpy as np
import pytest
from hlopt.passes.framework.pipeline import run_pipeline

from hlopt import hlo

BRANCHES = """
%on_true (a: f32[4]) -> f32[4] {
  %a = f32[4] parameter(0)
  ROOT %s = f32[4] sine(%a)
}

%on_false (b: f32[4]) -> f32[4] {
  %b = f32[4] parameter(0)
  ROOT %c = f32[4] cosine(%b)
}

%pair_true (a: (f32[4], s32[])) -> (f32[4], s32[]) {
  %a = (f32[4], s32[]) parameter(0)
  %x = f32[4] get-tuple-element(%a), index=0
  %i = s32[] get-tuple-element(%a), index=1
  %n = f32[4] negate(%x)
  %j = s32[] add(%i, %i)
  ROOT %t = (f32[4], s32[]) tuple(%n, %j)
}

%pair_false (b: (f32[4], s32[])) -> (f32[4], s32[]) {
  %b = (f32[4], s32[]) parameter(0)
  %x = f32[4] get-tuple-element(%b), index=0
  %i = s32[] get-tuple-element(%b), index=1
  %e = f32[4] exponential(%x)
  %k = s32[] multiply(%i, %i)
  ROOT %t = (f32[4], s32[]) tuple(%e, %k)
}

%with_dot (d: f32[4]) -> f32[4] {
  %d = f32[4] parameter(0)
  %r = f32[1,4] reshape(%d)
  %m = f32[4,4] broadcast(%d), dimensions={1}
  %dot = f32[1,4] dot(%r, %m), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %o = f32[4] reshape(%dot)
}

%with_constant (e: f32[4]) -> f32[4] {
  %e = f32[4] parameter(0)
  %two = f32[] constant(2)
  %b2 = f32[4] broadcast(%two), dimensions={}
  ROOT %m = f32[4] multiply(%e, %b2)
}

%identity (f: f32[4]) -> f32[4] {
  ROOT %f = f32[4] parameter(0)
}

%noisy (g: f32[4]) -> f32[4] {
  %g = f32[4] parameter(0)
  ROOT %cc = f32[4] custom-call(%g), custom_call_target="foo", custom_call_has_side_effect=true
}
"""


def _module(entry: str, params: str, result: str) -> str:
    return f"HloModule cond\n{BRANCHES}\nENTRY %main ({params}) -> {result} {{\n{entry}\n}}\n"


def _opcodes(m: hlo.Module) -> list[str]:
    return [i.opcode for i in m.entry.instructions]


def _both_ways(x: np.ndarray, *rest: np.ndarray) -> list[list[np.ndarray]]:
    return [[np.array(flag), x, *rest] for flag in (True, False)]


X = np.linspace(-2, 2, 4).astype(np.float32)


@pytest.mark.parametrize("branch", ["with_dot", "with_constant", "identity", "noisy"])
def test_expensive_empty_or_side_effecting_branches_stay(branch):
    text = _module(f"""  %p = pred[] parameter(0)
  %x = f32[4] parameter(1)
  ROOT %r = f32[4] conditional(%p, %x, %x), true_computation=%{branch}, false_computation=%on_false""",
                   "p: pred[], x: f32[4]", "f32[4]")
    m = hlo.parse(text)
    assert not run_pipeline(m, "conditional-simplifier").changed
    assert "conditional" in _opcodes(m)




def test_the_select_takes_the_conditionals_annotations():
    """As XLA's ReplaceInstruction: the select that replaces a conditional takes its metadata and frontend
    attributes (it has none of its own)."""
    text = _module("""  %p = pred[] parameter(0)
  %x = f32[4] parameter(1)
  ROOT %r = f32[4] conditional(%p, %x, %x), true_computation=%on_true, false_computation=%on_false, metadata={op_name="jit(f)/cond"}, frontend_attributes={k="v"}""",
                   "p: pred[], x: f32[4]", "f32[4]")
    m = hlo.parse(text)
    assert run_pipeline(m, "conditional-simplifier").changed
    root = m.entry.root
    assert root.opcode == "select" and root.attrs["metadata"].op_name == "jit(f)/cond"
    assert dict(root.attrs["frontend_attributes"]) == {"k": "v"}
