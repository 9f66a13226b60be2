"""Shapes: every primitive type (bit widths, kinds, numpy/ml_dtypes equivalents), byte sizes, dynamic
dimensions, layouts (tiles, element size, memory space, other items in XLA's order), tuples; parsing and
printing checked against XLA's own parser on random shapes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hlopt.hlo.shape import (
    DTYPES,
    Layout,
    Shape,
    ShapeParseError,
    TupleShape,
    default_layout,
    dtype_of_numpy,
    parse_shape,
    scalar,
)
from hypothesis import given, settings
from hypothesis import strategies as st

#: XLA's primitive types as HLO text spells them: (bits, kind, numpy equivalent or None).
EXPECTED_DTYPES: dict[str, tuple[int, str, object]] = {
    "pred": (8, "pred", np.bool_),
    "s1": (1, "sint", None), "s2": (2, "sint", ml_dtypes.int2), "s4": (4, "sint", ml_dtypes.int4),
    "s8": (8, "sint", np.int8), "s16": (16, "sint", np.int16), "s32": (32, "sint", np.int32),
    "s64": (64, "sint", np.int64),
    "u1": (1, "uint", None), "u2": (2, "uint", ml_dtypes.uint2), "u4": (4, "uint", ml_dtypes.uint4),
    "u8": (8, "uint", np.uint8), "u16": (16, "uint", np.uint16), "u32": (32, "uint", np.uint32),
    "u64": (64, "uint", np.uint64),
    "f16": (16, "float", np.float16), "bf16": (16, "float", ml_dtypes.bfloat16), "f32": (32, "float", np.float32),
    "f64": (64, "float", np.float64), "c64": (64, "complex", np.complex64), "c128": (128, "complex", np.complex128),
    "f8e4m3fn": (8, "float", ml_dtypes.float8_e4m3fn), "f8e5m2": (8, "float", ml_dtypes.float8_e5m2),
    "f8e4m3": (8, "float", ml_dtypes.float8_e4m3), "f8e3m4": (8, "float", ml_dtypes.float8_e3m4),
    "f8e4m3fnuz": (8, "float", ml_dtypes.float8_e4m3fnuz), "f8e5m2fnuz": (8, "float", ml_dtypes.float8_e5m2fnuz),
    "f8e4m3b11fnuz": (8, "float", ml_dtypes.float8_e4m3b11fnuz),
    "f8e8m0fnu": (8, "float", ml_dtypes.float8_e8m0fnu), "f4e2m1fn": (4, "float", ml_dtypes.float4_e2m1fn),
    "token": (0, "token", None), "opaque": (0, "opaque", None),
}


# ----------------------------------------------------------------------------- primitive types


def test_every_primitive_type_is_known() -> None:
    assert set(EXPECTED_DTYPES) <= set(DTYPES)


@pytest.mark.parametrize("name", sorted(EXPECTED_DTYPES))
def test_dtype_width_kind_and_numpy(name: str) -> None:
    bits, kind, numpy = EXPECTED_DTYPES[name]
    d = DTYPES[name]
    assert (d.name, d.bits, d.kind) == (name, bits, kind)
    if numpy is None:
        assert d.numpy is None
    else:
        assert d.numpy == np.dtype(numpy)
        assert dtype_of_numpy(np.dtype(numpy)) == name
        assert np.dtype(numpy).itemsize * 8 >= d.bits
    assert d.is_float == (kind == "float") and d.is_integral == (kind in ("sint", "uint"))
    assert d.is_complex == (kind == "complex")


@pytest.mark.parametrize("name", sorted(n for n, (_, k, np_) in EXPECTED_DTYPES.items() if k == "float" and np_))
def test_float_types_match_ml_dtypes_bit_layout(name: str) -> None:
    info = ml_dtypes.finfo(DTYPES[name].numpy)
    assert info.bits == DTYPES[name].bits


def test_dtype_of_numpy_rejects_unknown() -> None:
    with pytest.raises(ValueError):
        dtype_of_numpy(np.dtype("U3"))


# ----------------------------------------------------------------------------- array shapes and sizes


@pytest.mark.parametrize("text, byte_size, numel", [
    ("f32[8,<=16]{1,0:T(8,128)(2,1)}", 512, 128), ("(s32[], (f32[2]{0}, pred[]))", 13, 0),
    ("f4e2m1fn[6]", 3, 6), ("f4e2m1fn[5]", 3, 5), ("bf16[3,5]", 30, 15), ("u4[3]{0:E(4)}", 2, 3),
    ("token[]", 0, 1), ("f8e8m0fnu[4]{0:S(1)}", 4, 4), ("pred[10]", 10, 10), ("c128[2]", 32, 2),
    ("s2[7]", 2, 7), ("f32[0,3]", 0, 0), ("f64[]", 8, 1), ("(f32[2], (), c64[])", 16, 0),
])
def test_byte_sizes(text: str, byte_size: int, numel: int) -> None:
    s = parse_shape(text)
    assert s.byte_size == byte_size
    if not s.is_tuple:
        assert s.numel == numel


@pytest.mark.parametrize("name", sorted(n for n, d in DTYPES.items() if d.numpy is not None))
def test_byte_size_matches_numpy_for_whole_byte_types(name: str) -> None:
    s = Shape(name, (3, 5))
    if DTYPES[name].bits >= 8:
        assert s.byte_size == np.zeros((3, 5), DTYPES[name].numpy).nbytes
    else:
        assert s.byte_size == (15 * DTYPES[name].bits + 7) // 8


def test_shape_basics() -> None:
    s = parse_shape("f32[2,3]{0,1}")
    assert (s.dtype, s.dims, s.rank, s.numel, s.is_tuple, s.is_array) == ("f32", (2, 3), 2, 6, False, True)
    assert s.element_type is DTYPES["f32"]
    assert s.layout == Layout((0, 1))
    assert s.with_dtype("bf16").to_text() == "bf16[2,3]{0,1}"
    assert s.with_dims([6]).to_text() == "f32[6]"
    assert s.without_layout().to_text() == "f32[2,3]"
    assert s.with_default_layout().to_text() == "f32[2,3]{1,0}"
    assert s.compatible(parse_shape("f32[2,3]")) and not s.compatible(parse_shape("f32[3,2]"))
    assert not s.compatible(parse_shape("(f32[2,3])"))
    assert str(s) == repr(s)[6:-1] == "f32[2,3]{0,1}"
    assert scalar("s32") == parse_shape("s32[]") and scalar("s32").rank == 0
    assert Shape("token", ()).to_text() == "token[]" and not Shape("token", ()).is_array
    assert default_layout(3) == Layout((2, 1, 0))
    assert parse_shape("f32[2,3]") is parse_shape("f32[2,3]")  # cached


def test_dynamic_dimensions() -> None:
    s = parse_shape("f32[<=4,3,?]")
    assert s.dims == (4, 3, -1) and s.dynamic == (True, False, True)
    assert [s.is_dynamic_dim(i) for i in range(3)] == [True, False, True]
    assert s.to_text() == "f32[<=4,3,?]"
    static = parse_shape("f32[4,3]")
    assert static.dynamic == () and not static.is_dynamic_dim(0)
    assert not parse_shape("f32[<=4,3]").compatible(parse_shape("f32[4,3]"))
    assert parse_shape("f32[<= 4, 3]") == parse_shape("f32[<=4,3]")


# ----------------------------------------------------------------------------- layouts


def test_layout_items() -> None:
    s = parse_shape("f32[8,128]{1,0:T(8,128)(2,1)E(32)S(1)}")
    lay = s.layout
    assert lay.minor_to_major == (1, 0) and lay.tiles == ((8, 128), (2, 1))
    assert (lay.element_size_bits, lay.memory_space, lay.extra) == (32, 1, "")
    assert parse_shape("f32[8,128]{1,0:T(2,*,128)}").layout.tiles == ((2, -1, 128),)
    assert Layout((1, 0), ((2, -1, 128),)).to_text() == "{1,0:T(2,*,128)}"
    assert parse_shape("f32[]").layout is None
    with pytest.raises(ShapeParseError, match="expected no layout after the scalar shape"):
        parse_shape("f32[]{}")  # XLA writes a scalar without a layout and rejects `{}`
    assert Shape("f32", (), (), Layout(())).to_text() == "f32[]"


@pytest.mark.parametrize("text", [
    "s4[8]{0:T(4)L(4)#(u8)*(s8)E(4)S(1)}", "s4[8]{0:D(C+)T(2)}", "f32[8]{0:E(4)S(1)SC(0:1,2)}",
    "f32[8]{0:T(2)L(4)E(4)S(1)M(8)}", "f32[8]{0:S(1)M(8)}", "f32[8]{0:#(u8)}",
])
def test_layout_items_print_in_xla_order(text: str) -> None:
    s = parse_shape(text)
    assert s.to_text() == text
    scrambled = Layout(s.layout.minor_to_major, s.layout.tiles, s.layout.element_size_bits,
                       s.layout.memory_space, "".join(reversed(_items(s.layout.extra))))
    assert scrambled.to_text() == s.layout.to_text()


def _items(extra: str) -> list[str]:
    import re

    return re.findall(r"[A-Z#*]+\((?:[^()]|\([^()]*\))*\)", extra)


def test_layout_with_nested_braces_is_not_cut_short() -> None:
    s = parse_shape("s4[8]{0:P(s4[8]{0})}")
    assert s.layout.extra == "P(s4[8]{0})"
    assert s.to_text() == "s4[8]{0:P(s4[8]{0})}"


# ----------------------------------------------------------------------------- tuples


def test_tuples() -> None:
    t = parse_shape("((f32[2]{0}, (s32[], pred[3])), u8[3], ())")
    assert t.is_tuple and len(t) == 3 and not t.is_array
    assert t[0][1][1] == parse_shape("pred[3]")
    assert [str(x) for x in t.leaves()] == ["f32[2]{0}", "s32[]", "pred[3]", "u8[3]"]
    assert t.byte_size == 8 + 4 + 3 + 3
    assert t.without_layout().to_text() == "((f32[2], (s32[], pred[3])), u8[3], ())"
    assert t.with_default_layout()[0][0].layout == Layout((0,))
    assert t.compatible(parse_shape("((f32[2], (s32[], pred[3])), u8[3], ())"))
    assert not t.compatible(parse_shape("((f32[2], (s32[], pred[3])), u8[3])"))
    assert TupleShape(()).to_text() == "()" and parse_shape("( )") == TupleShape(())
    assert parse_shape("(f32[], /*index=1*/s32[])") == TupleShape((scalar("f32"), scalar("s32")))


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("text, message", [
    ("f33[2]", "unknown primitive type"), ("f32[2", "expected a shape"), ("f32[a]", "expected a dimension size"),
    ("f32[2,]", "expected a dimension size"), ("f32[2]{x}", "minor-to-major"), ("f32[2]{0:T(x)}", "tile sizes"),
    ("f32[2]{0:e(1)}", "layout item"), ("f32[2]{0", "to close the layout"), ("(f32[], s32[]", "',' or ')'"),
    ("f32[2] junk", "unexpected text after shape"), ("", "expected a shape"), ("f32[³]", "dimension size"),
    ("(" * 100 + "f32[]" + ")" * 100, "nested more than"),
])
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ShapeParseError) as info:
        parse_shape(text)
    assert message in str(info.value)
    assert 0 <= info.value.offset <= len(text)


# ----------------------------------------------------------------------------- random shapes vs XLA

_ARRAY_TYPES = sorted(n for n in DTYPES if n not in ("token", "opaque"))


@st.composite
def _layouts(draw: st.DrawFn, rank: int) -> Layout | None:
    if rank == 0 or not draw(st.booleans()):
        return None
    m2m = tuple(draw(st.permutations(range(rank))))
    tiles = tuple(draw(st.lists(st.lists(st.sampled_from([1, 2, 8, 128]), min_size=1, max_size=rank).map(tuple),
                                max_size=2)))
    return Layout(m2m, tiles, draw(st.sampled_from([0, 0, 8, 32])), draw(st.sampled_from([0, 0, 1, 2])))


@st.composite
def _arrays(draw: st.DrawFn) -> Shape:
    rank = draw(st.integers(0, 4))
    dims = tuple(draw(st.lists(st.integers(0, 64), min_size=rank, max_size=rank)))
    dynamic = tuple(draw(st.lists(st.booleans(), min_size=rank, max_size=rank))) if draw(st.booleans()) else ()
    if not any(dynamic):
        dynamic = ()
    return Shape(draw(st.sampled_from(_ARRAY_TYPES)), dims, dynamic, draw(_layouts(rank)))


_SHAPES = st.recursive(_arrays(), lambda inner: st.lists(inner, max_size=3).map(lambda xs: TupleShape(tuple(xs))),
                       max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(_SHAPES)
def test_random_shapes_print_parse_and_agree_with_xla(shape: Shape | TupleShape) -> None:
    text = shape.to_text()
    assert parse_shape(text) == shape
    assert parse_shape(shape.without_layout().to_text()) == shape.without_layout()
    from hlopt.runtime._xla import xla_canonical_text

    xla = xla_canonical_text(f"HloModule m\nENTRY e {{\n  ROOT p = {text} parameter(0)\n}}\n")
    line = next(x for x in xla.splitlines() if "parameter(0)" in x)
    theirs = parse_shape(line.split(" = ", 1)[1].rsplit(" parameter(0)", 1)[0])
    assert theirs.without_layout() == shape.without_layout()
    for ours, xlas in zip(_leaves(shape), _leaves(theirs), strict=True):
        if ours.layout is not None:
            assert xlas.layout == ours.layout
        elif ours.rank:
            assert xlas.layout.minor_to_major == default_layout(ours.rank).minor_to_major


def _leaves(shape: Shape | TupleShape) -> list[Shape]:
    return shape.leaves()


def test_shape_hash_is_cached_per_process_and_not_pickled() -> None:
    """Shapes remember their hash; a pickled copy computes its own (str hashes differ between processes)."""
    import pickle

    from hlopt.hlo.shape import Shape, TupleShape, parse_shape

    s = parse_shape("f32[2,3]{1,0}")
    t = parse_shape("(f32[2,3]{1,0}, s32[])")
    assert hash(s) == hash(Shape("f32", (2, 3), (), s.layout)) and s == Shape("f32", (2, 3), (), s.layout)
    assert hash(t) == hash(TupleShape(t.elements)) and t == TupleShape(t.elements) and t != s and s != t
    for x in (s, t):
        copy = pickle.loads(pickle.dumps(x))
        assert copy == x and hash(copy) == hash(x) and len(x.__reduce__()[1]) in (1, 4)
