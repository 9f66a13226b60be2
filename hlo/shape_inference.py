"""Shape inference: the result shape of an instruction from its operands and attributes.

One rule per opcode (`INFERENCE_RULES`, registered with `@rule`). A rule gets the instruction and the
result shape as written (`given`, None when inferring) and returns the shape the instruction must have.
Most rules ignore `given`; the ones whose result type is not determined by the operands (convert,
bitcast-convert, broadcast, reshape, iota, custom-call, the element type of dot/convolution, ...) take
that part from `given`, and raise `ShapeInferenceError` when it is None.

- `infer_shape(inst)`: the shape, from operands and attributes only (the parser, for instructions
  written without a shape, and the builder use it).
- `check_shape(inst) -> str | None`: what is wrong with `inst.shape`, or None (the verifier uses it).
  Shapes are compared like XLA's `ShapeUtil::Compatible`: layouts and dynamic-dimension markers ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hlopt.hlo.attributes import Window, WindowDim
from hlopt.hlo.ir import Computation, Instruction
from hlopt.hlo.opcodes import async_base
from hlopt.hlo.shape import DTYPES, AnyShape, Layout, Shape, TupleShape

__all__ = [
    "infer_shape", "check_shape", "expected_shape", "shapes_compatible", "rule", "rule_for",
    "ShapeInferenceError", "INFERENCE_RULES",
]


class ShapeInferenceError(ValueError):
    """The operands and attributes do not determine a valid shape."""


Rule = Callable[[Instruction, "AnyShape | None"], AnyShape]
#: Shape rule per opcode: `rule(inst, given)` -> the shape `inst` must have.
INFERENCE_RULES: dict[str, Rule] = {}

_TOKEN = Shape("token", ())
_U32 = Shape("u32", ())
_S32 = Shape("s32", ())
_PRED = Shape("pred", ())


def rule(*opcodes: str) -> Callable[[Rule], Rule]:
    """Register a shape rule `fn(inst, given) -> shape` for opcodes."""

    def register(fn: Rule) -> Rule:
        for op in opcodes:
            INFERENCE_RULES[op] = fn
        return fn

    return register


def rule_for(opcode: str) -> Rule | None:
    """The rule of an opcode (async sugar such as `reduce-scatter-start` included), or None."""
    fn = INFERENCE_RULES.get(opcode)
    if fn is None and async_base(opcode) is not None:
        fn = INFERENCE_RULES["<async-sugar" + opcode[opcode.rfind("-"):] + ">"]
    return fn


def expected_shape(inst: Instruction, given: AnyShape | None = None) -> AnyShape:
    """The shape `inst` must have; parts the operands do not determine come from `given`."""
    fn = rule_for(inst.opcode)
    if fn is None:
        raise ShapeInferenceError(f"no shape inference for opcode {inst.opcode!r}")
    for op in inst._operands:
        if op.shape is None:
            raise ShapeInferenceError(f"operand %{op.name} has no shape yet")
    try:
        return fn(inst, given)
    except ShapeInferenceError:
        raise
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, ZeroDivisionError) as e:
        raise ShapeInferenceError(f"{inst.opcode}: malformed instruction ({type(e).__name__}: {e})") from None


def infer_shape(inst: Instruction) -> AnyShape:
    """The shape `inst` must have, from its operands and attributes alone.

    Raises ShapeInferenceError when they do not determine it (convert needs its result type, ...).
    """
    return expected_shape(inst, None)


def check_shape(inst: Instruction) -> str | None:
    """What is wrong with `inst.shape` given its operands and attributes, or None if it is right."""
    if inst.shape is None:
        return "instruction has no shape"
    try:
        expected = expected_shape(inst, inst.shape)
    except ShapeInferenceError as e:
        return str(e)
    if not shapes_compatible(expected, inst.shape):
        return f"shape {_text(inst.shape)} does not match the inferred {_text(expected)}"
    return None


def shapes_compatible(a: AnyShape, b: AnyShape) -> bool:
    """Same tuple structure, element types and dimensions (layouts and dynamic markers ignored)."""
    if a.is_tuple or b.is_tuple:
        return (a.is_tuple and b.is_tuple and len(a.elements) == len(b.elements)
                and all(shapes_compatible(x, y) for x, y in zip(a.elements, b.elements, strict=True)))
    return a.dtype == b.dtype and a.dims == b.dims


# ----------------------------------------------------------------------------- helpers


def _text(shape: AnyShape) -> str:
    return shape.to_text(layout=False)


def _err(inst: Any, message: str) -> ShapeInferenceError:
    return ShapeInferenceError(f"{inst.opcode}: {message}")


def _shape(dtype: str, dims: Iterable[int], dynamic: Iterable[bool] = ()) -> Shape:
    dims = tuple(dims)
    dyn = tuple(dynamic)
    return Shape(dtype, dims, dyn if any(dyn) and len(dyn) == len(dims) else ())


def _dyn(s: Shape, i: int) -> bool:
    return bool(s.dynamic) and s.dynamic[i]


def _tuple_or_single(shapes: Sequence[AnyShape]) -> AnyShape:
    return shapes[0] if len(shapes) == 1 else TupleShape(tuple(shapes))


def _count(inst: Any, n: int) -> None:
    if inst.operand_count != n:
        raise _err(inst, f"takes {n} operand(s), got {inst.operand_count}")


def _at_least(inst: Any, n: int) -> None:
    if inst.operand_count < n:
        raise _err(inst, f"takes at least {n} operand(s), got {inst.operand_count}")


def _any(inst: Any, i: int) -> AnyShape:
    if i >= inst.operand_count:
        raise _err(inst, f"operand {i} is missing")
    return inst.operand(i).shape


def _arr(inst: Any, i: int) -> Shape:
    s = _any(inst, i)
    if s.is_tuple or not s.is_array:
        raise _err(inst, f"operand {i} must be an array, got {_text(s)}")
    return s


def _scalar(inst: Any, i: int) -> Shape:
    s = _arr(inst, i)
    if s.rank:
        raise _err(inst, f"operand {i} must be a scalar, got {_text(s)}")
    return s


def _tuple(inst: Any, i: int, min_len: int = 0) -> TupleShape:
    s = _any(inst, i)
    if not s.is_tuple or len(s.elements) < min_len:
        raise _err(inst, f"operand {i} must be a tuple of at least {min_len} element(s), got {_text(s)}")
    return s


def _result(inst: Any, given: AnyShape | None) -> AnyShape:
    if given is None:
        raise _err(inst, "the result shape cannot be inferred; write it")
    return given


def _result_array(inst: Any, given: AnyShape | None) -> Shape:
    s = _result(inst, given)
    if s.is_tuple or not s.is_array:
        raise _err(inst, f"the result must be an array, got {_text(s)}")
    return s


def _result_tuple(inst: Any, given: AnyShape | None, min_len: int) -> TupleShape:
    s = _result(inst, given)
    if not s.is_tuple or len(s.elements) < min_len:
        raise _err(inst, f"the result must be a tuple of at least {min_len} element(s), got {_text(s)}")
    return s


def _attr(inst: Any, key: str, default: Any = None) -> Any:
    value = inst.attrs.get(key, default)
    if value is None:
        raise _err(inst, f"attribute {key} is missing")
    return value


def _int(inst: Any, key: str, default: int | None = None) -> int:
    value = _attr(inst, key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            return int(str(value))
        except ValueError:
            raise _err(inst, f"attribute {key} must be an integer, got {value!r}") from None
    return value


def _ints(inst: Any, key: str, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
    value = _attr(inst, key, default)
    if not isinstance(value, tuple) or not all(isinstance(v, int) for v in value):
        raise _err(inst, f"attribute {key} must be a list of integers, got {value!r}")
    return value


def _one(inst: Any, key: str) -> int:
    dims = _ints(inst, key)
    if len(dims) != 1:
        raise _err(inst, f"attribute {key} must hold one dimension, got {list(dims)}")
    return dims[0]


def _flag(inst: Any, key: str) -> bool:
    value = inst.attrs.get(key, False)
    return value is True or str(value) == "true"


def _dim(inst: Any, d: int, rank: int, what: str = "dimension") -> int:
    if not 0 <= d < rank:
        raise _err(inst, f"{what} {d} is out of range for rank {rank}")
    return d


def _dims_in_range(inst: Any, dims: Sequence[int], rank: int, what: str) -> None:
    for d in dims:
        _dim(inst, d, rank, what)
    if len(set(dims)) != len(dims):
        raise _err(inst, f"{what}s {list(dims)} repeat a dimension")


def _kind(dtype: str) -> str:
    return DTYPES[dtype].kind


def _same_dims(inst: Any, a: Shape, b: Shape, what: str) -> None:
    if a.dims != b.dims:
        raise _err(inst, f"{what}: {_text(a)} vs {_text(b)}")


def _same_type(inst: Any, a: Shape, b: Shape, what: str) -> None:
    if a.dtype != b.dtype:
        raise _err(inst, f"{what}: {_text(a)} vs {_text(b)}")


def _root(inst: Any, comp: Any, key: str) -> AnyShape:
    if not isinstance(comp, Computation) or comp.root is None or comp.root.shape is None:
        raise _err(inst, f"needs a resolved {key} computation")
    return comp.root.shape


# ----------------------------------------------------------------------------- elementwise

_FLOAT_ONLY = frozenset({"floor", "ceil", "round-nearest-afz", "round-nearest-even"})
_FLOAT_OR_COMPLEX = frozenset({"cosine", "sine", "tan", "exponential", "exponential-minus-one", "log",
                               "log-plus-one", "logistic", "rsqrt", "sqrt", "cbrt", "tanh", "erf", "acos", "acosh",
                               "asin", "asinh", "atanh", "cosh", "sinh"})
_INTEGRAL_ONLY = frozenset({"count-leading-zeros", "popcnt"})
_COMPONENT = {"c64": "f32", "c128": "f64"}


def _unary_type_error(op: str, dtype: str) -> str | None:
    kind = _kind(dtype)
    if op in _FLOAT_ONLY and kind != "float":
        return "a floating-point"
    if op in _FLOAT_OR_COMPLEX and kind not in ("float", "complex"):
        return "a floating-point or complex"
    if op in _INTEGRAL_ONLY and kind not in ("sint", "uint"):
        return "an integral"
    if op == "not" and kind not in ("pred", "sint", "uint"):
        return "a pred or integral"
    if op in ("negate", "sign") and kind not in ("sint", "uint", "float", "complex"):
        return "a numeric"
    return None


@rule("acos", "acosh", "asin", "asinh", "atanh", "cbrt", "ceil", "cosh", "count-leading-zeros", "cosine", "erf",
      "exponential", "exponential-minus-one", "floor", "log", "log-plus-one", "logistic", "negate", "not", "popcnt",
      "round-nearest-afz", "round-nearest-even", "rsqrt", "sign", "sine", "sinh", "sqrt", "tan", "tanh")
def _unary(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    need = _unary_type_error(inst.opcode, s.dtype)
    if need:
        raise _err(inst, f"needs {need} operand, got {_text(s)}")
    return s


@rule("copy", "domain", "opt-barrier")
def _identity(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    return _any(inst, 0)


@rule("abs")
def _abs(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    if _kind(s.dtype) == "complex":
        return s.with_dtype(_COMPONENT[s.dtype])
    if _kind(s.dtype) not in ("sint", "float"):
        raise _err(inst, f"needs a signed or complex operand, got {_text(s)}")
    return s


@rule("real", "imag")
def _real_imag(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    if _kind(s.dtype) == "complex":
        return s.with_dtype(_COMPONENT[s.dtype])
    if _kind(s.dtype) != "float":
        raise _err(inst, f"needs a floating-point or complex operand, got {_text(s)}")
    return s


@rule("is-finite")
def _is_finite(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    if _kind(s.dtype) != "float":
        raise _err(inst, f"needs a floating-point operand, got {_text(s)}")
    return s.with_dtype("pred")


@rule("reduce-precision")
def _reduce_precision(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    if _kind(s.dtype) != "float":
        raise _err(inst, f"needs a floating-point operand, got {_text(s)}")
    if _int(inst, "exponent_bits") < 1 or _int(inst, "mantissa_bits") < 0:
        raise _err(inst, "needs exponent_bits >= 1 and mantissa_bits >= 0")
    return s


@rule("convert")
def _convert(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    return s.with_dtype(_result_array(inst, given).dtype)


@rule("bitcast-convert")
def _bitcast_convert(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    to = _result_array(inst, given).dtype
    if (_kind(s.dtype) == "complex") != (_kind(to) == "complex"):
        raise _err(inst, f"cannot bitcast between complex and real types ({s.dtype} -> {to})")
    a, b = DTYPES[s.dtype].bits, DTYPES[to].bits
    if a == b:
        return s.with_dtype(to)
    if max(a, b) % min(a, b):
        raise _err(inst, f"bit widths {a} and {b} do not divide")
    if a > b:
        return _shape(to, s.dims + (a // b,))
    if not s.rank or s.dims[-1] != b // a:
        raise _err(inst, f"the last dimension of {_text(s)} must be {b // a} to bitcast to {to}")
    return _shape(to, s.dims[:-1])


@rule("stochastic-convert")
def _stochastic_convert(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 2)
    s, r = _arr(inst, 0), _arr(inst, 1)
    if _kind(s.dtype) != "float" or _kind(r.dtype) != "uint":
        raise _err(inst, f"needs a floating-point operand and unsigned random bits, got {_text(s)}, {_text(r)}")
    if DTYPES[s.dtype].bits != DTYPES[r.dtype].bits:
        raise _err(inst, f"random bits {r.dtype} must be as wide as {s.dtype}")
    _same_dims(inst, s, r, "operand and random bits differ")
    return s.with_dtype(_result_array(inst, given).dtype)


_ARITHMETIC = frozenset({"subtract", "atan2", "power", "divide", "remainder", "shift-left",
                         "shift-right-arithmetic", "shift-right-logical"})


def _binary_operands(inst: Instruction) -> Shape:
    _count(inst, 2)
    a, b = _arr(inst, 0), _arr(inst, 1)
    _same_dims(inst, a, b, "operands differ (implicit broadcast is not allowed in HLO)")
    _same_type(inst, a, b, "operands have different element types")
    return a


@rule("add", "maximum", "minimum", "multiply", "subtract", "atan2", "power", "divide", "remainder",
      "shift-left", "shift-right-arithmetic", "shift-right-logical", "and", "or", "xor", "mulhi")
def _binary(inst: Instruction, given: AnyShape | None) -> AnyShape:
    a = _binary_operands(inst)
    kind = _kind(a.dtype)
    if inst.opcode == "mulhi" and kind not in ("sint", "uint"):
        raise _err(inst, f"needs integral operands, got {_text(a)}")
    if inst.opcode in _ARITHMETIC and kind == "pred":
        raise _err(inst, f"needs an arithmetic type, got {_text(a)}")
    if inst.opcode in ("and", "or", "xor") and kind not in ("pred", "sint", "uint"):
        raise _err(inst, f"needs pred or integral operands, got {_text(a)}")
    return _shape(a.dtype, a.dims, _merge_dynamic(a, _arr(inst, 1)))


def _merge_dynamic(a: Shape, b: Shape) -> tuple[bool, ...]:
    if not a.dynamic and not b.dynamic:
        return ()
    return tuple(_dyn(a, i) or _dyn(b, i) for i in range(a.rank))


_COMPARE_TYPES = {"float": ("FLOAT", "TOTALORDER"), "sint": ("SIGNED",), "uint": ("UNSIGNED",),
                  "pred": ("UNSIGNED",)}


@rule("compare")
def _compare(inst: Instruction, given: AnyShape | None) -> AnyShape:
    a = _binary_operands(inst)
    if "direction" not in inst.attrs:
        raise _err(inst, "attribute direction is missing")
    ctype = inst.attrs.get("type")
    allowed = _COMPARE_TYPES.get(_kind(a.dtype))
    if ctype is not None and allowed is not None and str(ctype) not in allowed:
        raise _err(inst, f"comparison type {ctype} does not suit {a.dtype} operands")
    return _shape("pred", a.dims, _merge_dynamic(a, _arr(inst, 1)))


@rule("complex")
def _complex(inst: Instruction, given: AnyShape | None) -> AnyShape:
    a = _binary_operands(inst)
    if a.dtype not in ("f32", "f64"):
        raise _err(inst, f"needs f32 or f64 operands, got {_text(a)}")
    return a.with_dtype({"f32": "c64", "f64": "c128"}[a.dtype])


@rule("select")
def _select(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 3)
    p, t, f = _arr(inst, 0), _arr(inst, 1), _arr(inst, 2)
    if p.dtype != "pred":
        raise _err(inst, f"the predicate must be pred, got {_text(p)}")
    _same_dims(inst, t, f, "on_true and on_false differ")
    _same_type(inst, t, f, "on_true and on_false have different element types")
    _same_dims(inst, p, t, "the predicate and the operands differ")
    return t


@rule("clamp")
def _clamp(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 3)
    lo, x, hi = _arr(inst, 0), _arr(inst, 1), _arr(inst, 2)
    for bound, what in ((lo, "min"), (hi, "max")):
        _same_type(inst, bound, x, f"{what} and operand have different element types")
        if bound.rank and bound.dims != x.dims:
            raise _err(inst, f"{what} {_text(bound)} must be a scalar or shaped like the operand {_text(x)}")
    return x


@rule("map")
def _map(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _at_least(inst, 1)
    first = _arr(inst, 0)
    for i in range(1, inst.operand_count):
        _same_dims(inst, first, _arr(inst, i), "operands differ")
    out = _root(inst, inst.attrs.get("to_apply"), "to_apply")
    if out.is_tuple or out.rank:
        raise _err(inst, f"to_apply must return a scalar, returns {_text(out)}")
    return _shape(out.dtype, first.dims, first.dynamic)


# ----------------------------------------------------------------------------- shape changes


@rule("broadcast")
def _broadcast(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    out = _result_array(inst, given)
    dims = _ints(inst, "dimensions", ())
    if len(dims) != s.rank:
        raise _err(inst, f"dimensions={{{','.join(map(str, dims))}}} must list one output dimension per "
                         f"operand dimension of {_text(s)}")
    for i, d in enumerate(dims):
        _dim(inst, d, out.rank, "broadcast dimension")
        if out.dims[d] != s.dims[i]:
            raise _err(inst, f"operand dimension {i} ({s.dims[i]}) maps to output dimension {d} of size "
                             f"{out.dims[d]}")
    return _shape(s.dtype, out.dims, out.dynamic)


@rule("reshape")
def _reshape(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    out = _result_array(inst, given)
    if s.numel != out.numel and min(s.dims + out.dims, default=0) >= 0:
        raise _err(inst, f"cannot reshape {_text(s)} ({s.numel} elements) to {_text(out)} ({out.numel})")
    return _shape(s.dtype, out.dims, out.dynamic)


@rule("dynamic-reshape")
def _dynamic_reshape(inst: Instruction, given: AnyShape | None) -> AnyShape:
    s = _arr(inst, 0)
    out = _result_array(inst, given)
    _count(inst, out.rank + 1)
    for i in range(1, inst.operand_count):
        if _scalar(inst, i).dtype != "s32":
            raise _err(inst, f"dimension size operand {i} must be s32[]")
    return _shape(s.dtype, out.dims, out.dynamic)


@rule("bitcast")
def _bitcast(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _any(inst, 0)
    out = _result(inst, given)
    if not s.is_tuple and not out.is_tuple and _plain(s) and _plain(out):
        a, b = s.numel * DTYPES[s.dtype].bits, out.numel * DTYPES[out.dtype].bits
        if a != b and min(s.dims + out.dims, default=0) >= 0:
            raise _err(inst, f"cannot bitcast {_text(s)} ({a} bits) to {_text(out)} ({b} bits)")
    return out


def _plain(s: Shape) -> bool:
    lay = s.layout
    return lay is None or not (lay.tiles or lay.element_size_bits)


@rule("transpose")
def _transpose(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    perm = _ints(inst, "dimensions")
    if sorted(perm) != list(range(s.rank)):
        raise _err(inst, f"dimensions {list(perm)} are not a permutation of the dimensions of {_text(s)}")
    layout = None  # like XLA: the operand's (default) layout permuted, so a transpose is a relabeling
    m2m = s.layout.minor_to_major if s.layout is not None else tuple(range(s.rank - 1, -1, -1))
    if len(m2m) == s.rank and (s.layout is None or not s.layout.tiles):
        inverse = {d: i for i, d in enumerate(perm)}
        layout = Layout(tuple(inverse[d] for d in m2m))
    return Shape(s.dtype, tuple(s.dims[p] for p in perm),
                 tuple(_dyn(s, p) for p in perm) if s.dynamic else (), layout)


@rule("reverse")
def _reverse(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    _dims_in_range(inst, _ints(inst, "dimensions", ()), s.rank, "reverse dimension")
    return s


@rule("slice")
def _slice(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    spec = _attr(inst, "slice")
    if not isinstance(spec, tuple) or len(spec) != s.rank:
        raise _err(inst, f"slice={spec!r} must give one [start:limit:stride] per dimension of {_text(s)}")
    dims = []
    for i, (start, limit, stride) in enumerate(spec):
        if not 0 <= start <= limit <= s.dims[i] or stride <= 0:
            raise _err(inst, f"slice [{start}:{limit}:{stride}] is out of bounds for dimension {i} of {_text(s)}")
        dims.append((limit - start + stride - 1) // stride)
    return _shape(s.dtype, dims, (_dyn(s, i) and d != 1 for i, d in enumerate(dims)))


def _index_operands(inst: Instruction, first: int, rank: int) -> None:
    """Start indices from operand `first` on: one integral scalar per dimension (or one rank-1 vector)."""
    n = inst.operand_count - first
    if n == 1 and _arr(inst, first).rank == 1:
        idx = _arr(inst, first)
        if idx.dims[0] != rank or _kind(idx.dtype) not in ("sint", "uint"):
            raise _err(inst, f"start indices {_text(idx)} must be {rank} integers")
        return
    if n != rank:
        raise _err(inst, f"needs {rank} start index operand(s), got {n}")
    types = {_scalar(inst, i).dtype for i in range(first, inst.operand_count)}
    if len(types) > 1 or any(_kind(t) not in ("sint", "uint") for t in types):
        raise _err(inst, f"start indices must be integral scalars of one type, got {sorted(types)}")


@rule("dynamic-slice")
def _dynamic_slice(inst: Instruction, given: AnyShape | None) -> AnyShape:
    s = _arr(inst, 0)
    _index_operands(inst, 1, s.rank)
    sizes = _ints(inst, "dynamic_slice_sizes")
    if len(sizes) != s.rank:
        raise _err(inst, f"dynamic_slice_sizes {list(sizes)} must have one size per dimension of {_text(s)}")
    for i, n in enumerate(sizes):
        if not 0 <= n <= s.dims[i]:
            raise _err(inst, f"slice size {n} does not fit dimension {i} of {_text(s)}")
    return _shape(s.dtype, sizes)


@rule("dynamic-update-slice")
def _dynamic_update_slice(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _at_least(inst, 2)
    s, u = _arr(inst, 0), _arr(inst, 1)
    _index_operands(inst, 2, s.rank)
    _same_type(inst, s, u, "operand and update have different element types")
    if u.rank != s.rank or any(b > a for a, b in zip(s.dims, u.dims, strict=True)):
        raise _err(inst, f"update {_text(u)} does not fit in {_text(s)}")
    return s


@rule("pad")
def _pad(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 2)
    s, v = _arr(inst, 0), _scalar(inst, 1)
    _same_type(inst, s, v, "operand and padding value have different element types")
    config = _attr(inst, "padding")
    dims_cfg = getattr(config, "dims", None)
    if dims_cfg is None or len(dims_cfg) != s.rank:
        raise _err(inst, f"padding must have one entry per dimension of {_text(s)}")
    dims = []
    for i, (lo, hi, interior) in enumerate(dims_cfg):
        d = s.dims[i]
        n = lo + hi + d + max(d - 1, 0) * interior
        if interior < 0 or n < 0:
            raise _err(inst, f"padding {lo}_{hi}_{interior} is invalid for dimension {i} of {_text(s)}")
        dims.append(n)
    return _shape(s.dtype, dims, s.dynamic)


@rule("concatenate")
def _concatenate(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _at_least(inst, 1)
    first = _arr(inst, 0)
    d = _dim(inst, _one(inst, "dimensions"), first.rank, "concatenate dimension")
    total = 0
    for i in range(inst.operand_count):
        s = _arr(inst, i)
        _same_type(inst, first, s, "operands have different element types")
        if s.rank != first.rank or any(a != b for j, (a, b) in enumerate(zip(s.dims, first.dims, strict=True))
                                       if j != d):
            raise _err(inst, f"operand {i} {_text(s)} differs from {_text(first)} outside dimension {d}")
        total += s.dims[d]
    return _shape(first.dtype, first.dims[:d] + (total,) + first.dims[d + 1:])


@rule("iota")
def _iota(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 0)
    out = _result_array(inst, given)
    if not out.rank:
        raise _err(inst, "iota does not support scalars")
    _dim(inst, _int(inst, "iota_dimension"), out.rank, "iota_dimension")
    if _kind(out.dtype) not in ("sint", "uint", "float", "complex"):
        raise _err(inst, f"cannot produce {out.dtype}")
    return out


@rule("get-dimension-size")
def _get_dimension_size(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    _dim(inst, _one(inst, "dimensions"), s.rank)
    return _S32


@rule("set-dimension-size")
def _set_dimension_size(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 2)
    s = _arr(inst, 0)
    if _scalar(inst, 1).dtype != "s32":
        raise _err(inst, "the size operand must be s32[]")
    d = _dim(inst, _one(inst, "dimensions"), s.rank)
    return _shape(s.dtype, s.dims, (i == d or _dyn(s, i) for i in range(s.rank)))


# ----------------------------------------------------------------------------- tuples, control flow, calls


@rule("tuple")
def _tuple_rule(inst: Instruction, given: AnyShape | None) -> AnyShape:
    return TupleShape(tuple(op.shape for op in inst.operands))


@rule("get-tuple-element")
def _gte(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _any(inst, 0)
    index = inst.attrs.get("index")
    if not s.is_tuple or not isinstance(index, int) or not 0 <= index < len(s.elements):
        raise _err(inst, f"index {index} is out of range for {_text(s)}")
    return s.elements[index]


@rule("call")
def _call(inst: Instruction, given: AnyShape | None) -> AnyShape:
    return _root(inst, inst.attrs.get("to_apply"), "to_apply")


@rule("fusion")
def _fusion(inst: Instruction, given: AnyShape | None) -> AnyShape:
    return _root(inst, inst.attrs.get("calls"), "calls")


@rule("while")
def _while(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    return _any(inst, 0)


def conditional_branches(inst: Instruction) -> list[Computation]:
    """The branch computations of a conditional, in branch order."""
    branches = inst.attrs.get("branch_computations")
    if branches:
        return list(branches)
    return [c for c in (inst.attrs.get("true_computation"), inst.attrs.get("false_computation")) if c is not None]


@rule("conditional")
def _conditional(inst: Instruction, given: AnyShape | None) -> AnyShape:
    branches = conditional_branches(inst)
    if not branches:
        raise _err(inst, "needs its branch computations")
    _count(inst, len(branches) + 1)
    index = _scalar(inst, 0)
    if index.dtype == "pred" and len(branches) != 2:
        raise _err(inst, f"a pred-indexed conditional has 2 branches, not {len(branches)}")
    if index.dtype not in ("pred", "s32"):
        raise _err(inst, f"the branch index must be pred[] or s32[], got {_text(index)}")
    return _root(inst, branches[0], "branch")


@rule("custom-call", "parameter", "constant", "scan")
def _as_written(inst: Instruction, given: AnyShape | None) -> AnyShape:
    return _result(inst, given)


@rule("after-all")
def _after_all(inst: Instruction, given: AnyShape | None) -> AnyShape:
    for i in range(inst.operand_count):
        if not shapes_compatible(_any(inst, i), _TOKEN):
            raise _err(inst, f"operand {i} must be a token")
    return _TOKEN


@rule("add-dependency")
def _add_dependency(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 2)
    if not shapes_compatible(_any(inst, 1), _TOKEN):
        raise _err(inst, "operand 1 must be a token")
    return _any(inst, 0)


@rule("partition-id", "replica-id")
def _ids(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 0)
    return _U32


@rule("rng-get-and-update-state")
def _rng_state(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 0)
    return Shape("u64", (2,))


@rule("rng")
def _rng(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 2)
    a, b = _scalar(inst, 0), _scalar(inst, 1)
    _same_type(inst, a, b, "bounds have different element types")
    out = _result_array(inst, given)
    return _shape(a.dtype, out.dims)


@rule("rng-bit-generator")
def _rng_bit_generator(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    state = _arr(inst, 0)
    out = _result_tuple(inst, given, 2)
    if len(out.elements) != 2:
        raise _err(inst, f"the result must be (state, bits), got {_text(out)}")
    return TupleShape((state, out.elements[1]))


@rule("infeed")
def _infeed(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    _token_operand(inst, 0)
    out = _result_tuple(inst, given, 2)
    return TupleShape((out.elements[0], _TOKEN))


@rule("outfeed")
def _outfeed(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 2)
    _token_operand(inst, 1)
    return _TOKEN


def _token_operand(inst: Any, i: int) -> None:
    if not shapes_compatible(_any(inst, i), _TOKEN):
        raise _err(inst, f"operand {i} must be a token, got {_text(_any(inst, i))}")


@rule("send")
def _send(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 2)
    _token_operand(inst, 1)
    return TupleShape((_any(inst, 0), _U32, _TOKEN))


@rule("recv")
def _recv(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    _token_operand(inst, 0)
    out = _result_tuple(inst, given, 3)
    return TupleShape((out.elements[0], _U32, _TOKEN))


@rule("send-done")
def _send_done(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    _tuple(inst, 0, 3)
    return _TOKEN


@rule("recv-done")
def _recv_done(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    return TupleShape((_tuple(inst, 0, 3).elements[0], _TOKEN))


# ----------------------------------------------------------------------------- async


def _context(given: AnyShape | None, default: tuple[AnyShape, ...]) -> tuple[AnyShape, ...]:
    if given is not None and given.is_tuple and len(given.elements) >= 2:
        return tuple(given.elements[2:])
    return default


@rule("async-start")
def _async_start(inst: Instruction, given: AnyShape | None) -> AnyShape:
    wrapped = _root(inst, inst.attrs.get("calls"), "calls")
    operands = TupleShape(tuple(op.shape for op in inst.operands))
    return TupleShape((operands, wrapped) + _context(given, (_S32,)))


class _Wrapped:
    """An async-sugar instruction (`all-to-all-start`, `call-start`, ...) seen as the op it wraps."""

    __slots__ = ("opcode", "_inst")

    def __init__(self, inst: Instruction, opcode: str):
        self.opcode = opcode
        self._inst = inst

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inst, name)


@rule("<async-sugar-start>")
def _async_sugar_start(inst: Instruction, given: AnyShape | None) -> AnyShape:
    base = async_base(inst.opcode)
    inner = given.elements[1] if given is not None and given.is_tuple and len(given.elements) >= 2 else None
    wrapped = INFERENCE_RULES[base](_Wrapped(inst, base), inner)
    operands = TupleShape(tuple(op.shape for op in inst.operands))
    return TupleShape((operands, wrapped) + _context(given, (_S32,)))


@rule("async-update", "<async-sugar-update>")
def _async_update(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    return _tuple(inst, 0, 2)


@rule("async-done", "<async-sugar-done>", "all-gather-done", "collective-permute-done")
def _async_done(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    return _tuple(inst, 0, 2).elements[1]


@rule("copy-start")
def _copy_start(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _any(inst, 0)
    return TupleShape((s, s) + _context(given, (_U32,)))


@rule("copy-done")
def _copy_done(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    return _tuple(inst, 0, 2).elements[0]


# ----------------------------------------------------------------------------- collectives


def _config_int(inst: Any, key: str) -> int:
    parent = inst.parent
    module = parent.module if parent is not None else None
    value = module.config.get(key, 1) if module is not None else 1
    try:
        return int(str(value))
    except ValueError:
        return 1


def _listed_group_size(inst: Any) -> int | None:
    """The size of the first replica group written on the instruction (None for `{}` or none)."""
    groups = inst.attrs.get("replica_groups")
    if groups is None or not hasattr(groups, "explicit"):
        return None
    listed = groups.groups() if groups.explicit is None else groups.explicit
    return len(listed[0]) if listed else None


def _group_size(inst: Any, use_global_ids: bool | None) -> int:
    """The participant count of a collective, like XLA's GetSubgroupSize (1 when the config is unknown)."""
    first = _listed_group_size(inst)
    has_channel = inst.attrs.get("channel_id") is not None
    if has_channel and use_global_ids:
        return first or 1
    if has_channel and use_global_ids is None:
        return first or _config_int(inst, "num_partitions")
    size = first or _config_int(inst, "replica_count")
    return size * _config_int(inst, "num_partitions") if has_channel else size


def _use_global_ids(inst: Any) -> bool:
    return _flag(inst, "use_global_device_ids")


def _operand_arrays(inst: Any) -> list[Shape]:
    _at_least(inst, 1)
    return [_arr(inst, i) for i in range(inst.operand_count)]


@rule("all-reduce", "all-reduce-start", "collective-broadcast")
def _all_reduce(inst: Instruction, given: AnyShape | None) -> AnyShape:
    return _tuple_or_single(_operand_arrays(inst))


@rule("all-reduce-done")
def _all_reduce_done(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    return _any(inst, 0)


def _collective_dim(inst: Any, operands: list[Shape]) -> int:
    d = _one(inst, "dimensions")
    for s in operands:
        _dim(inst, d, s.rank)
    return d


def _given_parts(given: AnyShape | None, n: int) -> list[Shape | None]:
    if given is None:
        return [None] * n
    if n == 1:
        return [given if not given.is_tuple else None]
    if given.is_tuple and len(given.elements) == n:
        return [e if not e.is_tuple else None for e in given.elements]
    return [None] * n


def _shard_count(inst: Any, big: int, small: int | None) -> int:
    """Participants of an all-gather/reduce-scatter: from the written result when there is one."""
    size = _group_size(inst, _use_global_ids(inst))
    if small is None:
        if _listed_group_size(inst) is None:
            raise _err(inst, "the group size is unknown; write the result shape")
        return size
    shards = -(-big // small) if small else size
    if size != 1 and shards != size:
        raise _err(inst, f"the shapes imply {shards} participants but the groups have {size}")
    return shards


def _all_gather_outputs(inst: Any, given: AnyShape | None) -> list[Shape]:
    ops = _operand_arrays(inst)
    d = _collective_dim(inst, ops)
    parts = _given_parts(given, len(ops))
    g = parts[0]
    shards = _shard_count(inst, g.dims[d] if g is not None and g.rank > d else 0,
                          ops[0].dims[d] if g is not None and g.rank > d else None)
    return [_shape(s.dtype, s.dims[:d] + (s.dims[d] * shards,) + s.dims[d + 1:]) for s in ops]


@rule("all-gather")
def _all_gather(inst: Instruction, given: AnyShape | None) -> AnyShape:
    return _tuple_or_single(_all_gather_outputs(inst, given))


@rule("all-gather-start")
def _all_gather_start(inst: Instruction, given: AnyShape | None) -> AnyShape:
    inner = given.elements[1] if given is not None and given.is_tuple and len(given.elements) == 2 else None
    outs = _all_gather_outputs(inst, inner)
    ins = [op.shape for op in inst.operands]
    return TupleShape((_tuple_or_single(ins), _tuple_or_single(outs)))


@rule("reduce-scatter")
def _reduce_scatter(inst: Instruction, given: AnyShape | None) -> AnyShape:
    ops = _operand_arrays(inst)
    d = _collective_dim(inst, ops)
    g = _given_parts(given, len(ops))[0]
    shards = _shard_count(inst, ops[0].dims[d], g.dims[d] if g is not None and g.rank > d else None)
    outs = []
    for s in ops:
        if shards <= 0 or s.dims[d] % shards:
            raise _err(inst, f"dimension {d} of {_text(s)} does not split into {shards} shards")
        outs.append(_shape(s.dtype, s.dims[:d] + (s.dims[d] // shards,) + s.dims[d + 1:]))
    return _tuple_or_single(outs)


@rule("all-to-all")
def _all_to_all(inst: Instruction, given: AnyShape | None) -> AnyShape:
    ops = _operand_arrays(inst)
    split = inst.attrs.get("dimensions")
    if split:
        _count(inst, 1)
        d = _collective_dim(inst, ops)
        n = _group_size(inst, None)
        if n and ops[0].dims[d] % n:
            raise _err(inst, f"dimension {d} of {_text(ops[0])} does not split into {n} parts")
        return ops[0]
    if _listed_group_size(inst) is not None:
        n = _group_size(inst, None)
        if n != len(ops):
            raise _err(inst, f"a tuple all-to-all takes one operand per participant ({n}), got {len(ops)}")
    return TupleShape(tuple(ops))


@rule("ragged-all-to-all")
def _ragged_all_to_all(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 6)
    ref = _arr(inst, 2)
    for i in range(2, 6):
        s = _arr(inst, i)
        if s.rank not in (1, 2) or not shapes_compatible(s, ref):
            raise _err(inst, f"offset/size operand {i} {_text(s)} must be rank 1 or 2 and match operand 2")
    return _arr(inst, 1)


def _permute_result(inst: Any) -> AnyShape:
    """The in-place form (input, output, input offsets, output offsets) returns the output buffer."""
    if inst.operand_count == 4 and ("slice_sizes" in inst.attrs or _any(inst, 2).is_tuple):
        return _any(inst, 1)
    return _tuple_or_single([_any(inst, i) for i in range(inst.operand_count)])


@rule("collective-permute")
def _collective_permute(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _at_least(inst, 1)
    return _permute_result(inst)


@rule("collective-permute-start")
def _collective_permute_start(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _at_least(inst, 1)
    out = _permute_result(inst)
    source = _any(inst, 0) if inst.operand_count in (1, 4) else out
    return TupleShape((source, out) + _context(given, (_U32, _U32)))


# ----------------------------------------------------------------------------- reductions, windows


def _scalar_result_types(inst: Any, comp: Any, n: int, fallback: list[str]) -> list[str]:
    """Element types a reducer returns (its root), else the fallback (init value types)."""
    if not isinstance(comp, Computation) or comp.root is None or comp.root.shape is None:
        return fallback
    root = comp.root.shape
    leaves = list(root.elements) if root.is_tuple else [root]
    if len(leaves) != n or any(x.is_tuple or x.rank for x in leaves):
        return fallback  # the verifier's signature check reports the reducer
    return [x.dtype for x in leaves]


def _split_inputs_inits(inst: Any) -> tuple[list[Shape], list[Shape]]:
    if inst.operand_count < 2 or inst.operand_count % 2:
        raise _err(inst, f"takes inputs and as many init values, got {inst.operand_count} operand(s)")
    n = inst.operand_count // 2
    inputs = [_arr(inst, i) for i in range(n)]
    inits = [_scalar(inst, n + i) for i in range(n)]
    for i, s in enumerate(inputs[1:], 1):
        _same_dims(inst, inputs[0], s, f"input {i} differs from input 0")
    return inputs, inits


@rule("reduce")
def _reduce(inst: Instruction, given: AnyShape | None) -> AnyShape:
    inputs, inits = _split_inputs_inits(inst)
    dims = _ints(inst, "dimensions", ())
    first = inputs[0]
    _dims_in_range(inst, dims, first.rank, "reduced dimension")
    keep = [i for i in range(first.rank) if i not in dims]
    types = _scalar_result_types(inst, inst.attrs.get("to_apply"), len(inputs), [s.dtype for s in inits])
    outs = [_shape(t, (first.dims[i] for i in keep), (_dyn(first, i) for i in keep)) for t in types]
    return _tuple_or_single(outs)


def _window_output(inst: Any, dims: Sequence[int], window: Any) -> list[int]:
    wdims = getattr(window, "dims", None)
    if wdims is None or len(wdims) != len(dims):
        raise _err(inst, f"window {window} must have {len(dims)} dimension(s)")
    return [_window_dim(inst, d, w) for d, w in zip(dims, wdims, strict=True)]


def _window_dim(inst: Any, d: int, w: WindowDim) -> int:
    if w.size <= 0 or w.stride <= 0 or w.lhs_dilate < 1 or w.rhs_dilate < 1:
        raise _err(inst, f"window dimension {w} has a non-positive size, stride or dilation")
    base = 0 if d == 0 else (d - 1) * w.lhs_dilate + 1
    padded = base + w.pad_low + w.pad_high
    span = (w.size - 1) * w.rhs_dilate + 1
    return 0 if padded < span else (padded - span) // w.stride + 1


@rule("reduce-window")
def _reduce_window(inst: Instruction, given: AnyShape | None) -> AnyShape:
    inputs, inits = _split_inputs_inits(inst)
    dims = _window_output(inst, inputs[0].dims, _attr(inst, "window"))
    types = _scalar_result_types(inst, inst.attrs.get("to_apply"), len(inputs), [s.dtype for s in inits])
    return _tuple_or_single([_shape(t, dims) for t in types])


@rule("select-and-scatter")
def _select_and_scatter(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 3)
    operand, source = _arr(inst, 0), _arr(inst, 1)
    init = _scalar(inst, 2)
    _same_type(inst, source, init, "source and init value have different element types")
    windowed = _window_output(inst, operand.dims, _attr(inst, "window"))
    if tuple(windowed) != source.dims:
        raise _err(inst, f"source {_text(source)} must have the windowed operand's dimensions {windowed}")
    return operand


@rule("sort")
def _sort(inst: Instruction, given: AnyShape | None) -> AnyShape:
    ops = _operand_arrays(inst)
    for i, s in enumerate(ops[1:], 1):
        _same_dims(inst, ops[0], s, f"operand {i} differs from operand 0")
    _dim(inst, _one(inst, "dimensions"), ops[0].rank, "sort dimension")
    return _tuple_or_single(ops)


@rule("topk")
def _topk(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    k = _int(inst, "k")
    if not s.rank or not 0 <= k <= s.dims[-1]:
        raise _err(inst, f"k={k} does not fit the last dimension of {_text(s)}")
    dims = s.dims[:-1] + (k,)
    return TupleShape((_shape(s.dtype, dims), _shape("s32", dims)))


# ----------------------------------------------------------------------------- gather and scatter


def _index_dims(inst: Any, indices: Shape, ivd: int) -> list[int]:
    if not 0 <= ivd <= indices.rank:
        raise _err(inst, f"index_vector_dim {ivd} is out of range for {_text(indices)}")
    if _kind(indices.dtype) not in ("sint", "uint"):
        raise _err(inst, f"indices must be integers, got {_text(indices)}")
    dims = list(indices.dims)
    if ivd == len(dims):
        dims.append(1)
    return dims


def _check_index_map(inst: Any, index_map: Sequence[int], vector_len: int, rank: int, what: str) -> None:
    if len(index_map) != vector_len:
        raise _err(inst, f"{what} has {len(index_map)} entries but the index vector has {vector_len}")
    _dims_in_range(inst, index_map, rank, what)


@rule("gather")
def _gather(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 2)
    operand, indices = _arr(inst, 0), _arr(inst, 1)
    ivd = _int(inst, "index_vector_dim", indices.rank)
    idx = _index_dims(inst, indices, ivd)
    offset_dims = _ints(inst, "offset_dims", ())
    collapsed = _ints(inst, "collapsed_slice_dims", ())
    batching = _ints(inst, "operand_batching_dims", ())
    sizes = _ints(inst, "slice_sizes")
    _check_index_map(inst, _ints(inst, "start_index_map"), idx[ivd], operand.rank, "start_index_map")
    if len(sizes) != operand.rank or any(not 0 <= n <= d for n, d in zip(sizes, operand.dims, strict=True)):
        raise _err(inst, f"slice_sizes {list(sizes)} do not fit {_text(operand)}")
    _dims_in_range(inst, collapsed + batching, operand.rank, "collapsed/batching dimension")
    if any(sizes[d] > 1 for d in collapsed + batching):
        raise _err(inst, "collapsed and batching dimensions must have slice size 0 or 1")
    if len(offset_dims) + len(collapsed) + len(batching) != operand.rank:
        raise _err(inst, "every operand dimension must be an offset, collapsed or batching dimension")
    window = [sizes[i] for i in range(operand.rank) if i not in collapsed and i not in batching]
    batch = [d for i, d in enumerate(idx) if i != ivd]
    rank = len(offset_dims) + len(batch)
    if list(offset_dims) != sorted(set(offset_dims)) or any(not 0 <= d < rank for d in offset_dims):
        raise _err(inst, f"offset_dims {list(offset_dims)} must be sorted, unique and below {rank}")
    win, bat = iter(window), iter(batch)
    return _shape(operand.dtype, [next(win) if i in offset_dims else next(bat) for i in range(rank)])


@rule("scatter")
def _scatter(inst: Instruction, given: AnyShape | None) -> AnyShape:
    if inst.operand_count < 3 or inst.operand_count % 2 == 0:
        raise _err(inst, f"takes N operands, indices and N updates, got {inst.operand_count} operand(s)")
    n = inst.operand_count // 2
    operands = [_arr(inst, i) for i in range(n)]
    indices = _arr(inst, n)
    updates = [_arr(inst, n + 1 + i) for i in range(n)]
    for i, s in enumerate(operands[1:], 1):
        _same_dims(inst, operands[0], s, f"operand {i} differs from operand 0")
    ivd = _int(inst, "index_vector_dim", indices.rank)
    idx = _index_dims(inst, indices, ivd)
    window_dims = _ints(inst, "update_window_dims", ())
    inserted = _ints(inst, "inserted_window_dims", ())
    batching = _ints(inst, "input_batching_dims", ())
    rank = operands[0].rank
    _check_index_map(inst, _ints(inst, "scatter_dims_to_operand_dims"), idx[ivd], rank,
                     "scatter_dims_to_operand_dims")
    _dims_in_range(inst, inserted + batching, rank, "inserted/batching dimension")
    if len(window_dims) + len(inserted) + len(batching) != rank:
        raise _err(inst, "every operand dimension must be an update window, inserted or batching dimension")
    scatter_dims = [d for i, d in enumerate(idx) if i != ivd]
    bounds = [operands[0].dims[i] for i in range(rank) if i not in inserted and i not in batching]
    for u in updates:
        _check_update(inst, u, window_dims, scatter_dims, bounds)
    return _tuple_or_single(operands)


def _check_update(inst: Any, u: Shape, window_dims: Sequence[int], scatter_dims: list[int],
                  bounds: list[int]) -> None:
    if u.rank != len(window_dims) + len(scatter_dims):
        raise _err(inst, f"updates {_text(u)} must have rank {len(window_dims) + len(scatter_dims)}")
    _dims_in_range(inst, window_dims, u.rank, "update window dimension")
    window = [u.dims[d] for d in window_dims]
    rest = [d for i, d in enumerate(u.dims) if i not in window_dims]
    if any(w > b for w, b in zip(window, bounds, strict=True)) or rest != scatter_dims:
        raise _err(inst, f"updates {_text(u)} do not match the indices {scatter_dims} and operand bounds {bounds}")


# ----------------------------------------------------------------------------- dot and convolution


def _dot_dims(inst: Any, lhs: Shape, rhs: Shape, rhs_skip: Sequence[int] = ()) -> list[int]:
    lb, rb = _ints(inst, "lhs_batch_dims", ()), _ints(inst, "rhs_batch_dims", ())
    lc, rc = _ints(inst, "lhs_contracting_dims", ()), _ints(inst, "rhs_contracting_dims", ())
    _dims_in_range(inst, lb + lc, lhs.rank, "lhs batch/contracting dimension")
    _dims_in_range(inst, tuple(rb) + tuple(rc) + tuple(rhs_skip), rhs.rank, "rhs batch/contracting dimension")
    if len(lb) != len(rb) or len(lc) != len(rc):
        raise _err(inst, "lhs and rhs need as many batch and contracting dimensions")
    for a, b, what in [(x, y, "batch") for x, y in zip(lb, rb, strict=True)] + \
                      [(x, y, "contracting") for x, y in zip(lc, rc, strict=True)]:
        if lhs.dims[a] != rhs.dims[b]:
            raise _err(inst, f"{what} dimension sizes differ: lhs {a} of {_text(lhs)} vs rhs {b} of {_text(rhs)}")
    lfree = [d for i, d in enumerate(lhs.dims) if i not in lb and i not in lc]
    rfree = [d for i, d in enumerate(rhs.dims) if i not in rb and i not in rc and i not in rhs_skip]
    return [lhs.dims[d] for d in lb] + lfree + rfree


def _dot_type(inst: Any, lhs: Shape, rhs: Shape, given: AnyShape | None) -> str:
    if given is not None and not given.is_tuple:
        return given.dtype
    if lhs.dtype != rhs.dtype:
        raise _err(inst, f"operand types differ ({lhs.dtype}, {rhs.dtype}); write the result type")
    return lhs.dtype


@rule("dot")
def _dot(inst: Instruction, given: AnyShape | None) -> AnyShape:
    if "sparsity" in inst.attrs:
        return _result(inst, given)
    _count(inst, 2)
    lhs, rhs = _arr(inst, 0), _arr(inst, 1)
    return _shape(_dot_type(inst, lhs, rhs, given), _dot_dims(inst, lhs, rhs))


@rule("scaled-dot")
def _scaled_dot(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _at_least(inst, 2)
    lhs, rhs = _arr(inst, 0), _arr(inst, 1)
    for i in range(2, inst.operand_count):
        s = _arr(inst, i)
        base = lhs if i == 2 else rhs
        if s.rank and s.rank != base.rank:
            raise _err(inst, f"scale operand {i} {_text(s)} must be a scalar or have the rank of {_text(base)}")
    return _shape(_result_array(inst, given).dtype, _dot_dims(inst, lhs, rhs))


@rule("ragged-dot")
def _ragged_dot(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 3)
    lhs, rhs, groups = _arr(inst, 0), _arr(inst, 1), _arr(inst, 2)
    if _kind(groups.dtype) not in ("sint", "uint") or not groups.rank:
        raise _err(inst, f"group sizes must be an integer array, got {_text(groups)}")
    ragged = _ints(inst, "lhs_ragged_dims")
    group_dims = _ints(inst, "rhs_group_dims", ())
    if len(ragged) != 1:
        raise _err(inst, f"needs exactly one lhs ragged dimension, got {list(ragged)}")
    r = _dim(inst, ragged[0], lhs.rank, "lhs ragged dimension")
    dims = _dot_dims(inst, lhs, rhs, group_dims)
    if r in _ints(inst, "lhs_contracting_dims", ()):
        dims = [groups.dims[-1]] + dims
    elif r not in _ints(inst, "lhs_batch_dims", ()) and len(group_dims) != 1:
        raise _err(inst, "a ragged non-contracting dimension needs one rhs group dimension")
    return _shape(_dot_type(inst, lhs, rhs, given), dims)


def _parse_labels(inst: Any) -> tuple[str, str, str]:
    text = str(_attr(inst, "dim_labels"))
    lhs, _, rest = text.partition("_")
    rhs, _, out = rest.partition("->")
    if not (lhs and rhs and out) or not (len(lhs) == len(rhs) == len(out)):
        raise _err(inst, f"bad dim_labels {text!r}")
    return lhs, rhs, out


def _label_positions(inst: Any, labels: str, named: str) -> tuple[list[int], list[int]]:
    """Positions of the two named dimensions, then of spatial dimensions 0, 1, ... in `labels`."""
    spatial = len(labels) - 2
    want = list(named) + [str(i) for i in range(spatial)]
    if sorted(labels) != sorted(want):
        raise _err(inst, f"dim_labels part {labels!r} must hold {named} and spatial dimensions 0..{spatial - 1}")
    return [labels.index(c) for c in named], [labels.index(str(i)) for i in range(spatial)]


@rule("convolution")
def _convolution(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 2)
    lhs, rhs = _arr(inst, 0), _arr(inst, 1)
    ll, rl, ol = _parse_labels(inst)
    (lb, lf), lsp = _label_positions(inst, ll, "bf")
    (ki, ko), ksp = _label_positions(inst, rl, "io")
    (ob, of), osp = _label_positions(inst, ol, "bf")
    if lhs.rank != len(ll) or rhs.rank != len(rl):
        raise _err(inst, f"operands {_text(lhs)}, {_text(rhs)} do not have rank {len(ll)} (dim_labels)")
    fgc, bgc = _int(inst, "feature_group_count", 1), _int(inst, "batch_group_count", 1)
    _check_groups(inst, lhs.dims[lb], lhs.dims[lf], rhs.dims[ki], rhs.dims[ko], fgc, bgc)
    window = inst.attrs.get("window") or Window(())
    if [w.size for w in window.dims] != [rhs.dims[k] for k in ksp]:
        raise _err(inst, f"window sizes {[w.size for w in window.dims]} do not match the kernel {_text(rhs)}")
    spatial = _window_output(inst, [lhs.dims[d] for d in lsp], window)
    dims = [0] * len(ol)
    dims[ob], dims[of] = lhs.dims[lb] // bgc, rhs.dims[ko]
    for k, d in zip(osp, spatial, strict=True):
        dims[k] = d
    return _shape(_dot_type(inst, lhs, rhs, given), dims)


def _check_groups(inst: Any, batch: int, features: int, kin: int, kout: int, fgc: int, bgc: int) -> None:
    if fgc <= 0 or bgc <= 0 or (fgc > 1 and bgc > 1):
        raise _err(inst, f"bad group counts feature_group_count={fgc} batch_group_count={bgc}")
    if features % fgc or features // fgc != kin:
        raise _err(inst, f"input features {features} / feature_group_count {fgc} must equal kernel input "
                         f"features {kin}")
    if kout % fgc or kout % bgc or batch % bgc:
        raise _err(inst, f"output features {kout} and batch {batch} must divide by the group counts")


# ----------------------------------------------------------------------------- linear algebra, fft, batch norm


@rule("cholesky")
def _cholesky(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    a = _arr(inst, 0)
    _square(inst, a)
    return a


def _square(inst: Any, a: Shape) -> None:
    if _kind(a.dtype) not in ("float", "complex"):
        raise _err(inst, f"needs a floating-point or complex operand, got {_text(a)}")
    if a.rank < 2 or a.dims[-1] != a.dims[-2]:
        raise _err(inst, f"needs square matrices in the two minor dimensions, got {_text(a)}")


@rule("triangular-solve")
def _triangular_solve(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 2)
    a, b = _arr(inst, 0), _arr(inst, 1)
    _square(inst, a)
    _same_type(inst, a, b, "a and b have different element types")
    shared = b.dims[-2] if _flag(inst, "left_side") else b.dims[-1]
    if b.rank != a.rank or b.dims[:-2] != a.dims[:-2] or shared != a.dims[-1]:
        raise _err(inst, f"b {_text(b)} does not match a {_text(a)}")
    return b


@rule("fft")
def _fft(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 1)
    s = _arr(inst, 0)
    kind = str(_attr(inst, "fft_type"))
    lengths = _ints(inst, "fft_length")
    n = len(lengths)
    if not 1 <= n <= 3 or s.rank < n:
        raise _err(inst, f"fft_length {list(lengths)} does not suit {_text(s)}")
    inner = s.dims[s.rank - n:]
    if kind in ("FFT", "IFFT"):
        if _kind(s.dtype) != "complex":
            raise _err(inst, f"{kind} needs a complex operand, got {_text(s)}")
        return s
    if kind == "RFFT":
        if s.dtype not in ("f32", "f64") or tuple(inner) != lengths:
            raise _err(inst, f"RFFT needs f32/f64 with inner dimensions {list(lengths)}, got {_text(s)}")
        last = lengths[-1] // 2 + 1 if lengths[-1] else 0
        return _shape({"f32": "c64", "f64": "c128"}[s.dtype], s.dims[:-1] + (last,))
    if kind == "IRFFT":
        ok = _kind(s.dtype) == "complex" and tuple(inner[:-1]) == lengths[:-1]
        if not ok or inner[-1] != (lengths[-1] // 2 + 1 if lengths[-1] or inner[-1] else 0):
            raise _err(inst, f"IRFFT of length {list(lengths)} does not suit {_text(s)}")
        return _shape(_COMPONENT[s.dtype], s.dims[:-1] + (lengths[-1],))
    raise _err(inst, f"unknown fft_type {kind}")


def _features(inst: Any, operand: Shape, vectors: Iterable[int]) -> Shape:
    f = _dim(inst, _int(inst, "feature_index"), operand.rank, "feature_index")
    if _kind(operand.dtype) != "float":
        raise _err(inst, f"needs a floating-point operand, got {_text(operand)}")
    feature = _shape(operand.dtype, (operand.dims[f],))
    for i in vectors:
        s = _arr(inst, i)
        if s.rank != 1 or s.dims[0] != operand.dims[f] or s.dtype != operand.dtype:
            raise _err(inst, f"operand {i} {_text(s)} must be {_text(feature)}")
    return feature


@rule("batch-norm-training")
def _bn_training(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 3)
    x = _arr(inst, 0)
    f = _features(inst, x, (1, 2))
    return TupleShape((x, f, f))


@rule("batch-norm-inference")
def _bn_inference(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 5)
    x = _arr(inst, 0)
    _features(inst, x, (1, 2, 3, 4))
    return x


@rule("batch-norm-grad")
def _bn_grad(inst: Instruction, given: AnyShape | None) -> AnyShape:
    _count(inst, 5)
    x = _arr(inst, 0)
    f = _features(inst, x, (1, 2, 3))
    _same_dims(inst, x, _arr(inst, 4), "operand and output gradient differ")
    return TupleShape((x, f, f))
