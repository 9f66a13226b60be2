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


@rule("while", "opt-barrier", "copy")
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
