"""dce, cse, tuple-simplifier, algebraic-simplifier, the pattern DSL: structure and numerics on XLA CPU."""

from __future__ import annotations

import pytest
from corpus import corpus_texts

import hlo
import runtime
from passes.match import Pat, PatternMatcher
from passes.pipeline import run_pipeline

SIMPLE = """
HloModule simple

ENTRY %main (p: f32[4], q: f32[4], i: s32[4]) -> (f32[4], f32[4], s32[4], f32[2,2]) {
  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  %i = s32[4] parameter(2)
  %zero = f32[] constant(0)
  %zeros = f32[4] broadcast(%zero), dimensions={}
  %one = f32[] constant(1)
  %ones = f32[4] broadcast(%one), dimensions={}
  %a0 = f32[4] add(%zeros, %p)
  %m1 = f32[4] multiply(%a0, %ones)
  %d1 = f32[4] divide(%m1, %ones)
  %nn = f32[4] negate(f32[4] negate(%d1))
  %cv = f32[4] convert(%nn)
  %rs = f32[4] reshape(%cv)
  %sl = f32[4] slice(%rs), slice={[0:4]}
  %dead = f32[4] exponential(%q)
  %x1 = f32[4] add(%p, %q)
  %x2 = f32[4] add(%p, %q)
  %y = f32[4] multiply(%x1, %x2)
  %t = (f32[4], f32[4]) tuple(%sl, %y)
  %g0 = f32[4] get-tuple-element(%t), index=0
  %g1 = f32[4] get-tuple-element(%t), index=1
  %c2 = s32[] constant(2)
  %c3 = s32[] constant(3)
  %c6 = s32[] multiply(%c2, %c3)
  %b6 = s32[4] broadcast(%c6), dimensions={}
  %iy = s32[4] add(%i, %b6)
  %r1 = f32[2,2] reshape(%p)
  %tr = f32[2,2] transpose(%r1), dimensions={1,0}
  %tr2 = f32[2,2] transpose(%tr), dimensions={1,0}
  %flag = pred[] constant(true)
  %pb = pred[2,2] broadcast(%flag), dimensions={}
  %sel = f32[2,2] select(%pb, %tr2, %r1)
  ROOT %out = (f32[4], f32[4], s32[4], f32[2,2]) tuple(%g0, %g1, %iy, %sel)
}
"""


def _opcodes(m):
    return [i.opcode for i in m.entry.instructions]


def test_dce_removes_dead_and_keeps_side_effects():
    m = hlo.parse(SIMPLE)
    assert run_pipeline(m, "dce").changed
    assert "exponential" not in _opcodes(m)
    side = hlo.parse("""HloModule s
ENTRY %e (p: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %tok = token[] after-all()
  %o = token[] outfeed(%p, %tok), outfeed_shape=f32[]
  %x = f32[] exponential(%p)
  ROOT %n = f32[] negate(%p)
}""")
    run_pipeline(side, "dce")
    assert "outfeed" in _opcodes(side) and "exponential" not in _opcodes(side)


def test_cse_merges_identical():
    m = hlo.parse(SIMPLE)
    assert run_pipeline(m, "cse").changed
    y = m.entry.instruction("y")
    assert y.operand(0) is y.operand(1)


def test_tuple_simplifier():
    m = hlo.parse(SIMPLE)
    assert run_pipeline(m, "tuple-simplifier,dce").changed
    assert "get-tuple-element" not in _opcodes(m)


def test_algebraic_simplifier_identities():
    m = hlo.parse(SIMPLE)
    before = m.clone()
    assert run_pipeline(m, "fix(algebraic-simplifier,tuple-simplifier,dce)").changed
    ops = _opcodes(m)
    for gone in ("divide", "negate", "convert", "slice", "transpose", "select"):
        assert gone not in ops, (gone, ops)
    assert m.entry.root.operand(0).opcode == "parameter"
    six = [i for i in m.entry.instructions if i.opcode == "constant" and i.shape.dtype == "s32"]
    assert any(i.attrs["literal"].scalar() == 6 for i in six)
    assert runtime.run_and_compare(before, m).ok


def test_constant_folding_respects_types():
    m = hlo.parse("""HloModule f
ENTRY %e () -> (s32[], f32[], s8[], pred[]) {
  %a = s32[] constant(7)
  %b = s32[] constant(2)
  %d = s32[] divide(%a, %b)
  %x = f32[] constant(7)
  %y = f32[] constant(2)
  %fd = f32[] divide(%x, %y)
  %big = s8[] constant(100)
  %ov = s8[] add(%big, %big)
  %lt = pred[] compare(%x, %y), direction=LT
  ROOT %t = (s32[], f32[], s8[], pred[]) tuple(%d, %fd, %ov, %lt)
}""")
    before = m.clone()
    run_pipeline(m, "fix(algebraic-simplifier,dce)")
    root = m.entry.root
    assert root.operand(0).opcode == "divide"  # integer division is not folded
    assert root.operand(1).opcode == "constant" and root.operand(1).attrs["literal"].scalar() == 3.5
    assert root.operand(2).attrs["literal"].scalar() == -56  # s8 arithmetic wraps, as in XLA
    assert root.operand(3).opcode == "constant" and root.operand(3).attrs["literal"].scalar() is False
    assert runtime.run_and_compare(before, m).ok


def test_pattern_matcher_commutative_and_captures():
    m = hlo.parse(SIMPLE)
    seen = []
    rules = PatternMatcher([(Pat("add", [Pat.const(0), Pat.any("x")]), lambda root, x: seen.append(x.name))])
    rules2 = PatternMatcher([(Pat("multiply", [Pat.any("x"), Pat.any("x")]), lambda root, x: seen.append(root.name))])
    combined = rules + rules2
    for inst in m.entry.instructions:
        combined.rewrite(inst)
    assert "p" in seen  # add(zeros, p) matched with the constant second in the pattern
    assert "y" not in seen  # x1 and x2 are different instructions
    run_pipeline(m, "cse")
    for inst in m.entry.instructions:
        rules2.rewrite(inst)
    assert "y" in seen


SIMPLIFY = "call-inliner,fix(algebraic-simplifier,tuple-simplifier,cse,dce)"
def _corpus_case(entry):
    before = hlo.parse(entry.text)
    after = before.clone()
    run_pipeline(after, SIMPLIFY)
    hlo.verify(after)
    result = runtime.run_and_compare(before, after, rtol=1e-4, atol=1e-5)
    assert result.ok, str(result)


@pytest.mark.parametrize("entry", corpus_texts(), ids=[e.id for e in corpus_texts()])
def test_simplify_pipeline_on_whole_corpus(entry):
    _corpus_case(entry)
