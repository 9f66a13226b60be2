"""conditional-simplifier: structure on our own modules, numerics on XLA CPU (before vs after, same
inputs, the predicate both ways), and the corpus."""

from __future__ import annotations

import numpy as np
import pytest
from corpus import corpus_texts
from hlopt.passes.pipeline import run_pipeline

from hlopt import hlo, runtime

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


def _simplified(text: str, inputs_list: list[list[np.ndarray]] | None = None) -> hlo.Module:
    """The module after the pass, parsed back by XLA, with outputs equal before and after."""
    before = hlo.parse(text)
    after = before.clone()
    run_pipeline(after, "conditional-simplifier")
    runtime.xla_canonical_text(after.to_text())
    for inputs in inputs_list or [None]:
        result = runtime.run_and_compare(before, after, inputs=inputs, rtol=1e-6, atol=1e-6)
        assert result.ok, str(result)
    return after


def _opcodes(m: hlo.Module) -> list[str]:
    return [i.opcode for i in m.entry.instructions]


def _both_ways(x: np.ndarray, *rest: np.ndarray) -> list[list[np.ndarray]]:
    return [[np.array(flag), x, *rest] for flag in (True, False)]


X = np.linspace(-2, 2, 4).astype(np.float32)


def test_cheap_branches_become_a_select():
    m = _simplified(_module("""  %p = pred[] parameter(0)
  %x = f32[4] parameter(1)
  ROOT %r = f32[4] conditional(%p, %x, %x), true_computation=%on_true, false_computation=%on_false""",
                            "p: pred[], x: f32[4]", "f32[4]"), _both_ways(X))
    ops = _opcodes(m)
    assert "conditional" not in ops and {"sine", "cosine", "select", "broadcast"} <= set(ops)
    assert m.entry.root.opcode == "select"
    assert [c.name for c in m.computations] == ["main"]  # the branches went with their caller


def test_tuple_results_select_element_by_element():
    m = _simplified(_module("""  %p = pred[] parameter(0)
  %x = f32[4] parameter(1)
  %i = s32[] parameter(2)
  %t = (f32[4], s32[]) tuple(%x, %i)
  %r = (f32[4], s32[]) conditional(%p, %t, %t), true_computation=%pair_true, false_computation=%pair_false
  %y = f32[4] get-tuple-element(%r), index=0
  %j = s32[] get-tuple-element(%r), index=1
  ROOT %o = (f32[4], s32[]) tuple(%y, %j)""", "p: pred[], x: f32[4], i: s32[]", "(f32[4], s32[])"),
        _both_ways(X, np.array(3, np.int32)))
    selects = [i for i in m.entry.instructions if i.opcode == "select"]
    assert len(selects) == 2 and "conditional" not in _opcodes(m)
    assert selects[1].operand(0).opcode == "parameter"  # a scalar select takes the predicate itself


@pytest.mark.parametrize(("index", "taken"), [("pred[] constant(true)", "sine"), ("pred[] constant(false)", "cosine"),
                                              ("s32[] constant(1)", "cosine"), ("s32[] constant(7)", "exponential"),
                                              ("s32[] constant(-1)", "exponential")])
def test_constant_index_takes_its_branch(index, taken):
    three = index.startswith("s32")
    branches = ("branch_computations={%on_true, %on_false, %pair_false_array}" if three
                else "true_computation=%on_true, false_computation=%on_false")
    operands = "%x, %x, %x" if three else "%x, %x"
    extra = """
%pair_false_array (h: f32[4]) -> f32[4] {
  %h = f32[4] parameter(0)
  ROOT %e = f32[4] exponential(%h)
}
"""
    text = _module(f"""  %x = f32[4] parameter(0)
  %k = {index}
  ROOT %r = f32[4] conditional(%k, {operands}), {branches}""", "x: f32[4]", "f32[4]").replace(
        "\nENTRY", extra + "\nENTRY")
    m = _simplified(text, [[X]])
    assert m.entry.root.opcode == taken and "conditional" not in _opcodes(m)


def test_single_branch_is_inlined_whatever_the_index():
    m = _simplified(_module("""  %k = s32[] parameter(0)
  %x = f32[4] parameter(1)
  ROOT %r = f32[4] conditional(%k, %x), branch_computations={%on_true}""", "k: s32[], x: f32[4]", "f32[4]"),
        [[np.array(5, np.int32), X]])
    assert m.entry.root.opcode == "sine"


@pytest.mark.parametrize("branch", ["with_dot", "with_constant", "identity", "noisy"])
def test_expensive_empty_or_side_effecting_branches_stay(branch):
    text = _module(f"""  %p = pred[] parameter(0)
  %x = f32[4] parameter(1)
  ROOT %r = f32[4] conditional(%p, %x, %x), true_computation=%{branch}, false_computation=%on_false""",
                   "p: pred[], x: f32[4]", "f32[4]")
    m = hlo.parse(text)
    assert not run_pipeline(m, "conditional-simplifier").changed
    assert "conditional" in _opcodes(m)


@pytest.mark.parametrize("entry", [e for e in corpus_texts() if "conditional(" in e.text], ids=lambda e: e.id)
def test_corpus_conditionals(entry):
    before = hlo.parse(entry.text)
    after = before.clone()
    run_pipeline(after, "call-inliner,conditional-simplifier,simplify")
    if not entry.optimized:  # XLA:CPU's optimized dumps fuse the branches: fusions are expensive
        assert "conditional" not in [i.opcode for i in after.instructions()]
    result = runtime.run_and_compare(before, after, rtol=1e-5, atol=1e-6)
    assert result.ok, str(result)
