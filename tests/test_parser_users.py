"""The parser gives every instruction its users in the order of the text, whether an operand is defined above
its user (taken at once) or further down (resolved at the end of the computation)."""

from hlopt import hlo

_FORWARD = """HloModule m

ENTRY e {
  p = f32[4]{0} parameter(0)
  x = f32[4]{0} negate(p)
  a = f32[4]{0} add(p, c)
  b = f32[4]{0} multiply(p, x)
  c = f32[4]{0} negate(p)
  d = f32[4]{0} add(x, x)
  ROOT t = (f32[4]{0}, f32[4]{0}, f32[4]{0}) tuple(a, b, d)
}
"""

_CONTROL = """HloModule m

ENTRY e {
  p = f32[4]{0} parameter(0)
  x = f32[4]{0} negate(p)
  y = f32[4]{0} exponential(p), control-predecessors={x}
  z = f32[4]{0} add(p, x)
  ROOT t = (f32[4]{0}, f32[4]{0}) tuple(y, z)
}
"""


def _users(module: hlo.Module) -> dict[str, list[str]]:
    return {i.name: [u.name for u in i.users] for i in module.entry.instructions}


def test_users_in_text_order_with_a_forward_reference():
    m = hlo.parse(_FORWARD)
    users = _users(m)
    assert users["p"] == ["x", "a", "b", "c"]
    assert users["x"] == ["b", "d"]
    assert users["c"] == ["a"]
    assert [o.name for o in m.entry.instruction("a").operands] == ["p", "c"]
    assert m.entry.instruction("d").operands == (m.entry.instruction("x"),) * 2
    assert m.entry.instruction("x").user_use_count(m.entry.instruction("d")) == 2
    assert hlo.parse(m.to_text()).to_text() == m.to_text()


def test_users_in_text_order_after_control_predecessors():
    m = hlo.parse(_CONTROL)
    users = _users(m)
    assert users["p"] == ["x", "y", "z"]
    assert users["x"] == ["z"]
    assert [s.name for s in m.entry.instruction("x").control_successors] == ["y"]
