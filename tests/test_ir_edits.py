"""Use-def edits: random sequences of IR edits keep operands and users consistent; shapes and dtypes."""

from __future__ import annotations

from collections import Counter

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hlo
from hlo.literal import Literal
from hlo.shape import DTYPES, Shape, parse_shape
from hlo.verifier import verify_report

BASE = """HloModule e
ENTRY %main (p: f32[4], q: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  %a = f32[4] add(%p, %q)
  %b = f32[4] multiply(%a, %p)
  %c = f32[4] subtract(%b, %q)
  ROOT %d = f32[4] add(%c, %a)
}"""


def _check_consistent(comp):
    expected = {i: Counter() for i in comp.instructions}
    for user in comp.instructions:
        for op in user.operands:
            expected[op][user] += 1
    for inst in comp.instructions:
        assert dict(inst._users) == dict(expected[inst]), inst.name
        for p in inst.control_predecessors:
            assert inst in p.control_successors


edits = st.lists(st.tuples(st.sampled_from(["set_operand", "rauw", "add", "remove_dead", "control"]),
                           st.integers(0, 1000), st.integers(0, 1000)), max_size=25)


@settings(max_examples=150, deadline=None)
@given(edits)
def test_random_edit_sequences_keep_use_def_consistent(ops):
    m = hlo.parse(BASE)
    comp = m.entry
    for kind, x, y in ops:
        insts = list(comp.instructions)
        a, b = insts[x % len(insts)], insts[y % len(insts)]
        pos = {i: k for k, i in enumerate(insts)}
        if kind == "set_operand" and a.operand_count and pos[b] < pos[a]:
            a.set_operand(y % a.operand_count, b)
        elif kind == "rauw" and a is not b and pos[b] < pos[a] and a.opcode != "parameter":
            a.replace_all_uses_with(b)
        elif kind == "add":
            comp.add(hlo.Instruction("negate", b.shape, [b]), after=b)
        elif kind == "remove_dead" and not a.user_count and a is not comp.root and a.opcode != "parameter":
            comp.remove_dead(a)
        elif kind == "control" and pos[a] < pos[b]:
            a.add_control_successor(b)
        _check_consistent(comp)
    assert not [p for p in verify_report(m) if "users" in p.message or "order" in p.message]
    hlo.parse(m.to_text())  # still prints and parses


@pytest.mark.parametrize("name", sorted(n for n, d in DTYPES.items() if d.numpy is not None))
def test_dtypes_have_numpy_equivalents_and_widths(name):
    d = DTYPES[name]
    assert d.bits in (1, 2, 4, 8, 16, 32, 64, 128) or name == "pred"
    if d.kind == "float" and name.startswith("f"):
        assert np.dtype(d.numpy).itemsize * 8 >= d.bits


@pytest.mark.parametrize("text, byte_size", [
    ("f32[8,<=16]{1,0:T(8,128)(2,1)}", 512), ("(s32[], (f32[2]{0}, pred[]))", 13), ("f4e2m1fn[6]", 3),
    ("bf16[3,5]", 30), ("u4[3]{0:E(4)}", 2), ("token[]", 0), ("f8e8m0fnu[4]{0:S(1)}", 4),
])
def test_shapes_parse_print_and_size(text, byte_size):
    s = parse_shape(text)
    assert s.byte_size == byte_size
    assert parse_shape(s.to_text()) == s


@pytest.mark.parametrize("dtype, values", [
    ("f32", [1.5, -0.0, float("inf")]), ("bf16", [1.0, -2.5, 3.0]), ("f8e4m3fn", [0.5, -448.0, 1.0]),
    ("f8e5m2", [2.0, -0.25, 57344.0]), ("f4e2m1fn", [6.0, -0.5, 1.5]), ("f8e8m0fnu", [0.25, 1.0, 128.0]),
    ("s8", [-128, 0, 127]), ("u4", [0, 7, 15]), ("pred", [True, False, True]), ("c64", [1 + 2j, -1j, 3]),
])
def test_literals_round_trip(dtype, values):
    shape = Shape(dtype, (3,))
    arr = np.array(values).astype(DTYPES[dtype].numpy)
    lit = Literal.from_numpy(arr, shape)
    back = Literal(lit.text, shape).to_numpy()
    np.testing.assert_array_equal(back.astype(np.complex128 if dtype == "c64" else np.float64),
                                  arr.astype(np.complex128 if dtype == "c64" else np.float64))
    assert ml_dtypes is not None
