"""Shape inference: the result shape of an instruction from its operands and attributes.

Used by the parser (instructions written without a result shape), the builder and the verifier.
"""

from __future__ import annotations

from collections.abc import Callable

from hlo.ir import Instruction
from hlo.opcodes import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE
from hlo.shape import AnyShape, Shape, TupleShape

__all__ = ["infer_shape", "ShapeInferenceError", "INFERENCE_RULES"]


class ShapeInferenceError(ValueError):
    """The operands and attributes do not determine a valid shape."""


Rule = Callable[[Instruction], AnyShape]
#: Shape inference rule per opcode.
INFERENCE_RULES: dict[str, Rule] = {}


def rule(*opcodes: str) -> Callable[[Rule], Rule]:
    """Register a shape inference rule for opcodes."""

    def register(fn: Rule) -> Rule:
        for op in opcodes:
            INFERENCE_RULES[op] = fn
        return fn

    return register


def infer_shape(inst: Instruction) -> AnyShape:
    """The shape `inst` must have (layouts of array results are left off unless an operand fixes them)."""
    fn = INFERENCE_RULES.get(inst.opcode)
    if fn is None:
        raise ShapeInferenceError(f"no shape inference for opcode {inst.opcode!r}")
    for op in inst.operands:
        if op.shape is None:
            raise ShapeInferenceError(f"operand %{op.name} has no shape yet")
    return fn(inst)


def _array(inst: Instruction, i: int) -> Shape:
    s = inst.operand(i).shape
    if s.is_tuple:
        raise ShapeInferenceError(f"operand {i} of {inst.opcode} must be an array, got {s}")
    return s


def _need_operands(inst: Instruction, n: int) -> None:
    if inst.operand_count != n:
        raise ShapeInferenceError(f"{inst.opcode} takes {n} operand(s), got {inst.operand_count}")


@rule(*(UNARY_ELEMENTWISE - {"convert", "bitcast-convert", "real", "imag", "is-finite", "abs"}))
def _unary(inst: Instruction) -> AnyShape:
    _need_operands(inst, 1)
    return _array(inst, 0)


@rule("real", "imag", "abs")
def _real_imag(inst: Instruction) -> AnyShape:
    s = _array(inst, 0)
    return s.with_dtype({"c64": "f32", "c128": "f64"}.get(s.dtype, s.dtype))


@rule("is-finite")
def _is_finite(inst: Instruction) -> AnyShape:
    return _array(inst, 0).with_dtype("pred")


@rule(*(BINARY_ELEMENTWISE - {"compare", "complex", "stochastic-convert"}))
def _binary(inst: Instruction) -> AnyShape:
    _need_operands(inst, 2)
    a, b = _array(inst, 0), _array(inst, 1)
    if a.dims != b.dims or a.dtype != b.dtype:
        raise ShapeInferenceError(f"{inst.opcode} operands differ: {a} vs {b}")
    return a


@rule("compare")
def _compare(inst: Instruction) -> AnyShape:
    _need_operands(inst, 2)
    a, b = _array(inst, 0), _array(inst, 1)
    if a.dims != b.dims:
        raise ShapeInferenceError(f"compare operands differ: {a} vs {b}")
    return a.with_dtype("pred")


@rule("complex")
def _complex(inst: Instruction) -> AnyShape:
    a = _array(inst, 0)
    return a.with_dtype({"f32": "c64", "f64": "c128"}[a.dtype])


@rule("select")
def _select(inst: Instruction) -> AnyShape:
    _need_operands(inst, 3)
    return inst.operand(1).shape


@rule("clamp")
def _clamp(inst: Instruction) -> AnyShape:
    _need_operands(inst, 3)
    return inst.operand(1).shape


@rule("tuple")
def _tuple(inst: Instruction) -> AnyShape:
    return TupleShape(tuple(op.shape for op in inst.operands))


@rule("get-tuple-element")
def _gte(inst: Instruction) -> AnyShape:
    _need_operands(inst, 1)
    s = inst.operand(0).shape
    index = inst.attrs.get("index")
    if not s.is_tuple or index is None or not 0 <= index < len(s.elements):
        raise ShapeInferenceError(f"get-tuple-element index {index} out of range for {s}")
    return s.elements[index]


@rule("call")
def _call(inst: Instruction) -> AnyShape:
    callee = inst.attrs.get("to_apply")
    if callee is None or callee.root is None or callee.root.shape is None:
        raise ShapeInferenceError("call needs a resolved to_apply computation")
    return callee.root.shape


@rule("while", "opt-barrier")
def _same_as_operand(inst: Instruction) -> AnyShape:
    _need_operands(inst, 1)
    return inst.operand(0).shape


@rule("conditional")
def _conditional(inst: Instruction) -> AnyShape:
    comps = inst.attrs.get("branch_computations") or [inst.attrs.get("true_computation")]
    if not comps or comps[0] is None:
        raise ShapeInferenceError("conditional needs its branch computations")
    return comps[0].root.shape


@rule("after-all")
def _after_all(inst: Instruction) -> AnyShape:
    return Shape("token", ())


@rule("partition-id", "replica-id")
def _ids(inst: Instruction) -> AnyShape:
    return Shape("u32", ())


@rule("add-dependency")
def _add_dependency(inst: Instruction) -> AnyShape:
    return inst.operand(0).shape


@rule("async-done", "call-done", "all-reduce-done", "all-gather-done", "collective-permute-done", "copy-done")
def _done(inst: Instruction) -> AnyShape:
    s = inst.operand(0).shape
    if inst.opcode == "all-reduce-done":
        return s
    if not s.is_tuple or len(s.elements) < 2:
        raise ShapeInferenceError(f"{inst.opcode} operand must be a start tuple, got {s}")
    return s.elements[1]


# ----------------------------------------------------------------------------- shape-changing ops
# Where the result type is not determined by the operands (convert, dot's preferred type, ...), the
# rules take the element type from the instruction's own shape: they then check the dimensions.


def _own_dtype(inst: Instruction) -> str:
    if inst.shape is None or inst.shape.is_tuple:
        raise ShapeInferenceError(f"{inst.opcode} needs its result type written")
    return inst.shape.dtype


def _dims_shape(dtype: str, dims) -> Shape:
    return Shape(dtype, tuple(dims))


@rule("convert", "bitcast-convert", "stochastic-convert")
def _convert(inst: Instruction) -> AnyShape:
    a = _array(inst, 0)
    if inst.opcode == "bitcast-convert":
        return _dims_shape(_own_dtype(inst), inst.shape.dims)  # element width may change the rank
    return _dims_shape(_own_dtype(inst), a.dims)


@rule("broadcast")
def _broadcast(inst: Instruction) -> AnyShape:
    a = _array(inst, 0)
    out = inst.shape
    if out is None:
        raise ShapeInferenceError("broadcast needs its result shape written")
    dims = inst.attrs.get("dimensions", ())
    if len(dims) != a.rank:
        raise ShapeInferenceError(f"broadcast dimensions {list(dims)} do not match operand rank {a.rank}")
    for i, d in enumerate(dims):
        if not 0 <= d < out.rank or (a.dims[i] != out.dims[d] and a.dims[i] != 1):
            raise ShapeInferenceError(f"operand dimension {i} ({a.dims[i]}) cannot go to output dimension {d}")
    return _dims_shape(a.dtype, out.dims)


@rule("reshape", "bitcast")
def _reshape(inst: Instruction) -> AnyShape:
    a = _array(inst, 0)
    out = inst.shape
    if out is None:
        raise ShapeInferenceError(f"{inst.opcode} needs its result shape written")
    if inst.opcode == "reshape" and out.numel != a.numel and not a.dynamic:
        raise ShapeInferenceError(f"reshape from {a} to {out} changes the element count")
    dtype = a.dtype if inst.opcode == "reshape" else out.dtype
    return _dims_shape(dtype, out.dims)


@rule("transpose")
def _transpose(inst: Instruction) -> AnyShape:
    a = _array(inst, 0)
    perm = tuple(inst.attrs.get("dimensions", ()))
    if sorted(perm) != list(range(a.rank)):
        raise ShapeInferenceError(f"transpose dimensions {list(perm)} are not a permutation of rank {a.rank}")
    return _dims_shape(a.dtype, [a.dims[p] for p in perm])


@rule("slice")
def _slice(inst: Instruction) -> AnyShape:
    a = _array(inst, 0)
    spec = inst.attrs.get("slice", ())
    if len(spec) != a.rank:
        raise ShapeInferenceError(f"slice has {len(spec)} ranges for rank {a.rank}")
    dims = []
    for (start, limit, stride), d in zip(spec, a.dims, strict=True):
        if not 0 <= start <= limit <= d or stride <= 0:
            raise ShapeInferenceError(f"slice [{start}:{limit}:{stride}] out of bounds for dimension {d}")
        dims.append((limit - start + stride - 1) // stride)
    return _dims_shape(a.dtype, dims)


@rule("concatenate")
def _concatenate(inst: Instruction) -> AnyShape:
    dim = inst.attrs.get("dimensions", (0,))[0]
    shapes = [_array(inst, i) for i in range(inst.operand_count)]
    first = shapes[0]
    total = 0
    for s in shapes:
        if s.rank != first.rank or any(a != b for i, (a, b) in enumerate(zip(s.dims, first.dims, strict=True))
                                       if i != dim):
            raise ShapeInferenceError(f"concatenate operands differ outside dimension {dim}")
        total += s.dims[dim]
    dims = list(first.dims)
    dims[dim] = total
    return _dims_shape(first.dtype, dims)


@rule("pad")
def _pad(inst: Instruction) -> AnyShape:
    a = _array(inst, 0)
    cfg = inst.attrs.get("padding")
    if cfg is None or len(cfg.dims) != a.rank:
        raise ShapeInferenceError("pad needs one padding entry per dimension")
    dims = [lo + hi + d + max(d - 1, 0) * interior for d, (lo, hi, interior) in zip(a.dims, cfg.dims, strict=True)]
    return _dims_shape(a.dtype, dims)


@rule("dot")
def _dot(inst: Instruction) -> AnyShape:
    lhs, rhs = _array(inst, 0), _array(inst, 1)
    lb, rb = inst.attrs.get("lhs_batch_dims", ()), inst.attrs.get("rhs_batch_dims", ())
    lc, rc = inst.attrs.get("lhs_contracting_dims", ()), inst.attrs.get("rhs_contracting_dims", ())
    if len(lb) != len(rb) or len(lc) != len(rc):
        raise ShapeInferenceError("dot has mismatched batch or contracting dimension lists")
    for a, b in list(zip(lb, rb, strict=True)) + list(zip(lc, rc, strict=True)):
        if lhs.dims[a] != rhs.dims[b]:
            raise ShapeInferenceError(f"dot dimension {a} of lhs ({lhs.dims[a]}) != {b} of rhs ({rhs.dims[b]})")
    dims = [lhs.dims[d] for d in lb]
    dims += [d for i, d in enumerate(lhs.dims) if i not in lb and i not in lc]
    dims += [d for i, d in enumerate(rhs.dims) if i not in rb and i not in rc]
    return _dims_shape(_own_dtype(inst), dims)


@rule("reduce")
def _reduce(inst: Instruction) -> AnyShape:
    n = inst.operand_count // 2
    if n == 0 or inst.operand_count % 2:
        raise ShapeInferenceError("reduce takes N inputs and N init values")
    dims = set(inst.attrs.get("dimensions", ()))
    outs = []
    for i in range(n):
        a = _array(inst, i)
        outs.append(_dims_shape(a.dtype, [d for j, d in enumerate(a.dims) if j not in dims]))
    return outs[0] if n == 1 else TupleShape(tuple(outs))


@rule("iota", "rng", "rng-bit-generator", "custom-call", "fusion", "parameter", "constant", "gather", "scatter",
      "convolution", "reduce-window", "sort", "fft", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
      "collective-permute", "dynamic-slice", "dynamic-update-slice", "select-and-scatter", "cholesky",
      "triangular-solve", "topk", "reverse", "get-dimension-size", "set-dimension-size", "infeed", "outfeed",
      "send", "recv", "send-done", "recv-done", "batch-norm-training", "batch-norm-inference", "batch-norm-grad",
      "domain", "map", "ragged-dot", "scaled-dot", "ragged-all-to-all", "collective-broadcast",
      "all-reduce-start", "all-gather-start", "collective-permute-start", "async-start", "async-update",
      "copy-start", "dynamic-reshape", "rng-get-and-update-state")
def _as_written(inst: Instruction) -> AnyShape:
    """Opcodes whose result is taken as written (their checks live in the verifier's other rules)."""
    if inst.shape is None:
        raise ShapeInferenceError(f"{inst.opcode} needs its result shape written")
    return inst.shape

