"""The verifier accepts what XLA accepts and names what is broken."""

from __future__ import annotations

import pytest

import hlo
from hlo.verifier import HloVerifyError, verify

GOOD = """HloModule v

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4] get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %y = f32[4] negate(%x)
  ROOT %t = (s32[], f32[4]) tuple(%j, %y)
}

ENTRY %main (a: f32[2,4], b: f32[4,3]) -> (f32[2,3], f32[2], (s32[], f32[4])) {
  %a = f32[2,4] parameter(0)
  %b = f32[4,3] parameter(1)
  %d = f32[2,3] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %z = f32[] constant(0)
  %r = f32[2] reduce(%a, %z), dimensions={1}, to_apply=%sum
  %zero = s32[] constant(0)
  %v = f32[4] reshape(f32[1,4] slice(%a), slice={[0:1], [0:4]})
  %init = (s32[], f32[4]) tuple(%zero, %v)
  %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
  ROOT %out = (f32[2,3], f32[2], (s32[], f32[4])) tuple(%d, %r, %w)
}
"""


def test_good_module_verifies():
    pytest.importorskip("jaxlib")
    verify(hlo.parse(GOOD.replace("reshape(f32[1,4] slice(%a), slice={[0:1], [0:4]})", "reshape(%sl1)").replace(
        "%v = f32[4]", "%sl1 = f32[1,4] slice(%a), slice={[0:1], [0:4]}\n  %v = f32[4]")))


def _good():
    text = GOOD.replace("reshape(f32[1,4] slice(%a), slice={[0:1], [0:4]})", "reshape(%sl1)").replace(
        "%v = f32[4]", "%sl1 = f32[1,4] slice(%a), slice={[0:1], [0:4]}\n  %v = f32[4]")
    return text


@pytest.mark.parametrize("old, new, message", [
    ("%d = f32[2,3] dot", "%d = f32[2,4] dot", "does not match the inferred"),
    ("%r = f32[2] reduce", "%r = f32[4] reduce", "does not match the inferred"),
    ("ROOT %lt = pred[] compare", "ROOT %lt = s32[] compare", "does not match the inferred"),
    ("ROOT %t = (s32[], f32[4]) tuple(%j, %y)", "ROOT %t = (s32[], f32[4], s32[]) tuple(%j, %y, %j)", "body"),
    ("%sl1 = f32[1,4] slice(%a), slice={[0:1], [0:4]}", "%sl1 = f32[1,4] slice(%a), slice={[0:1], [0:5]}",
     "out of bounds"),
])
def test_broken_modules_are_reported(old, new, message):
    text = _good()
    assert old in text
    with pytest.raises(HloVerifyError, match=message):
        verify(hlo.parse(text.replace(old, new)))


def test_broken_use_def_and_order_are_reported():
    m = hlo.parse(_good())
    d = m.entry.instruction("d")
    d._operands[0] = m.entry.instruction("b")  # bypass set_operand: users are now wrong
    with pytest.raises(HloVerifyError, match="users"):
        verify(m)
    m = hlo.parse(_good())
    order = list(m.entry.instructions)
    order.remove(m.entry.instruction("d"))
    order.insert(0, m.entry.instruction("d"))
    m.entry.instructions = order
    with pytest.raises(HloVerifyError, match="defined after its use") as info:
        verify(m)
    assert "%d" in str(info.value) and ">>" in str(info.value)


def test_parameter_numbering_is_checked():
    m = hlo.parse(_good())
    m.entry.parameter(1).attrs["parameter_number"] = 5
    m.entry._reindex_parameters()
    with pytest.raises(HloVerifyError, match="parameter numbers"):
        verify(m)
