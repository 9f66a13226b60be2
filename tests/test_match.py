"""The pattern DSL (passes.framework.match), structure (no jax): captures, commutative matching, constants, rule
order, composition, and XLA-style replacement. A user rule proven on XLA CPU: test_match_numerics.py."""

from __future__ import annotations

from hlopt.passes.framework.match import Pat, PatternMatcher, replace_instruction, scalar_constant_value

from hlopt import hlo

TEXT = """
HloModule m

ENTRY %e (p: f32[4], q: f32[4]) -> (f32[4], f32[4], f32[4], f32[4], f32[4], f32[4]) {
  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  %zero = f32[] constant(0)
  %nzero = f32[] constant(-0)
  %zeros = f32[4] broadcast(%zero), dimensions={}
  %nzeros = f32[4] broadcast(%nzero), dimensions={}
  %twos = f32[4] constant({2, 2, 2, 2})
  %mixed = f32[4] constant({1, 2, 3, 4})
  %a = f32[4] add(%zeros, %p), metadata={op_name="a"}
  %b = f32[4] add(%p, %nzeros)
  %c = f32[4] multiply(%p, %p)
  %d = f32[4] multiply(%p, %q)
  %s = f32[4] subtract(%zeros, %p)
  %m = f32[4] multiply(%twos, %mixed)
  ROOT %t = (f32[4], f32[4], f32[4], f32[4], f32[4], f32[4]) tuple(%a, %b, %c, %d, %s, %m)
}
"""


def _m():
    return hlo.parse(TEXT)


def test_captures_and_commutative_order():
    e = _m().entry
    pat = Pat("add", [Pat.any("x"), Pat.const(0, name="zero")])
    caps = pat.match(e.instruction("a"))  # 0 + p matches x + 0 since add is commutative
    assert caps["x"].name == "p" and caps["zero"].name == "zeros"
    assert pat.match(e.instruction("b"))["x"].name == "p"
    sub = Pat("subtract", [Pat.any("x"), Pat.const(0)])
    assert sub.match(e.instruction("s")) is None  # subtract is not commutative: 0 - p is not p - 0
    forced = Pat("subtract", [Pat.any("x"), Pat.const(0)], commutative=True)
    assert forced.match(e.instruction("s"))["x"].name == "p"


def test_same_name_means_same_instruction():
    e = _m().entry
    square = Pat("multiply", [Pat.any("x"), Pat.any("x")])
    assert square.match(e.instruction("c"))["x"].name == "p"
    assert square.match(e.instruction("d")) is None


def test_opcode_sets_and_predicates():
    e = _m().entry
    pat = Pat({"add", "multiply"}, name="op", predicate=lambda i: i.shape.dims == (4,))
    assert {i.name for i in e.instructions if pat.match(i)} == {"a", "b", "c", "d", "m"}
    assert Pat("add", predicate=lambda i: i.name == "b").match(e.instruction("a")) is None


def test_constants_scalar_broadcast_uniform_and_signed_zero():
    e = _m().entry
    assert scalar_constant_value(e.instruction("zeros")) == 0.0
    assert scalar_constant_value(e.instruction("twos")) == 2.0
    assert scalar_constant_value(e.instruction("mixed")) is None
    assert Pat.const(2).match(e.instruction("twos")) is not None
    assert Pat.const().match(e.instruction("mixed")) is None
    assert Pat.const(0).match(e.instruction("nzeros")) is not None  # an int 0 matches either zero
    assert Pat.const(0.0).match(e.instruction("nzeros")) is None  # a float zero checks the sign
    assert Pat.const(-0.0).match(e.instruction("nzeros")) is not None
    nan = hlo.parse("HloModule n\nENTRY %e () -> f32[] {\n  ROOT %c = f32[] constant(nan)\n}").entry.root
    assert Pat.const(float("nan")).match(nan) is not None and Pat.const(0).match(nan) is None


def test_matcher_keeps_rule_order_and_composes():
    e = _m().entry
    seen: list[str] = []

    def note(tag):
        return lambda root: seen.append(f"{tag}:{root.name}")  # returns None: the next rule is tried

    first = PatternMatcher([(Pat.any(predicate=lambda i: i.name == "d"), note("any")), (Pat("multiply"), note("mul"))])
    second = PatternMatcher([(Pat("multiply", [Pat.any(), Pat.any()]), note("mul2"))])
    combined = first + second
    assert len(combined) == 3
    assert combined.rewrite(e.instruction("d")) is None
    assert seen == ["any:d", "mul:d", "mul2:d"]
    hit = PatternMatcher([(Pat("add", [Pat.any("x"), Pat.const(0)]), lambda x: x)])  # no `root` parameter
    assert hit.rewrite(e.instruction("a")).name == "p"
    assert hit.rewrite(e.instruction("c")) is None


def test_replace_instruction_follows_xla():
    m = _m()
    e = m.entry
    a, p = e.instruction("a"), e.instruction("p")
    assert replace_instruction(a, p)
    assert p.metadata.op_name == "a"  # the replacement takes the op_name it lacked
    assert "a" not in {i.name for i in e.instructions}
    d = e.instruction("d")
    e.instruction("c").add_control_successor(d)
    assert not replace_instruction(d, p)  # control dependencies: refused, as XLA
    hlo.verify(m)


