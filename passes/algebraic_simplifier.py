"""algebraic-simplifier: the common identities of XLA's AlgebraicSimplifier, and scalar constant folding.

Before:                                              After:
    %z = f32[] constant(0)                               ROOT %r = f32[2,2] reshape(%p)
    %zs = f32[4] broadcast(%z), dimensions={}
    %a = f32[4] add(%p, %zs)
    %r1 = f32[4,1] reshape(%a)
    ROOT %r = f32[2,2] reshape(%r1)

Identities (commutative ops in either order; constants may be broadcasts of scalars):
    x + 0, x - 0, x * 1, x / 1 -> x            (not for complex x; see `keep_signed_zeros`)
    x * 0, x & 0 -> 0;  x - x, x ^ x -> 0      (integers only: for floats NaN/inf/-0.0 make them wrong)
    x | 0, x ^ 0 -> x;  p & true, p | false -> p;  p & false -> false, p | true -> true   (pred)
    max(x, x), min(x, x), x & x, x | x -> x;   select(p, x, x) -> x;  select(constant p, a, b) -> a or b
    negate(negate(x)), not(not(x)) -> x;  convert(convert(x)) -> x when the inner convert is lossless
Shape no-ops -> their operand: reshape/bitcast/copy/convert/bitcast-convert to the same shape,
    broadcast with identity dimensions, identity transpose, full slice, pad by zero, one-operand
    concatenate, reverse of size-1 dimensions, full dynamic-slice, dynamic-update-slice whose update is
    the whole result (-> update), reduce-precision to at least the type's own precision.
Compositions: reshape(reshape(x)), transpose(transpose(x)), broadcast(broadcast(x)), slice(slice(x))
    become one instruction (or x).
Constant folding: elementwise arithmetic, bitwise, compare and convert of scalar constants (or
    broadcasts of them) with XLA's semantics: integers wrap, x/0 = -1, x%0 = x, INT_MIN/-1 = INT_MIN;
    floats (f16/bf16 via f32, as XLA:CPU) follow IEEE with NaN-propagating max/min, max(-0,+0) = +0;
    converts are folded only when exact.

Every replacement has the replaced instruction's shape, layout included; instructions with control
dependencies are left alone; an entry result is never turned into a parameter when the module
declares input/output aliasing. `keep_signed_zeros=true` keeps x + 0.0 (and x - (-0.0)) for floats,
which XLA simplifies although it turns -0.0 into +0.0.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

import numpy as np
from hlopt.hlo.builder import Builder
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.literal import Literal
from hlopt.hlo.shape import DTYPES, AnyShape, Shape, default_layout
from hlopt.passes.dce import SideEffects
from hlopt.passes.framework.base import ModulePass, non_fusion_computations
from hlopt.passes.framework.fixed_points import FixedPoints, fixed_points
from hlopt.passes.framework.match import (
    Pat,
    PatternMatcher,
    remove_with_unused_operands,
    replace_instruction,
    scalar_constant_value,
    values_equal,
)
from hlopt.passes.framework.registry import register

__all__ = ["AlgebraicSimplifier", "simplification_rules", "fold_scalar", "same_shape"]

_INT_KINDS = ("sint", "uint")
_FOLD_FLOATS = frozenset({"f16", "bf16", "f32", "f64"})
_FOLD_INTS = frozenset({"s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64"})
_PRECISION = {"f16": (5, 10), "bf16": (8, 7), "f32": (8, 23), "f64": (11, 52)}
_WIDER_FLOATS = {"f16": ("f32", "f64"), "bf16": ("f32", "f64"), "f32": ("f64",)}
_F8 = ("f8e4m3fn", "f8e5m2", "f8e4m3", "f8e3m4", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3b11fnuz", "f8e8m0fnu")


# ----------------------------------------------------------------------------- shapes

def _leaf_layout(shape: Shape) -> Any:
    return shape.layout or default_layout(shape.rank)


def same_shape(a: AnyShape, b: AnyShape) -> bool:
    """Same type, dimensions and layout (a missing layout is the default one)."""
    if a.is_tuple or b.is_tuple:
        return a.is_tuple and b.is_tuple and len(a.elements) == len(b.elements) and all(
            same_shape(x, y) for x, y in zip(a.elements, b.elements, strict=True))
    return a.compatible(b) and _leaf_layout(a) == _leaf_layout(b)


def _keep(x: Instruction, root: Instruction) -> Instruction | None:
    return x if same_shape(x.shape, root.shape) else None


def _dtype_kind(inst: Instruction) -> str:
    return "tuple" if inst.shape.is_tuple else DTYPES[inst.shape.dtype].kind


# ----------------------------------------------------------------------------- constants

def _zeros_like(root: Instruction) -> Instruction:
    b = Builder(root.parent, before=root)
    zero = b.op("constant", shape=Shape(root.shape.dtype, ()), literal=Literal.from_numpy(
        np.zeros((), DTYPES[root.shape.dtype].numpy), Shape(root.shape.dtype, ())))
    return zero if root.shape.rank == 0 else b.op("broadcast", zero, shape=root.shape, dimensions=())


#: Python number types whose repr tells equal values apart (-0.0 from 0.0 too): keys of the memos below
_PLAIN_NUMBERS = frozenset({float, int, bool})
#: (a Python number's type, its repr, dtype, dims) -> the text of its literal (`_scalar_literal`): the same few
#: constants (a reciprocal, a reducer's identity) are made again in every layer
_SCALAR_TEXTS: dict[tuple, str] = {}


def _scalar_literal(value: Any, shape: Shape) -> Literal:
    """A literal of the scalar `shape` holding `value` (-0.0 kept as such)."""
    key = (type(value), repr(value), shape.dtype, shape.dims) if type(value) in _PLAIN_NUMBERS else None
    text = _SCALAR_TEXTS.get(key) if key is not None else None
    if text is not None:
        return Literal(text, shape)
    literal = Literal.from_numpy(np.asarray(value), shape)
    if DTYPES[shape.dtype].kind == "float" and float(value) == 0 and np.signbit(float(value)):
        literal = Literal("-0.0", shape)  # XLA's parser reads "-0" as +0
    if key is not None and len(_SCALAR_TEXTS) < 10_000:
        _SCALAR_TEXTS[key] = literal.text
    return literal


def _constant_like(root: Instruction, value: Any) -> Instruction:
    """A scalar constant holding `value`, broadcast to root's shape if root is not a scalar."""
    b = Builder(root.parent, before=root)
    scalar = root.shape if root.shape.rank == 0 else Shape(root.shape.dtype, ())
    const = b.op("constant", shape=scalar, literal=_scalar_literal(value, scalar))
    return const if root.shape.rank == 0 else b.op("broadcast", const, shape=root.shape, dimensions=())


def _scalar_operand(inst: Instruction) -> Any | None:
    """The value of a rank-0 constant or of a broadcast of one (Python number), else None."""
    if inst.opcode == "broadcast" and inst.operand_count == 1 and inst.operand(0).shape.rank == 0:
        inst = inst.operand(0)
    if inst.opcode != "constant" or inst.shape.is_tuple or inst.shape.rank != 0:
        return None
    return scalar_constant_value(inst)


def _foldable(dtype: str) -> bool:
    return dtype in _FOLD_INTS or dtype in _FOLD_FLOATS or dtype == "pred"


def _wrap(value: int, dtype: str) -> int:
    bits = DTYPES[dtype].bits
    if DTYPES[dtype].kind == "uint":
        return value % (1 << bits)
    return (value + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))


def _int_divide(a: int, b: int, dtype: str) -> int:
    if b == 0:
        return _wrap(-1, dtype)  # XLA: x / 0 is all ones
    q = abs(a) // abs(b)
    return _wrap(q if (a < 0) == (b < 0) else -q, dtype)  # truncation; INT_MIN / -1 wraps to INT_MIN


def _int_remainder(a: int, b: int, dtype: str) -> int:
    if b == 0:
        return a  # XLA: x % 0 is x
    r = abs(a) % abs(b)
    return _wrap(-r if a < 0 else r, dtype)


_INT_OPS = {
    "add": lambda a, b, t: _wrap(a + b, t), "subtract": lambda a, b, t: _wrap(a - b, t),
    "multiply": lambda a, b, t: _wrap(a * b, t), "divide": _int_divide, "remainder": _int_remainder,
    "maximum": lambda a, b, t: max(a, b), "minimum": lambda a, b, t: min(a, b),
    "and": lambda a, b, t: _wrap(a & b, t), "or": lambda a, b, t: _wrap(a | b, t),
    "xor": lambda a, b, t: _wrap(a ^ b, t),
}
_PRED_OPS = {"and": lambda a, b: a and b, "or": lambda a, b: a or b, "xor": lambda a, b: a != b}
_COMPARE = {"EQ": lambda a, b: a == b, "NE": lambda a, b: a != b, "LT": lambda a, b: a < b,
            "LE": lambda a, b: a <= b, "GT": lambda a, b: a > b, "GE": lambda a, b: a >= b}


def _float_max_min(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.isnan(a) or np.isnan(b):
        return a if np.isnan(a) else b
    if a == b == 0:  # XLA:CPU: max(-0, +0) = +0, min(-0, +0) = -0
        neg = (np.signbit(a) and np.signbit(b)) if op == "maximum" else (np.signbit(a) or np.signbit(b))
        return -np.abs(a) if neg else np.abs(a)
    return np.maximum(a, b) if op == "maximum" else np.minimum(a, b)


def _float_binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    with np.errstate(all="ignore"):
        if op in ("maximum", "minimum"):
            return _float_max_min(op, a, b)
        fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
              "remainder": np.fmod}.get(op)
        return None if fn is None else fn(a, b)


def _compute_type(dtype: str) -> type:
    return np.float64 if dtype == "f64" else np.float32  # f16/bf16 are computed in f32, as XLA:CPU does


def _exact_convert(value: Any, src: str, dst: str) -> Any | None:
    """`value` converted to `dst` when the conversion is exact (or to pred), else None."""
    kind = DTYPES[dst].kind
    if kind == "pred":
        return None if isinstance(value, float) and math.isnan(value) else bool(value != 0)
    if kind in _INT_KINDS:
        if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
            return None
        info = np.iinfo(DTYPES[dst].numpy)
        return int(value) if info.min <= int(value) <= info.max else None
    with np.errstate(all="ignore"):
        out = np.asarray(float(value) if DTYPES[src].kind == "float" else int(value)).astype(DTYPES[dst].numpy)
    back = float(out)
    if math.isnan(back) and isinstance(value, float) and math.isnan(value):
        return out
    return out if back == value else None


def fold_scalar(opcode: str, values: list[Any], in_dtype: str, out_dtype: str,
                direction: str | None = None) -> Any | None:
    """XLA's result of `opcode` on scalar values (Python numbers), or None when not folded."""
    if not (_foldable(in_dtype) and _foldable(out_dtype)):
        return None
    kind = DTYPES[in_dtype].kind
    if opcode == "convert":
        return _exact_convert(values[0], in_dtype, out_dtype)
    if opcode == "compare":
        fn = _COMPARE.get(direction or "")
        return None if fn is None else bool(fn(*values))
    if kind == "pred":
        if opcode == "not":
            return not values[0]
        fn = _PRED_OPS.get(opcode)
        return None if fn is None or len(values) != 2 else bool(fn(*values))
    if kind in _INT_KINDS:
        return _fold_int(opcode, [int(v) for v in values], in_dtype)
    return _fold_float(opcode, values, in_dtype)


def _fold_int(opcode: str, values: list[int], dtype: str) -> int | None:
    if len(values) == 2:
        fn = _INT_OPS.get(opcode)
        return None if fn is None else fn(values[0], values[1], dtype)
    (a,) = values
    unary = {"negate": -a, "abs": abs(a), "not": ~a, "sign": (a > 0) - (a < 0)}
    return _wrap(unary[opcode], dtype) if opcode in unary else None


def _fold_float(opcode: str, values: list[Any], dtype: str) -> Any | None:
    ct = _compute_type(dtype)
    with np.errstate(all="ignore"):  # overflow to inf and NaN are the folded values, as XLA computes them
        args = [np.asarray(v, dtype=np.float64).astype(DTYPES[dtype].numpy).astype(ct) for v in values]
        if len(args) == 2:
            result = _float_binary(opcode, *args)
        elif opcode == "negate":
            result = -args[0]
        elif opcode == "abs":
            result = np.abs(args[0])
        elif opcode == "sign":  # XLA keeps the zero's sign: sign(-0.0) = -0.0
            result = args[0] if args[0] == 0 or np.isnan(args[0]) else np.copysign(ct(1), args[0])
        else:
            result = None
        return None if result is None else np.asarray(result).astype(DTYPES[dtype].numpy)


_COMPARE_TYPES = {"float": "FLOAT", "sint": "SIGNED", "uint": "UNSIGNED", "pred": "UNSIGNED"}
_FOLDABLE_OPS = frozenset({"add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "and",
                           "or", "xor", "compare", "negate", "abs", "not", "sign", "convert"})


def _fold(root: Instruction) -> Instruction | None:
    if root.shape.is_tuple:
        return None
    values = []
    for operand in root.operands:
        value = _scalar_operand(operand)
        if value is None:  # (the first operand that is no scalar constant settles it)
            return None
        values.append(value)
    if not values:
        return None
    in_dtype = root.operand(0).shape.dtype
    compare_type = root.attrs.get("type")
    if root.opcode == "compare" and compare_type not in (None, _COMPARE_TYPES.get(DTYPES[in_dtype].kind)):
        return None  # TOTALORDER (or a reinterpreting type) orders values differently
    result = fold_scalar(root.opcode, values, in_dtype, root.shape.dtype, str(root.attrs.get("direction", "")))
    return None if result is None else _constant_like(root, result)


# ----------------------------------------------------------------------------- identities

def _is_float(inst: Instruction) -> bool:
    return _dtype_kind(inst) == "float"


def _arith_identity(root: Instruction, x: Instruction, c: Instruction, signed_zeros: bool) -> Instruction | None:
    if _dtype_kind(root) == "complex":
        return None
    if signed_zeros and _is_float(root) and root.opcode in ("add", "subtract"):
        negative_zero = math.copysign(1.0, float(scalar_constant_value(c))) < 0
        if negative_zero != (root.opcode == "add"):
            return None  # x + 0.0 and x - (-0.0) turn -0.0 into +0.0
    return _keep(x, root)


def _integer_zero(root: Instruction, c: Instruction) -> Instruction | None:
    if _dtype_kind(root) not in _INT_KINDS:
        return None
    return _keep(c, root) or _zeros_like(root)


def _integer_self_zero(root: Instruction, x: Instruction) -> Instruction | None:
    kind = _dtype_kind(root)
    return _zeros_like(root) if kind in _INT_KINDS or (kind == "pred" and root.opcode == "xor") else None


def _pred_absorb(root: Instruction, x: Instruction, c: Instruction) -> Instruction | None:
    """p & true -> p, p | false -> p; p & false -> false, p | true -> true."""
    if _dtype_kind(root) != "pred":
        return None
    identity = bool(scalar_constant_value(c)) == (root.opcode == "and")
    return _keep(x, root) if identity else _keep(c, root)


def _select(root: Instruction, p: Instruction, a: Instruction, b: Instruction) -> Instruction | None:
    if a is b:
        return _keep(a, root)
    value = scalar_constant_value(p)
    return None if value is None else _keep(a if value else b, root)


# ----------------------------------------------------------------------------- shape no-ops

def _identity_transpose(root: Instruction, x: Instruction) -> Instruction | None:
    return _keep(x, root) if tuple(root.attrs.get("dimensions", ())) == tuple(range(x.shape.rank)) else None


def _identity_broadcast(root: Instruction, x: Instruction) -> Instruction | None:
    return _keep(x, root) if tuple(root.attrs.get("dimensions", ())) == tuple(range(x.shape.rank)) else None


def _full_slice(root: Instruction, x: Instruction) -> Instruction | None:
    spec = root.attrs.get("slice", ())
    full = len(spec) == x.shape.rank and all(
        s == 0 and lim == d and st == 1 for (s, lim, st), d in zip(spec, x.shape.dims, strict=True))
    return _keep(x, root) if full else None


def _zero_pad(root: Instruction, x: Instruction) -> Instruction | None:
    cfg = root.attrs.get("padding")
    return _keep(x, root) if cfg is not None and not any(any(d) for d in cfg.dims) else None


def _trivial_reverse(root: Instruction, x: Instruction) -> Instruction | None:
    dims = root.attrs.get("dimensions", ())
    return _keep(x, root) if all(x.shape.dims[d] == 1 for d in dims) else None


def _full_dynamic_slice(root: Instruction, x: Instruction) -> Instruction | None:
    return _keep(x, root)  # same shape as the operand: the (clamped) start is 0


def _full_update(root: Instruction, x: Instruction, u: Instruction) -> Instruction | None:
    return _keep(u, root)  # the update covers the whole operand (its start is clamped to 0)


def _no_op_reduce_precision(root: Instruction, x: Instruction) -> Instruction | None:
    own = _PRECISION.get(root.shape.dtype) if not root.shape.is_tuple else None
    bits = (root.attrs.get("exponent_bits"), root.attrs.get("mantissa_bits"))
    if own is None or not all(isinstance(b, int) for b in bits):
        return None
    return _keep(x, root) if bits[0] >= own[0] and bits[1] >= own[1] else None


# ----------------------------------------------------------------------------- compositions

def _reshape_of_reshape(root: Instruction, x: Instruction) -> Instruction | None:
    if same_shape(x.shape, root.shape):
        return x
    return Builder(root.parent, before=root).op("reshape", x, shape=root.shape)


def _transpose_of_transpose(root: Instruction, inner: Instruction, x: Instruction) -> Instruction | None:
    p_in, p_out = inner.attrs["dimensions"], root.attrs["dimensions"]
    combined = tuple(p_in[p] for p in p_out)
    if combined == tuple(range(len(combined))) and same_shape(x.shape, root.shape):
        return x
    return Builder(root.parent, before=root).op("transpose", x, shape=root.shape, dimensions=combined)


def _broadcast_of_broadcast(root: Instruction, inner: Instruction, x: Instruction) -> Instruction | None:
    d_in, d_out = inner.attrs.get("dimensions", ()), root.attrs.get("dimensions", ())
    combined = tuple(d_out[d] for d in d_in)
    return Builder(root.parent, before=root).op("broadcast", x, shape=root.shape, dimensions=combined)


def _slice_of_slice(root: Instruction, inner: Instruction, x: Instruction) -> Instruction | None:
    spec = []
    for (s1, _, t1), (s2, _, t2), n in zip(inner.attrs["slice"], root.attrs["slice"], root.shape.dims, strict=True):
        start, stride = s1 + s2 * t1, t1 * t2
        spec.append((start, start + (n - 1) * stride + 1 if n else start, stride))
    return Builder(root.parent, before=root).op("slice", x, shape=root.shape, slice=tuple(spec))


def _lossless(src: str, mid: str) -> bool:
    """Whether converting src -> mid keeps every value (so converting back restores it)."""
    s, m = DTYPES[src], DTYPES[mid]
    if s.kind == "pred":
        return m.kind != "pred"
    if s.kind in _INT_KINDS and m.kind in _INT_KINDS:
        return m.bits >= s.bits if s.kind == m.kind else (s.kind == "uint" and m.bits > s.bits)
    if s.kind in _INT_KINDS and m.kind == "float":
        magnitude = s.bits - (s.kind == "sint")
        return magnitude <= {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}.get(mid, 0)
    if s.kind == "float" and m.kind == "float":
        return mid in _WIDER_FLOATS.get(src, ()) or (src in _F8 and mid in ("f32", "f64"))
    return False


def _convert_pair(root: Instruction, inner: Instruction, x: Instruction) -> Instruction | None:
    if x.shape.is_tuple or x.shape.dtype != root.shape.dtype or not _lossless(x.shape.dtype, inner.shape.dtype):
        return None
    return _keep(x, root)


# ----------------------------------------------------------------------------- divide and reduce

_RECIPROCAL_TYPES = frozenset({"f16", "bf16", "f32", "f64"})


def _divide_by_constant(root: Instruction, x: Instruction, c: Instruction) -> Instruction | None:
    """x / c -> x * (1 / c) for a float constant c (XLA's HandleDivide; backends multiply faster than
    they divide). 1/c is rounded to the type, so the result may differ from x / c in the last bit, as
    in XLA. Not when x is itself a constant (folding handles that)."""
    dtype = root.shape.dtype if not root.shape.is_tuple else None
    if dtype not in _RECIPROCAL_TYPES or x.opcode == "constant":
        return None
    b = Builder(root.parent, before=root)
    return b.op("multiply", x, _constant_like(root, _reciprocal(dtype, scalar_constant_value(c))), shape=root.shape)


#: (dtype, a Python number's type, its repr) -> `_reciprocal`
_RECIPROCALS: dict[tuple, Any] = {}


def _reciprocal(dtype: str, value: Any) -> Any:
    """1 / value in `dtype` (rounded to it, no warning for 0 or inf), as a Python number."""
    key = (dtype, type(value), repr(value)) if type(value) in _PLAIN_NUMBERS else None
    got = _RECIPROCALS.get(key) if key is not None else None
    if got is None:
        numpy_type = DTYPES[dtype].numpy
        with np.errstate(all="ignore"):
            got = (np.asarray(1, numpy_type) / np.asarray(value, numpy_type)).item()
        if key is not None and len(_RECIPROCALS) < 10_000:
            _RECIPROCALS[key] = got
    return got


def _reducer_identity(root: Instruction) -> bool:
    """Is the reduce's init value the identity of its reducer (a binary op of its two parameters)?"""
    comp = root.attrs.get("to_apply")
    init = scalar_constant_value(root.operand(1))
    if comp is None or init is None or comp.root.operand_count != 2 or len(comp.instructions) != 3:
        return False
    if {o.opcode for o in comp.root.operands} != {"parameter"} or len(set(comp.root.operands)) != 2:
        return False
    op, dtype = comp.root.opcode, root.shape.dtype
    kind = DTYPES[dtype].kind
    if kind == "pred":
        return op in ("and", "or", "xor", "maximum", "minimum") and bool(init) == (op in ("and", "minimum"))
    if op in ("add", "or", "xor"):
        return values_equal(init, 0)
    if op == "multiply":
        return values_equal(init, 1)
    if op == "and" and kind in _INT_KINDS:
        return init == (-1 if kind == "sint" else np.iinfo(DTYPES[dtype].numpy).max)
    if op in ("maximum", "minimum"):
        low = op == "maximum"
        if kind == "float":
            return init == (-math.inf if low else math.inf)
        if kind in _INT_KINDS:
            info = np.iinfo(DTYPES[dtype].numpy)
            return init == (info.min if low else info.max)
    return False


def _pred_compare_identity(root: Instruction, x: Instruction, c: Instruction) -> Instruction | None:
    """p != false -> p, p == true -> p (p a pred)."""
    if x.shape.is_tuple or x.shape.dtype != "pred" or c.shape.dtype != "pred":
        return None
    direction = str(root.attrs.get("direction", ""))
    wanted = {"NE": False, "EQ": True}.get(direction)
    return _keep(x, root) if wanted is not None and bool(scalar_constant_value(c)) == wanted else None


def _min_max_to_clamp(root: Instruction, inner: Instruction, x: Instruction, lo: Instruction,
                      hi: Instruction) -> Instruction | None:
    """max(lo, min(x, hi)) and min(hi, max(x, lo)) -> clamp(lo, x, hi) for constants lo < hi
    (XLA's MinMaxToClamp); `inner` is the inner min or max."""
    if root.opcode == inner.opcode or root.shape.is_tuple:
        return None
    if root.opcode == "minimum":
        lo, hi = hi, lo  # the pattern captured the outer constant as lo
    lo_value, hi_value = scalar_constant_value(lo), scalar_constant_value(hi)
    if lo_value is None or hi_value is None or not lo_value < hi_value:
        return None
    if not (same_shape(lo.shape, root.shape) and same_shape(hi.shape, root.shape)):
        return None
    return Builder(root.parent, before=root).op("clamp", lo, x, hi, shape=root.shape)


def _no_op_reduce(root: Instruction, x: Instruction) -> Instruction | None:
    """A reduce that keeps every element (it reduces only size-1 dimensions) is a reshape of its
    operand (XLA's HandleReduce). XLA assumes the init value is the reducer's identity; we check it."""
    if root.shape.is_tuple or x.shape.numel != root.shape.numel or not _reducer_identity(root):
        return None
    return Builder(root.parent, before=root).op("reshape", x, shape=root.shape)


def _reduce_of_reduce(root: Instruction, inner: Instruction, x: Instruction) -> Instruction | None:
    """reduce(reduce(x, dims=a), dims=b) with the same init and reducer -> one reduce over both
    (XLA's HandleReduce). The inner reduce must have no other user; the init must be the reducer's
    identity (XLA assumes it; with another init the merged reduce would apply it once, not twice)."""
    if root.shape.is_tuple or inner.shape.is_tuple or inner.user_count != 1 or inner.operand_count != 2:
        return None
    if not _reducer_identity(root):
        return None
    if root.operand(1) is not inner.operand(1) and not (
            scalar_constant_value(root.operand(1)) is not None
            and values_equal(scalar_constant_value(root.operand(1)), scalar_constant_value(inner.operand(1)))
            and root.operand(1).shape.dtype == inner.operand(1).shape.dtype):
        return None
    if not _same_reducer(root.attrs["to_apply"], inner.attrs["to_apply"]):
        return None
    kept = [d for d in range(x.shape.rank) if d not in set(inner.attrs["dimensions"])]
    dims = sorted(set(inner.attrs["dimensions"]) | {kept[d] for d in root.attrs["dimensions"]})
    b = Builder(root.parent, before=root)
    return b.op("reduce", x, inner.operand(1), shape=root.shape, dimensions=tuple(dims),
                to_apply=root.attrs["to_apply"])


def _same_reducer(a: Computation, b: Computation) -> bool:
    """Both computations apply the same binary op to their two parameters, in the same order."""
    if a is b:
        return True
    ra, rb = a.root, b.root
    return (ra.opcode == rb.opcode and ra.operand_count == rb.operand_count == 2
            and all(o.opcode == "parameter" for o in (*ra.operands, *rb.operands))
            and [o.attrs["parameter_number"] for o in ra.operands] == [o.attrs["parameter_number"] for o in rb.operands]
            and ra.shape == rb.shape and len(a.instructions) == len(b.instructions) == 3)


# ----------------------------------------------------------------------------- the rules

def _same_dtype(root: Instruction) -> bool:
    return not root.shape.is_tuple and root.operand(0).shape.dtype == root.shape.dtype


def _dims_equal(root: Instruction) -> bool:
    op = root.operand(0)
    return not op.shape.is_tuple and op.shape.dims == root.shape.dims


@cache
def simplification_rules(keep_signed_zeros: bool = False, fold_constants: bool = True) -> PatternMatcher:
    """The simplifier's rules as a PatternMatcher (callers may extend it with `+`)."""
    x, zero, one = Pat.any("x"), Pat.const(0, "c"), Pat.const(1, "c")
    rules = [
        (Pat({"add", "subtract"}, [x, zero], commutative=None),
         lambda root, x, c: _arith_identity(root, x, c, keep_signed_zeros)),
        (Pat({"multiply", "divide"}, [x, one]), lambda root, x, c: _arith_identity(root, x, c, False)),
        (Pat({"multiply", "and"}, [x, zero]), lambda root, x, c: _integer_zero(root, c)),
        (Pat({"or", "xor"}, [x, zero]), lambda root, x, c: _keep(x, root)),
        (Pat({"and", "or"}, [x, Pat.const(name="c")]), _pred_absorb),
        (Pat({"maximum", "minimum", "and", "or"}, [x, x]), lambda root, x: _keep(x, root)),
        (Pat({"subtract", "xor"}, [x, x]), _integer_self_zero),
        (Pat("select", [Pat.any("p"), Pat.any("a"), Pat.any("b")]), _select),
        (Pat({"negate", "not"}, [Pat({"negate", "not"}, [x], name="inner")]),
         lambda root, inner, x: _keep(x, root) if inner.opcode == root.opcode else None),
        (Pat({"reshape", "bitcast", "copy"}, [x]), lambda root, x: _keep(x, root)),
        (Pat({"convert", "bitcast-convert"}, [x], predicate=_same_dtype), lambda root, x: _keep(x, root)),
        (Pat("convert", [Pat("convert", [x], name="inner")]), _convert_pair),
        (Pat("reshape", [Pat("reshape", [x])]), _reshape_of_reshape),
        (Pat("transpose", [x]), _identity_transpose),
        (Pat("transpose", [Pat("transpose", [x], name="inner")]), _transpose_of_transpose),
        (Pat("broadcast", [x]), _identity_broadcast),
        (Pat("broadcast", [Pat("broadcast", [x], name="inner")]), _broadcast_of_broadcast),
        (Pat("slice", [x]), _full_slice),
        (Pat("slice", [Pat("slice", [x], name="inner")]), _slice_of_slice),
        (Pat("pad", [x, Pat.any()]), _zero_pad),
        (Pat("concatenate", [x]), lambda root, x: _keep(x, root)),
        (Pat("reverse", [x]), _trivial_reverse),
        (Pat("dynamic-slice", predicate=_dims_equal), lambda root: _full_dynamic_slice(root, root.operand(0))),
        (Pat("dynamic-update-slice", predicate=lambda r: r.operand(1).shape.dims == r.shape.dims),
         lambda root: _full_update(root, root.operand(0), root.operand(1))),
        (Pat("reduce-precision", [x]), _no_op_reduce_precision),
        (Pat("divide", [x, Pat.const(name="c")]), _divide_by_constant),
        (Pat("compare", [x, Pat.const(name="c")], commutative=True), _pred_compare_identity),
        (Pat({"maximum", "minimum"}, [Pat.const(name="lo"), Pat({"maximum", "minimum"}, [x, Pat.const(name="hi")],
                                                                name="inner", commutative=None)],
             commutative=None), _min_max_to_clamp),
        (Pat("reduce", [x, Pat.any()]), _no_op_reduce),
        (Pat("reduce", [Pat("reduce", [x, Pat.any()], name="inner"), Pat.any()]), _reduce_of_reduce),
    ]
    if fold_constants:
        rules.append((Pat(_FOLDABLE_OPS), _fold))
    return PatternMatcher(rules)


#: Opcodes every base rule for which needs a constant operand (`Pat.const`, or folding's scalar constants), the
#: same operand twice (`[x, x]`), or (negate, not) an operand of opcode negate or not: see `_no_rule_applies`.
_NEEDS_CONSTANT_OR_PAIR = frozenset({"add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum",
                                     "and", "or", "xor", "compare", "negate", "abs", "not", "sign"})
_NEGATE_NOT = frozenset({"negate", "not"})
#: Of those, the opcodes whose rules with a constant operand want it 0 or 1 (x + 0, x - 0, x * 1, x * 0), apart
#: from folding (every operand constant).
_ZERO_ONE_RULES = frozenset({"add", "subtract", "multiply"})
#: Opcodes whose base rules are "same shape as the operand -> the operand" and (reshape, transpose, broadcast)
#: the composition with an operand of the same opcode.
_SHAPE_NO_OPS = frozenset({"reshape", "bitcast", "copy", "transpose", "broadcast"})


def _constant_based(inst: Instruction) -> bool:
    """Whether `inst` is a constant or a chain of one-operand broadcasts of one (`scalar_constant_value`'s walk:
    what every `Pat.const` and folding's `_scalar_operand` need)."""
    while inst.opcode == "broadcast" and inst.operand_count == 1:
        inst = inst.operand(0)
    return inst.opcode == "constant"


def _no_rule_applies(inst: Instruction) -> bool:
    """True when no base rule (`simplification_rules`) can match `inst`: an opcode of `_NEEDS_CONSTANT_OR_PAIR`
    with no constant-based operand, not the same operand twice, and (negate, not) no negate or not operand; for add,
    subtract and multiply, constant-based operands of a value other than 0 and 1 (`values_equal`) or of none
    (`scalar_constant_value`) are allowed too, as long as not every operand is one.
    Also a reshape, bitcast, copy, transpose or broadcast whose one operand has another opcode and other dimensions
    (both arrays), and a reduce of two operands, the first no reduce, whose element count differs from the result's.
    A necessary condition only (False says nothing); it reads the IR only and builds nothing."""
    op = inst.opcode
    if op not in _NEEDS_CONSTANT_OR_PAIR:
        if op in _SHAPE_NO_OPS:
            operands = inst.operands
            if len(operands) != 1:
                return True  # every such pattern has one operand
            x, shape = operands[0], inst.shape
            return x.opcode != op and not x.shape.is_tuple and not shape.is_tuple and x.shape.dims != shape.dims
        if op == "reduce":
            operands = inst.operands
            if len(operands) != 2:
                return True  # both patterns have two operands
            x, shape = operands[0], inst.shape
            if x.opcode == "reduce":
                return False
            return shape.is_tuple or (not x.shape.is_tuple and x.shape.numel != shape.numel)
        return False
    operands = inst.operands
    if len(operands) == 2 and operands[0] is operands[1]:
        return False
    constants = 0
    for operand in operands:
        if operand.opcode in _NEGATE_NOT:
            return False
        if _constant_based(operand):
            if op not in _ZERO_ONE_RULES:
                return False
            value = scalar_constant_value(operand)
            if value is not None and (values_equal(value, 0) or values_equal(value, 1)):
                return False
            constants += 1
    return constants < len(operands)  # (all constant-based: folding may apply)


def _ruled_opcodes() -> frozenset[str]:
    """The root opcodes of the base rules (every one names its opcodes): the matcher finds nothing for others."""
    opcodes: set[str] = set()
    for fold_constants in (False, True):
        for pat, _ in simplification_rules(False, fold_constants).rules:
            assert pat.opcodes is not None, "a base rule for every opcode: `_RULED_OPCODES` would miss it"
            opcodes |= pat.opcodes
    return frozenset(opcodes)


def _guarded_parameter(inst: Instruction, new: Instruction) -> bool:
    """An entry result must not become a parameter when the module declares aliasing."""
    comp, module = inst.parent, inst.parent.module
    if new.opcode != "parameter" or not comp.is_entry or module is None:
        return False
    if "input_output_alias" not in module.config and "buffer_donor" not in module.config:
        return False
    return inst.is_root or any(u.is_root for u in inst.users)


def _discard_new(new: Instruction, mark: int, effects: SideEffects) -> None:
    if new.id > mark and new.parent is not None and not new.user_count and not new.is_root:
        remove_with_unused_operands(new, effects)


#: Opcodes some base rule is for (`quick` visits skip the matcher for the others).
_RULED_OPCODES = _ruled_opcodes()


@register
@dataclass(frozen=True)
class AlgebraicSimplifier(ModulePass):
    """Apply the identities and scalar constant folding listed in the module docstring."""

    name: ClassVar[str] = "algebraic-simplifier"
    keep_signed_zeros: bool = False
    fold_constants: bool = True

    def rules(self) -> PatternMatcher:
        """This configuration's rules."""
        return simplification_rules(self.keep_signed_zeros, self.fold_constants)

    def run_on_computation(self, comp: Computation, rules: PatternMatcher, effects: SideEffects,
                           done: FixedPoints | None = None, quick: bool = False) -> bool:
        """Rewrite one computation until no rule applies (replacements and their users are revisited).

        With `done` (this configuration's record of the module, `passes.framework.fixed_points`): a computation
        a run left with no rule applying anywhere and nothing built and dropped, with no IR edit since, the same
        shapes and unedited reducers, is not visited again (it would change nothing; the instruction ids the
        visits would draw are drawn); a run that changes nothing and builds nothing is recorded. `quick` (only
        for the base rules, `simplification_rules`) skips the matcher on instructions of an opcode no rule is for
        and on those `_no_rule_applies` to."""
        if done is not None and done.holds(comp) and _reducers_hold(comp, done):
            for inst in comp.instructions:
                if not inst.has_control_dependencies:
                    Instruction.id_watermark()  # the id its visit would have drawn
            return False
        start = comp.edit_stamp
        # The work list is the post order followed by a queue of revisits (`later`): an instruction is pending
        # while it is in the post order's unvisited part (`position` >= k) or in `later`. Sets of ids (the post
        # order and `later` keep their instructions alive), and the positions only from the first replacement.
        order = comp.post_order()
        count = len(order)
        budget = 20 * count + 100
        changed = False
        k = 0
        position: dict[int, int] | None = None
        later: deque[Instruction] = deque()
        later_ids: set[int] = set()
        while budget > 0:
            if k < count:
                inst = order[k]
                k += 1
            elif later:
                inst = later.popleft()
                later_ids.discard(id(inst))
            else:
                break
            if inst.parent is not comp or inst.has_control_dependencies:
                continue
            budget -= 1
            mark = Instruction.id_watermark()
            if quick and (inst.opcode not in _RULED_OPCODES or _no_rule_applies(inst)):
                continue
            new = rules.rewrite(inst)
            if new is None or new is inst:
                continue
            if _guarded_parameter(inst, new) or not same_shape(new.shape, inst.shape):
                _discard_new(new, mark, effects)
                continue
            if position is None:
                position = {id(x): i for i, x in enumerate(order)}
            users = [u for u in inst.users if not _pending(u, position, k, later_ids)]
            replace_instruction(inst, new, effects=effects)
            changed = True
            for u in [new, *users]:
                if u.parent is comp and not _pending(u, position, k, later_ids):
                    later.append(u)
                    later_ids.add(id(u))
        if done is not None:
            if comp.edit_stamp == start:  # every instruction visited, no rule applied, nothing built
                done.mark(comp)
            else:
                done.forget(comp)
        return changed

    def run(self, module: Module) -> bool:
        rules, effects = self.rules(), SideEffects(module)
        quick = rules is simplification_rules(self.keep_signed_zeros, self.fold_constants)
        done = None
        if type(self).rules is AlgebraicSimplifier.rules:  # the rules whose reads `_reducers_hold` knows
            config = module.config
            done = fixed_points(module, self.describe(), (
                module.entry.name if module.entry else None, id(module.entry), config.get("input_output_alias"),
                config.get("buffer_donor")))  # what `_guarded_parameter` reads
        changed = False
        for comp in non_fusion_computations(module):
            changed |= self.run_on_computation(comp, rules, effects, done, quick)
        return changed


def _pending(inst: Instruction, position: dict[int, int], k: int, later_ids: set[int]) -> bool:
    """Whether `inst` waits for a visit: in the post order at `k` or after, or queued for a revisit."""
    at = position.get(id(inst))
    return (at is not None and at >= k) or id(inst) in later_ids


def _reducers_hold(comp: Computation, done: FixedPoints) -> bool:
    """Whether every computation a reduce of `comp` calls (its reducer, which `_reducer_identity` and
    `_same_reducer` read: the only computations a rule reads) is as it was while this pass last ran on `comp`
    (`FixedPoints.callee_holds`)."""
    for inst in comp.instructions:
        if inst.opcode == "reduce":
            for reducer in inst.called_computations:
                if not done.callee_holds(reducer, comp):
                    return False
    return True
