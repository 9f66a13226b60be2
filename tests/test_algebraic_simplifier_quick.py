"""algebraic-simplifier's quick reject (`_no_rule_applies`): whenever it says no rule applies, the matcher
agrees (it returns None and builds nothing), and the pass with and without it leaves the same module."""

from __future__ import annotations

from pathlib import Path

from hlopt.hlo.ir import Instruction
from hlopt.passes.algebraic_simplifier import AlgebraicSimplifier, _no_rule_applies, simplification_rules
from hlopt.passes.dce import SideEffects

from hlopt import hlo

_TEXT = """
HloModule m

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  b = pred[4] parameter(2)
  i = s32[4] parameter(3)
  z = f32[] constant(0)
  one = f32[] constant(1)
  two = f32[] constant(2)
  zs = f32[4] broadcast(z), dimensions={}
  ones = f32[4] broadcast(one), dimensions={}
  twos = f32[4] broadcast(two), dimensions={}
  a0 = f32[4] add(p, zs)
  a1 = f32[4] add(p, q)
  sub0 = f32[4] subtract(p, p)
  sub1 = f32[4] subtract(q, p)
  m0 = f32[4] multiply(ones, q)
  m1 = f32[4] multiply(p, q)
  d0 = f32[4] divide(p, twos)
  d1 = f32[4] divide(q, p)
  x0 = f32[4] maximum(p, p)
  x1 = f32[4] maximum(p, q)
  x2 = f32[4] minimum(x1, twos)
  x3 = f32[4] maximum(zs, x2)
  n0 = f32[4] negate(p)
  n1 = f32[4] negate(n0)
  n2 = f32[4] negate(a1)
  ab = f32[4] abs(m1)
  t = pred[4] not(b)
  t1 = pred[4] not(t)
  c0 = pred[4] compare(p, q), direction=LT
  c1 = pred[4] compare(b, b), direction=EQ
  r0 = s32[4] remainder(i, i)
  r1 = s32[4] xor(i, i)
  e = f32[4] exponential(p)
  nz = f32[] constant(-0)
  qnan = f32[] constant(nan)
  vec = f32[4] constant({1, 2, 3, 4})
  ou = f32[4] constant({1, 1, 1, 1})
  nzs = f32[4] broadcast(nz), dimensions={}
  nans = f32[4] broadcast(qnan), dimensions={}
  k0 = f32[4] multiply(p, twos)
  k1 = f32[4] multiply(twos, ones)
  k2 = f32[4] add(nzs, q)
  k3 = f32[4] subtract(p, nans)
  k4 = f32[4] multiply(p, vec)
  k5 = f32[4] multiply(ou, p)
  k6 = f32[4] subtract(twos, p)
  sc = f32[] constant(3)
  sa = f32[] add(sc, one)
  rd = f32[] reduce(p, z), dimensions={0}, to_apply=add_f32
  rs = f32[4,1] reshape(p)
  rr = f32[4] reshape(rs)
  rt = f32[1,4] transpose(rs), dimensions={1,0}
  rt2 = f32[4,1] transpose(rt), dimensions={1,0}
  bb = f32[4,4] broadcast(p), dimensions={0}
  bb2 = f32[2,4,4] broadcast(bb), dimensions={1,2}
  bi = f32[4] broadcast(p), dimensions={0}
  cp = f32[4] copy(p)
  rk = f32[4] reduce(bb, z), dimensions={1}, to_apply=add_f32
  r1d = f32[4] reduce(rs, z), dimensions={1}, to_apply=add_f32
  rrd = f32[] reduce(rk, z), dimensions={0}, to_apply=add_f32
  ROOT out = (f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4],
              f32[4], f32[4], pred[4], pred[4], pred[4], s32[4], s32[4], f32[4], f32[], f32[], f32[4], f32[4],
              f32[4], f32[4], f32[4,1], f32[2,4,4], f32[4], f32[4], f32[4], f32[4], f32[], f32[1,4], f32[4,1],
              f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4])
              tuple(a0, a1, sub0, sub1, m0, m1, d0, d1, x0, x3, n1, n2, ab, t1, c0, c1, r0, r1, e, sa, rd,
              x1, n0, sub1, rr, rt2, bb2, bi, cp, rk, r1d, rrd, rt, rs, k0, k1, k2, k3, k4, k5, k6)
}
"""


def test_quick_reject_only_where_the_matcher_finds_nothing() -> None:
    module = hlo.parse(_TEXT)
    rules = simplification_rules()
    rejected = 0
    for inst in list(module.entry.instructions):
        if _no_rule_applies(inst):
            rejected += 1
            mark = Instruction.id_watermark()
            count = len(module.entry.instructions)
            assert rules.rewrite(inst) is None, inst.name
            assert len(module.entry.instructions) == count and Instruction.id_watermark() == mark + 1
    assert rejected >= 6  # a1, sub1, m1, d1, x1, n2, ab, c0: the check does reject something


def test_same_module_with_and_without_the_quick_reject() -> None:
    texts = []
    for quick in (False, True):
        module = hlo.parse(_TEXT)
        pass_ = AlgebraicSimplifier()
        effects = SideEffects(module)
        for comp in module.computations:
            pass_.run_on_computation(comp, pass_.rules(), effects, None, quick)
        texts.append(module.to_text())
    assert texts[0] == texts[1]
    assert "negate(p)" in texts[1] or "negate(%p)" in texts[1]


#: The base rules' root opcodes, in order (`simplification_rules(fold_constants=True)`). `_no_rule_applies` is
#: derived from what each of these rules needs: a rule added, removed or moved to other opcodes must be checked
#: against it (and this list updated).
_KNOWN_RULE_OPCODES = [
    ["add", "subtract"], ["divide", "multiply"], ["and", "multiply"], ["or", "xor"], ["and", "or"],
    ["and", "maximum", "minimum", "or"], ["subtract", "xor"], ["select"], ["negate", "not"],
    ["bitcast", "copy", "reshape"], ["bitcast-convert", "convert"], ["convert"], ["reshape"], ["transpose"],
    ["transpose"], ["broadcast"], ["broadcast"], ["slice"], ["slice"], ["pad"], ["concatenate"], ["reverse"],
    ["dynamic-slice"], ["dynamic-update-slice"], ["reduce-precision"], ["divide"], ["compare"],
    ["maximum", "minimum"], ["reduce"], ["reduce"],
    ["abs", "add", "and", "compare", "convert", "divide", "maximum", "minimum", "multiply", "negate", "not", "or",
     "remainder", "sign", "subtract", "xor"],
]


def test_the_rules_the_quick_reject_was_derived_from() -> None:
    rules = simplification_rules(False, True).rules
    assert [sorted(pat.opcodes) for pat, _ in rules] == _KNOWN_RULE_OPCODES, (
        "the base rules changed: check that `_no_rule_applies` still only rejects what no rule matches")


def _hlo_files() -> list[Path]:
    return sorted(Path(__file__).parent.rglob("*.hlo"))


def test_quick_reject_agrees_with_the_matcher_on_every_test_module() -> None:
    """Every instruction of every HLO file among the tests (XLA's pass-test inputs among them): where the quick
    check rejects, the matcher, with and without constant folding, finds nothing and builds nothing."""
    files = _hlo_files()
    assert len(files) > 50
    rejected = 0
    for path in files:
        try:
            module = hlo.parse(path.read_text())
        except hlo.HloParseError:
            continue  # an input that tests an error
        for fold in (False, True):
            rules = simplification_rules(False, fold)
            for comp in module.computations:
                for inst in list(comp.instructions):
                    if not _no_rule_applies(inst):
                        continue
                    rejected += 1
                    count = len(comp.instructions)
                    assert rules.rewrite(inst) is None, f"{path.name}: %{inst.name}"
                    assert len(comp.instructions) == count, f"{path.name}: %{inst.name}"
    assert rejected > 100
