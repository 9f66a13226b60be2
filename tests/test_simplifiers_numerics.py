"""simplifiers, numerics: the tests that run modules on XLA (before and after, same inputs);
the structure checks without jax are in test_simplifiers.py."""

from __future__ import annotations

import numpy as np
import pytest
from hlopt.corpus.programs import PROGRAMS, corpus_texts
from hlopt.passes.framework.pipeline import run_pipeline
from test_simplifiers import (  # the module texts and helpers the structure tests use
    _NOT_FOLDED,
    _PASSES,
    COLLECTIVE,
    CSE,
    DCE,
    DIVIDE_REDUCE,
    FOLD_CASES,
    IDENTITIES,
    MIN_MAX_COMPARE,
    SHAPES,
    TUPLES,
    _fold_modules,
    _ops,
    _same_bits,
)

from hlopt import hlo, runtime


def _run(text: str, spec: str, run: bool = True, exact: bool = True) -> tuple[hlo.Module, bool]:
    """The module after `spec` (verified, parsed by XLA) and whether it changed; numerics compared."""
    before = hlo.parse(text)
    after = before.clone()
    changed = run_pipeline(after, spec).changed
    runtime.xla_canonical_text(after.to_text())
    if run:
        result = runtime.run_and_compare(before, after, rtol=0 if exact else 1e-6, atol=0 if exact else 1e-6)
        assert result.ok, str(result)
    return after, changed


def _corpus_case(entry_id: str, spec: str) -> None:
    entry = next(e for e in corpus_texts() if e.id == entry_id)
    before = hlo.parse(entry.text)
    after = before.clone()
    run_pipeline(after, spec)
    result = runtime.run_and_compare(before, after, rtol=1e-5, atol=1e-6)
    assert result.ok, str(result)


_ALL = [p.name + sfx for p in PROGRAMS for sfx in ("", ".opt")]


_SAMPLE = ["transformer_train_step", "reductions_mixed_dtypes", "shmap_psum_in_scan", "elementwise_math.opt"]


def test_dce_removes_dead_code_and_keeps_side_effects():
    m, changed = _run(DCE, "dce", run=False)
    assert changed
    names = {i.name for i in m.entry.instructions}
    assert not names & {"dead1", "dead2", "dead_call", "s", "e"}  # a dead Sharding of a used-once value goes
    assert {"noisy_call", "side", "ordered", "tail", "p", "q", "kept"} <= names  # side effects, control edges, ...
    assert sorted(c.name for c in m.computations) == ["main", "noisy"]


def test_dce_keeps_sharding_of_parameters_and_numerics_hold():
    text = """
HloModule s

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %s = f32[4] custom-call(%p), custom_call_target="Sharding", sharding={replicated}
  %x = f32[4] exponential(%p)
  %y = f32[4] log(%x)
  ROOT %r = f32[4] negate(%p)
}
"""
    m, changed = _run(text, "dce")
    assert changed and _ops(m) == ["parameter", "custom-call", "negate"]


def test_dce_collectives_with_channels_outside_spmd_are_side_effects():
    m, _ = _run(COLLECTIVE, "dce", run=False)
    assert [i.name for i in m.entry.instructions if i.opcode == "all-reduce"] == ["ar"]
    m, _ = _run(COLLECTIVE, "dce{remove_cross_partition_collective_ops=true}", run=False)
    assert "all-reduce" not in _ops(m)


def test_cse_merges_identical_instructions_only():
    m, changed = _run(CSE, "cse")
    assert changed
    ops = m.entry.root.operands
    assert ops[0] is ops[1]  # commutative add, metadata ignored
    assert ops[2] is ops[3]  # same constant, reducers equal in structure
    assert ops[4] is not ops[5]  # subtract is not commutative
    assert ops[6] is ops[7]  # iota
    assert ops[8] is not ops[9]  # different shardings
    assert ops[10] is not ops[11]  # control dependencies: left alone
    assert [i.opcode for i in m.entry.instructions].count("constant") == 1


def test_cse_keeps_side_effects_layouts_and_elided_constants_apart():
    text = """
HloModule k

ENTRY %main (p: f32[2,2]) -> (f32[2,2], f32[2,2], f32[2,2], f32[2,2], f32[3], f32[3]) {
  %p = f32[2,2] parameter(0)
  %c1 = f32[2,2] custom-call(%p), custom_call_target="f", custom_call_has_side_effect=true
  %c2 = f32[2,2] custom-call(%p), custom_call_target="f", custom_call_has_side_effect=true
  %k1 = f32[2,2]{1,0} constant({{1, 2}, {3, 4}})
  %k2 = f32[2,2]{0,1} constant({{1, 2}, {3, 4}})
  %e1 = f32[3] constant({...})
  %e2 = f32[3] constant({...})
  ROOT %t = (f32[2,2], f32[2,2], f32[2,2], f32[2,2], f32[3], f32[3]) tuple(%c1, %c2, %k1, %k2, %e1, %e2)
}
"""
    m, changed = _run(text, "cse", run=False)
    assert not changed
    assert len(set(m.entry.root.operands)) == 6


def test_cse_in_called_computations_and_numerics():
    text = """
HloModule w

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %one = s32[] constant(1)
  %one2 = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %v = f32[4] get-tuple-element(%t), index=1
  %v2 = f32[4] get-tuple-element(%t), index=1
  %m = f32[4] multiply(%v, %v2)
  ROOT %r = (s32[], f32[4]) tuple(%j, %m)
}

%cond (c: (s32[], f32[4])) -> pred[] {
  %c = (s32[], f32[4]) parameter(0)
  %k = s32[] get-tuple-element(%c), index=0
  %three = s32[] constant(3)
  ROOT %lt = pred[] compare(%k, %three), direction=LT
}

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]) tuple(%zero, %p)
  %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
  ROOT %out = f32[4] get-tuple-element(%w), index=1
}
"""
    m, changed = _run(text, "cse")
    body = m.computation("body")
    assert changed and [i.opcode for i in body.instructions].count("get-tuple-element") == 2
    mul = next(i for i in body.instructions if i.opcode == "multiply")
    assert mul.operand(0) is mul.operand(1)


def test_tuple_simplifier_forwards_elements_and_whole_tuples():
    m, changed = _run(TUPLES, "tuple-simplifier,dce", run=False)
    assert changed
    root = m.entry.root
    assert root.operand(0).opcode == "exponential"
    assert root.operand(1).name == "q"  # through two levels of tuple
    assert root.operand(2).name == "r"  # tuple(gte(r, 0), gte(r, 1)) is r
    assert root.operand(3).name == "x0" and root.operand(4).name == "inner"
    n = m.entry.instruction("n")
    assert m.entry.root in n.control_successors  # %h's predecessor now precedes its user


def test_tuple_simplifier_respects_shardings_and_entry_exclusion():
    text = """
HloModule s

ENTRY %main (p: f32[4], q: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0), sharding={replicated}
  %q = f32[4] parameter(1)
  %t = (f32[4], f32[4]) tuple(%p, %q)
  %g = f32[4] get-tuple-element(%t), index=0, sharding={maximal device=0}
  %h = f32[4] get-tuple-element(%t), index=1
  ROOT %a = f32[4] add(%g, %h)
}
"""
    m, changed = _run(text, "tuple-simplifier")
    assert changed and m.entry.root.operand(0).name == "g" and m.entry.root.operand(1).name == "q"
    _, changed = _run(text, "tuple-simplifier{exclude_entry_computation=true}")
    assert not changed


def test_tuple_simplifier_numerics():
    text = """
HloModule n

%callee (t: (f32[4], f32[4])) -> (f32[4], f32[4]) {
  %t = (f32[4], f32[4]) parameter(0)
  %a = f32[4] get-tuple-element(%t), index=0
  %b = f32[4] get-tuple-element(%t), index=1
  %s = f32[4] add(%a, %b)
  %u = (f32[4], f32[4]) tuple(%s, %b)
  %v = f32[4] get-tuple-element(%u), index=0
  ROOT %w = (f32[4], f32[4]) tuple(%v, %a)
}

ENTRY %main (p: f32[4], q: f32[4]) -> (f32[4], f32[4]) {
  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  %t = (f32[4], f32[4]) tuple(%p, %q)
  %c = (f32[4], f32[4]) call(%t), to_apply=%callee
  %x = f32[4] get-tuple-element(%c), index=0
  %y = f32[4] get-tuple-element(%c), index=1
  ROOT %r = (f32[4], f32[4]) tuple(%x, %y)
}
"""
    m, changed = _run(text, "call-inliner,tuple-simplifier,dce")
    assert changed and _ops(m) == ["parameter", "parameter", "add", "tuple"]


def test_algebraic_identities():
    m, changed = _run(IDENTITIES, "algebraic-simplifier,dce")
    assert changed
    names = [o.name for o in m.entry.root.operands]
    assert names[:5] == ["p"] * 5
    assert m.entry.root.operand(5).name == "izeros"  # x * 0 -> the zero (integers)
    assert m.entry.root.operand(6).opcode == "broadcast"  # x - x -> zeros (integers)
    assert names[7:10] == ["i", "b", "b"]
    assert [m.entry.root.operand(k).opcode for k in (10, 11)] == ["multiply", "subtract"]  # not for floats
    assert names[12] == "i" and names[14] == "m"


def test_signed_zero_option():
    text = """
HloModule z

ENTRY %main (p: f32[4]) -> (f32[4], f32[4], f32[4], f32[4]) {
  %p = f32[4] parameter(0)
  %pz = f32[] constant(0)
  %nz = f32[] constant(-0.0)
  %bp = f32[4] broadcast(%pz), dimensions={}
  %bn = f32[4] broadcast(%nz), dimensions={}
  %a = f32[4] add(%p, %bp)
  %b = f32[4] add(%p, %bn)
  %c = f32[4] subtract(%p, %bp)
  %d = f32[4] subtract(%p, %bn)
  ROOT %t = (f32[4], f32[4], f32[4], f32[4]) tuple(%a, %b, %c, %d)
}
"""
    m, _ = _run(text, "algebraic-simplifier")
    assert all(o.name == "p" for o in m.entry.root.operands)  # XLA's behaviour
    m, _ = _run(text, "algebraic-simplifier{keep_signed_zeros=true}")
    assert [o.opcode for o in m.entry.root.operands] == ["add", "parameter", "parameter", "subtract"]
    before = hlo.parse(text)
    inputs = [np.array([-0.0, 0.0, 1.0, -2.0], np.float32)]
    _same_bits(runtime.execute(before, inputs), runtime.execute(m, inputs))


def test_shape_no_ops_and_compositions():
    m, changed = _run(SHAPES, "algebraic-simplifier,dce")
    assert changed
    ops = m.entry.root.operands
    assert ops[0].opcode == "reshape" and ops[0].operand(0).name == "p"  # reshape(reshape(p)) -> one reshape
    assert [ops[k].name for k in (1, 2, 5, 6, 12)] == ["p", "q", "p", "p", "p"]
    assert ops[3].opcode == "broadcast" and ops[3].operand(0).name == "p" and ops[3].attrs["dimensions"] == (0, 1)
    assert ops[4].opcode == "slice" and ops[4].operand(0).name == "p" and ops[4].attrs["slice"] == ((0, 2, 1), (2, 3, 1))
    assert ops[7].opcode == "copy"  # changes the layout: not a no-op
    assert ops[8].name == "p" and ops[9].name == "v"
    assert ops[10].name == "h"  # f16 -> f32 -> f16 is lossless
    assert ops[11].opcode == "convert"  # f32 -> f16 -> f32 is not, and stays


def test_divide_by_constant_and_reduces_that_keep_every_element():
    """XLA's HandleDivide (x / c -> x * (1/c) for floats) and HandleReduce (a reduce keeping every
    element is a reshape; reduce of reduce with the same reducer and init is one reduce)."""
    m, changed = _run(DIVIDE_REDUCE, "algebraic-simplifier,dce", exact=False)
    assert changed
    mean, third, idiv, noop, sum2, noop_max, not_identity, outer, sum_inner = m.entry.root.operands
    assert mean.opcode == "multiply" and mean.operand(1).operand(0).attrs["literal"].text == "0.0625"
    assert third.opcode == "multiply" and third.operand(1).operand(0).shape.dtype == "f16"
    assert idiv.opcode == "divide"  # integer division stays
    assert noop.opcode == "reshape" and noop.operand(0).name == "q"
    assert sum2.opcode == "reduce" and sum2.operand(0).name == "p"  # reshape(reduce) then no-op reduce: gone
    assert noop_max.opcode == "reshape"
    assert not_identity.opcode == "reduce"  # init 1 is not add's identity: 1 + x is not x
    assert outer.opcode == "reduce" and outer.operand(0).name == "p" and outer.attrs["dimensions"] == (1, 2)
    assert sum_inner.name == "q"  # reduces nothing
    assert "divide" not in [i.opcode for i in m.entry.instructions if not i.shape.is_tuple and i.shape.dtype == "f32"]


def test_reduce_of_reduce_keeps_an_init_that_is_not_the_identity():
    """With init 1 for add, the inner reduce adds 1 per output and the outer once more: merging would add
    it once, so both reduces stay (XLA assumes an identity init; we check it)."""
    text = DIVIDE_REDUCE.replace("%inner = f32[2,4] reduce(%p, %zero)", "%inner = f32[2,4] reduce(%p, %one)")
    text = text.replace("%outer = f32[2] reduce(%inner, %zero)", "%outer = f32[2] reduce(%inner, %one)")
    m, _ = _run(text, "algebraic-simplifier,dce", exact=False)
    outer = m.entry.root.operands[7]
    assert outer.opcode == "reduce" and outer.operand(0).opcode == "reduce"


def test_min_max_to_clamp_pred_compares_and_sign_folding():
    """XLA's MinMaxToClamp (constant bounds lo < hi only), p != false / p == true -> p, sign folded
    (sign(-0.0) = -0.0 as XLA computes it)."""
    m, changed = _run(MIN_MAX_COMPARE, "algebraic-simplifier,dce")
    assert changed
    relu6, clip, empty, ne, eq, bs, bfs = m.entry.root.operands
    assert relu6.opcode == clip.opcode == "clamp" and relu6.operand(1).name == clip.operand(1).name == "x"
    assert empty.opcode == "maximum"  # bounds 6 > -1 the wrong way round: always 6, not a clamp
    assert ne.name == eq.name == "lt"
    assert bs.operand(0).opcode == "constant" and bs.operand(0).attrs["literal"].text == "-1"
    assert bfs.operand(0).opcode == "constant" and bfs.operand(0).attrs["literal"].text == "-0.0"


def test_constant_folding_matches_xla_bit_for_bit():
    """Our folded constants equal what XLA:CPU computes at run time (operands fed as parameters, since
    XLA's own compile-time folding of INT_MIN / -1 raises SIGFPE)."""
    const, param, inputs = _fold_modules(FOLD_CASES)
    folded = hlo.parse(const)
    assert run_pipeline(folded, "algebraic-simplifier,dce").changed
    left = [o for o in folded.entry.root.operands if o.opcode != "constant"]
    assert [o.opcode for o in left] == ["convert"] * _NOT_FOLDED
    _same_bits(runtime.execute(hlo.parse(param), inputs), runtime.execute(folded, []))


def test_folding_broadcasts_of_scalars_and_select():
    text = """
HloModule fb

ENTRY %main (p: f32[4]) -> (f32[4], f32[4], f32[4]) {
  %p = f32[4] parameter(0)
  %two = f32[] constant(2)
  %three = f32[] constant(3)
  %b2 = f32[4] broadcast(%two), dimensions={}
  %b3 = f32[4] broadcast(%three), dimensions={}
  %six = f32[4] multiply(%b2, %b3)
  %lt = pred[4] compare(%b2, %b3), direction=LT
  %sel = f32[4] select(%lt, %p, %six)
  %gt = pred[4] compare(%p, %six), direction=GT
  %same = f32[4] select(%gt, %p, %p)
  ROOT %t = (f32[4], f32[4], f32[4]) tuple(%six, %sel, %same)
}
"""
    m, changed = _run(text, "fix(algebraic-simplifier,dce)")
    root = m.entry.root
    assert root.operand(0).opcode == "broadcast" and root.operand(0).operand(0).attrs["literal"].scalar() == 6
    assert root.operand(1).name == "p"  # select on a (folded) constant predicate
    assert root.operand(2).name == "p"  # select(c, x, x) -> x


def test_entry_results_stay_apart_from_aliased_parameters():
    text = """
HloModule a, input_output_alias={ {}: (0, {}, may-alias) }

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %one = f32[] constant(1)
  %ones = f32[4] broadcast(%one), dimensions={}
  ROOT %m = f32[4] multiply(%p, %ones)
}
"""
    _, changed = _run(text, "algebraic-simplifier")
    assert not changed
    _, changed = _run(text.replace(", input_output_alias={ {}: (0, {}, may-alias) }", ""), "algebraic-simplifier")
    assert changed


@pytest.mark.parametrize("spec", _PASSES)
@pytest.mark.parametrize("entry_id", _SAMPLE)
def test_corpus_sample(entry_id, spec):
    _corpus_case(entry_id, spec)


@pytest.mark.slow
@pytest.mark.parametrize("spec", _PASSES)
@pytest.mark.parametrize("entry_id", _ALL)
def test_whole_corpus(entry_id, spec):
    _corpus_case(entry_id, spec)
