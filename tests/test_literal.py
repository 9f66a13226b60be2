"""Literals: to_numpy/from_numpy round trips for every dtype with a numpy equivalent (special values included),
checked against XLA: the constants we print run on XLA:CPU and come back bit for bit, and the literal text XLA
prints means to us what it means to XLA."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hlopt.hlo.literal import Literal, LiteralError
from hlopt.hlo.shape import DTYPES, Shape, TupleShape
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_roundtrip import xla_canonical_full

from hlopt import hlo

NUMPY_DTYPES = sorted(n for n, d in DTYPES.items() if d.numpy is not None)


def _range(name: str) -> tuple[int, int]:
    d = DTYPES[name]
    if d.kind == "sint":
        return -(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1
    return 0, (1 << d.bits) - 1


def special_values(name: str) -> np.ndarray:
    """Extremes and special values of a type, as a 1-D array of that type."""
    d = DTYPES[name]
    if d.kind == "pred":
        return np.array([True, False, True])
    if d.kind in ("sint", "uint"):
        lo, hi = _range(name)
        values = sorted({lo, hi, 0, 1, hi // 2, lo // 2})
        return np.array(values, dtype=np.int64 if d.kind == "sint" else np.uint64).astype(d.numpy)
    if d.kind == "complex":
        return np.array([1 + 2j, -0.0 - 1j, complex(math.inf, -math.inf), complex(1e-30, 3.5), 0.1 + 0.2j],
                        dtype=d.numpy)
    info = ml_dtypes.finfo(d.numpy)
    values = [0.0, 1.0, float(info.max), float(info.tiny), float(info.smallest_subnormal), float(info.eps),
              0.1, 1 / 3]
    if float(info.min) < 0:
        values += [-0.0, float(info.min), -1.5]
    with np.errstate(all="ignore"):
        arr = np.array(values, dtype=np.float64).astype(d.numpy)
        for special in (math.inf, -math.inf):
            x = np.array([special]).astype(d.numpy)
            if np.isinf(x.astype(np.float64)).all():
                arr = np.concatenate([arr, x])
    return arr


def _same(a: np.ndarray, b: np.ndarray, signed_zeros: bool = True) -> bool:
    """Equal values (NaNs equal, signed zeros distinguished unless told) and the same dtype and shape."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "biu" or a.dtype == np.bool_ or DTYPES[_name(a.dtype)].kind in ("sint", "uint", "pred"):
        return np.array_equal(a.astype(object), b.astype(object))
    wide = np.complex128 if a.dtype.kind == "c" else np.float64
    x, y = a.astype(wide).reshape(-1).view(np.float64), b.astype(wide).reshape(-1).view(np.float64)
    both_nan = np.isnan(x) & np.isnan(y)
    same_sign = (np.signbit(x) == np.signbit(y)) | (not signed_zeros)
    return bool(np.all(both_nan | ((x == y) & same_sign)))


def _name(dt: np.dtype) -> str:
    return next(n for n in NUMPY_DTYPES if DTYPES[n].numpy == dt)


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_from_numpy_to_numpy_round_trip(name: str) -> None:
    arr = special_values(name)
    shape = Shape(name, arr.shape)
    lit = Literal.from_numpy(arr, shape)
    back = Literal(lit.text, shape).to_numpy()
    assert _same(back, arr), (lit.text, back, arr)
    grid = np.resize(arr, (2, 3, len(arr)))
    lit3 = Literal.from_numpy(grid, Shape(name, grid.shape))
    assert _same(lit3.to_numpy(), grid)
    assert lit3.text.startswith("{ { {")


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_scalars_and_broadcast(name: str) -> None:
    value = special_values(name)[1]
    lit = Literal.from_numpy(value, Shape(name, ()))
    assert "{" not in lit.text
    assert _same(lit.to_numpy(), np.asarray(value))
    broadcast = Literal.from_numpy(value, Shape(name, (2, 2)))
    assert _same(broadcast.to_numpy(), np.full((2, 2), value))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(NUMPY_DTYPES), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
       st.randoms(use_true_random=False))
def test_random_arrays_round_trip(name: str, dims: tuple[int, ...], rnd) -> None:
    pool = special_values(name)
    arr = np.array([pool[rnd.randrange(len(pool))] for _ in range(math.prod(dims))], dtype=pool.dtype).reshape(dims)
    lit = Literal.from_numpy(arr, Shape(name, dims))
    assert _same(Literal(lit.text, Shape(name, dims)).to_numpy(), arr)


# ----------------------------------------------------------------------------- against XLA


def _constants_module(texts: dict[str, str], lengths: dict[str, int]) -> str:
    lines = ["HloModule literals", "ENTRY %e {"]
    for name, text in texts.items():
        lines.append(f"  %c_{name} = {name}[{lengths[name]}] constant({text})")
    shapes = ", ".join(f"{n}[{lengths[n]}]" for n in texts)
    lines.append(f"  ROOT %t = ({shapes}) tuple({', '.join('%c_' + n for n in texts)})\n}}\n")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def xla_results() -> dict[str, dict]:
    """Per dtype: our array, XLA:CPU's output for our constant, the literal text XLA prints back, and XLA:CPU's
    output for that text (one module per round, all dtypes at once)."""
    from hlopt import runtime

    arrays = {name: special_values(name) for name in NUMPY_DTYPES}
    lengths = {name: len(a) for name, a in arrays.items()}
    ours = {name: Literal.from_numpy(a, Shape(name, a.shape)).text for name, a in arrays.items()}
    text = _constants_module(ours, lengths)
    outputs = runtime.execute(text, [])
    xla_texts = {}
    for line in xla_canonical_full(text).splitlines():
        if "constant(" in line:
            name = line.split("%c_", 1)[1].split(" ", 1)[0]
            xla_texts[name] = line.split("constant(", 1)[1].rsplit(")", 1)[0]
    reread = runtime.execute(_constants_module(xla_texts, lengths), [])
    return {name: {"ours": arrays[name], "out": outputs[i], "xla_text": xla_texts[name], "reread": reread[i]}
            for i, name in enumerate(arrays)}


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_xla_runs_our_constants_bit_for_bit(name: str, xla_results) -> None:
    r = xla_results[name]
    # XLA parses -0 with its sign (it prints it back), but XLA:CPU returns +0 for a -0 constant
    assert _same(np.asarray(r["out"]).astype(r["ours"].dtype), r["ours"], signed_zeros=False), r


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_literal_text_xla_prints_means_the_same_to_us_and_xla(name: str, xla_results) -> None:
    """XLA prints some types lossily (f8e8m0fnu with two digits, -0 that its parser reads as +0): what matters is
    that we read XLA's text as XLA does."""
    r = xla_results[name]
    ours = Literal(r["xla_text"], Shape(name, r["ours"].shape)).to_numpy()
    assert _same(ours, np.asarray(r["reread"]).astype(ours.dtype), signed_zeros=False), r["xla_text"]
    if name != "f8e8m0fnu":
        assert _same(ours, r["ours"]), r["xla_text"]


# ----------------------------------------------------------------------------- literal forms


@pytest.mark.parametrize("text, dtype, dims, expected", [
    ("{ { 1, 2.5, -3e+10 }, { inf, -inf, nan } }", "f32", (2, 3), [[1, 2.5, -3e10], [math.inf, -math.inf, math.nan]]),
    ("-nan", "f32", (), math.nan), ("nan(0x1)", "f64", (), math.nan), ("1.5e-7", "f64", (), 1.5e-7),
    ("{ {  }, {  } }", "f32", (2, 0), np.zeros((2, 0))), ("{}", "s32", (0,), np.zeros(0)),
    ("{ { 1, 0 }, { true, false } }", "pred", (2, 2), [[True, False], [True, False]]),
    ("{(1, -2), (inf, nan)}", "c64", (2,), [1 - 2j, complex(math.inf, math.nan)]),
    ("(0.5, 1e+300)", "c128", (), 0.5 + 1e300j), ("18446744073709551615", "u64", (), 18446744073709551615),
    ("{-9223372036854775808, 9223372036854775807}", "s64", (2,), [-(2 ** 63), 2 ** 63 - 1]),
    ("{448, -448, nan}", "f8e4m3fn", (3,), [448, -448, math.nan]), ("{6, -0.5}", "f4e2m1fn", (2,), [6, -0.5]),
    ("{1, 1.70141e+38}", "f8e8m0fnu", (2,), [1, 2.0 ** 127]), ("{-2, 1}", "s2", (2,), [-2, 1]),
])
def test_literal_forms(text: str, dtype: str, dims: tuple, expected) -> None:
    value = Literal(text, Shape(dtype, dims)).to_numpy()
    want = np.asarray(expected, dtype=np.complex128 if dtype.startswith("c") else None)
    assert value.shape == dims and value.dtype == DTYPES[dtype].numpy
    if DTYPES[dtype].kind in ("sint", "uint", "pred"):
        assert value.astype(object).tolist() == np.asarray(expected, dtype=object).tolist()
    else:
        assert _same(value, want.astype(value.dtype)), value


def test_elided_tuple_and_wrong_sizes() -> None:
    elided = Literal("{...}", Shape("f32", (200,)))
    assert elided.is_elided and elided.to_text() == "{...}"
    with pytest.raises(LiteralError, match="elided"):
        elided.to_numpy()
    with pytest.raises(LiteralError):
        Literal("( 1.5, {1, 2} )", TupleShape((Shape("f32", ()), Shape("s32", (2,))))).to_numpy()
    with pytest.raises(LiteralError, match="expected 3 values"):
        Literal("{1, 2}", Shape("f32", (3,))).to_numpy()
    with pytest.raises(LiteralError, match="complex"):
        Literal("{(1, 2)}", Shape("c64", (2,))).to_numpy()
    with pytest.raises(LiteralError):
        Literal("{1, 2}", Shape("token", (2,))).to_numpy()
    with pytest.raises(LiteralError, match="does not fit"):
        Literal("{-1}", Shape("u64", (1,))).to_numpy()


def test_scalar_and_text_kept_verbatim() -> None:
    lit = Literal("  { 1,   2 }  ", Shape("s32", (2,)))
    assert lit.text == "{ 1,   2 }" and lit.to_numpy().tolist() == [1, 2]
    assert Literal("7", Shape("s32", ())).scalar() == 7
    assert Literal("true", Shape("pred", ())).scalar() is True
    module = hlo.parse("HloModule m\nENTRY e {\n  ROOT c = f32[2] constant({ 1.00,  2e0 })\n}")
    assert "constant({ 1.00,  2e0 })" in module.to_text()
