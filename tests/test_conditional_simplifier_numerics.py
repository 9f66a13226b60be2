"""conditional-simplifier, numerics: the tests that run modules on XLA (before and after, same inputs);
the structure checks without jax are in test_conditional_simplifier.py."""

from __future__ import annotations

import numpy as np
import pytest
from hlopt.corpus.programs import corpus_texts
from hlopt.passes.framework.pipeline import run_pipeline
from test_conditional_simplifier import (  # the module texts and helpers the structure tests use
    X,
    _both_ways,
    _module,
    _opcodes,
)

from hlopt import hlo, runtime


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


@pytest.mark.parametrize("entry", [e for e in corpus_texts() if "conditional(" in e.text], ids=lambda e: e.id)
def test_corpus_conditionals(entry):
    before = hlo.parse(entry.text)
    after = before.clone()
    run_pipeline(after, "call-inliner,conditional-simplifier,simplify")
    if not entry.optimized:  # XLA:CPU's optimized dumps fuse the branches: fusions are expensive
        assert "conditional" not in [i.opcode for i in after.instructions()]
    result = runtime.run_and_compare(before, after, rtol=1e-5, atol=1e-6)
    assert result.ok, str(result)
