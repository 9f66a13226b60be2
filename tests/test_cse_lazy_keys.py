"""cse builds an instruction's attribute key only when its opcode, shape and operands equal an earlier one's:
instructions alike but for their attributes stay apart, and each merges with the earlier one of equal
attributes (not merely the first of its kind)."""

from __future__ import annotations

from hlopt.passes.cse import CommonSubexpressionElimination

from hlopt import hlo

_TEXT = """
HloModule m

add_a {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

add_b {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT t = f32[] add(x, y)
}

mul {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] multiply(a, b)
}

ENTRY main {
  p = f32[4,4] parameter(0)
  z = f32[] constant(0)
  t1 = f32[4,4] transpose(p), dimensions={1,0}
  t2 = f32[4,4] transpose(p), dimensions={0,1}
  t3 = f32[4,4] transpose(p), dimensions={0,1}
  t4 = f32[4,4] transpose(p), dimensions={1,0}
  r1 = f32[4] reduce(p, z), dimensions={0}, to_apply=add_a
  r2 = f32[4] reduce(p, z), dimensions={0}, to_apply=mul
  r3 = f32[4] reduce(p, z), dimensions={1}, to_apply=add_a
  r4 = f32[4] reduce(p, z), dimensions={0}, to_apply=add_b
  r5 = f32[4] reduce(p, z), dimensions={1}, to_apply=add_b
  ROOT out = (f32[4,4], f32[4,4], f32[4,4], f32[4,4], f32[4], f32[4], f32[4], f32[4], f32[4])
    tuple(t1, t2, t3, t4, r1, r2, r3, r4, r5)
}
"""


def test_merges_with_the_earlier_instruction_of_equal_attributes() -> None:
    module = hlo.parse(_TEXT)
    assert CommonSubexpressionElimination().run(module)
    root = module.entry.root
    assert [o.name for o in root.operands] == ["t1", "t2", "t2", "t1", "r1", "r2", "r3", "r1", "r3"]
    assert {i.name for i in module.entry.instructions} == {"p", "z", "t1", "t2", "r1", "r2", "r3", "out"}
    assert not CommonSubexpressionElimination().run(module)
