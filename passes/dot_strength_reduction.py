"""Dot strength reduction: a dot with a vector operand becomes multiply + reduce (XLA:GPU's
DotStrengthReduction, which runs before fusion)."""

from __future__ import annotations

import math

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import Shape

__all__ = [
    "DOT_STRENGTH_REDUCTION_THRESHOLD", "is_strength_reducible_dot", "strength_reduce_dot",
]

#: XLA:GPU's GpuAlgebraicSimplifier strength-reduces a dot with a vector operand when the unbatched
#: operand matrices hold fewer elements than this (IsMatrixMultiplicationTooSmallForRewriting).
DOT_STRENGTH_REDUCTION_THRESHOLD = 10_000_000
#: Result types reduced exactly as the dot accumulates (16-bit floats would need an f32 accumulator).
_REDUCIBLE_DOT_TYPES = frozenset({"f32", "f64", "s32", "s64", "u32", "u64"})


def _dot_dims(dot: Instruction) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    a = dot.attrs
    return (tuple(a.get("lhs_batch_dims", ())), tuple(a.get("lhs_contracting_dims", ())),
            tuple(a.get("rhs_batch_dims", ())), tuple(a.get("rhs_contracting_dims", ())))


def is_strength_reducible_dot(dot: Instruction) -> bool:
    """XLA:GPU's ShouldStrengthReduceDotToReduce: a dot one of whose operands has only batch and
    contracting dimensions (a vector per batch), and either both are vectors or the unbatched operand
    matrices are small (< 10M elements); XLA rewrites it into multiply + reduce before fusion."""
    if dot.opcode != "dot" or dot.shape.is_tuple or dot.operand_count != 2 or dot.attrs.get("sparsity"):
        return False
    if dot.has_control_dependencies:
        return False
    lhs, rhs = dot.operand(0).shape, dot.operand(1).shape
    if lhs.is_tuple or rhs.is_tuple or dot.shape.dtype not in _REDUCIBLE_DOT_TYPES:
        return False
    lb, lc, rb, rc = _dot_dims(dot)
    lhs_vector = len(lb) + len(lc) == lhs.rank
    rhs_vector = len(rb) + len(rc) == rhs.rank
    if not (lhs_vector or rhs_vector):
        return False
    if lhs_vector and rhs_vector:
        return True
    k = math.prod(lhs.dims[d] for d in lc)
    lhs_free = math.prod(s for i, s in enumerate(lhs.dims) if i not in lb and i not in lc)
    rhs_free = math.prod(s for i, s in enumerate(rhs.dims) if i not in rb and i not in rc)
    return (lhs_free + rhs_free) * k < DOT_STRENGTH_REDUCTION_THRESHOLD


def _add_computation(module: Module, dtype: str, before: Computation) -> Computation:
    """A new scalar `add` computation for the reduce that replaces a dot."""
    comp = Computation(module.unique_name(f"scalar_add_{dtype}"))
    module.add_computation(comp, before=before)
    x = comp.add(Instruction("parameter", Shape(dtype, ()), name=module.unique_name("lhs"), parameter_number=0))
    y = comp.add(Instruction("parameter", Shape(dtype, ()), name=module.unique_name("rhs"), parameter_number=1))
    comp.set_root(comp.add(Instruction("add", Shape(dtype, ()), [x, y], name=module.unique_name("add"))))
    return comp


def _transposed(comp: Computation, value: Instruction, perm: list[int], before: Instruction,
                module: Module) -> Instruction:
    """`value` with its dimensions permuted (`perm[i]` = operand dimension of output dimension i)."""
    if perm == sorted(perm):
        return value
    dims = tuple(value.shape.dims[i] for i in perm)
    return comp.add(Instruction("transpose", Shape(value.shape.dtype, dims).with_default_layout(), [value],
                                name=module.unique_name("transpose"), dimensions=tuple(perm)), before=before)


def _converted(comp: Computation, value: Instruction, dtype: str, before: Instruction, module: Module) -> Instruction:
    if value.shape.dtype == dtype:
        return value
    return comp.add(Instruction("convert", value.shape.with_dtype(dtype), [value],
                                name=module.unique_name("convert")), before=before)


def strength_reduce_dot(dot: Instruction) -> Instruction:
    """Replace a strength-reducible dot by reduce(multiply(broadcast(vector), matrix)) over the
    contracting dimensions, keeping the matrix operand's dimension order (what XLA's AlgebraicSimplifier
    does before XLA:GPU fuses); a transpose restores the dot's output order when needed. Returns the
    instruction that replaces the dot."""
    from hlopt.hlo.literal import Literal

    comp = dot.parent
    module = comp.module
    lb, lc, rb, rc = _dot_dims(dot)
    lhs_vector = len(lb) + len(lc) == dot.operand(0).shape.rank
    rhs_vector = len(rb) + len(rc) == dot.operand(1).shape.rank
    if lhs_vector and not rhs_vector:  # the matrix side keeps its order; the vector is broadcast
        vec, mat, vb, vc, mb, mc = dot.operand(0), dot.operand(1), lb, lc, rb, rc
    else:
        vec, mat, vb, vc, mb, mc = dot.operand(1), dot.operand(0), rb, rc, lb, lc
    dtype = dot.shape.dtype
    targets = {**dict(zip(vb, mb, strict=True)), **dict(zip(vc, mc, strict=True))}  # vector dim -> matrix dim
    order = sorted(range(vec.shape.rank), key=lambda d: targets[d])
    v = _converted(comp, _transposed(comp, vec, order, dot, module), dtype, dot, module)
    bcast = comp.add(Instruction("broadcast", mat.shape.with_dtype(dtype).with_default_layout(), [v],
                                 name=module.unique_name("broadcast"),
                                 dimensions=tuple(sorted(targets.values()))), before=dot)
    m = _converted(comp, mat, dtype, dot, module)
    a, b = (bcast, m) if vec is dot.operand(0) else (m, bcast)
    mul = comp.add(Instruction("multiply", bcast.shape, [a, b], name=module.unique_name("multiply")), before=dot)
    zero = comp.add(Instruction("constant", Shape(dtype, ()), name=module.unique_name("constant"),
                                literal=Literal("0", Shape(dtype, ()))), before=dot)
    kept = [d for d in range(mat.shape.rank) if d not in mc]
    out = Shape(dtype, tuple(mat.shape.dims[d] for d in kept)).with_default_layout()
    value = comp.add(Instruction("reduce", out, [mul, zero], name=module.unique_name("reduce"),
                                 dimensions=tuple(sorted(mc)), to_apply=_add_computation(module, dtype, comp)),
                     before=dot)
    wanted = list(mb) + [d for d in kept if d not in mb]  # the dot's order: batch, then free dimensions
    value = _transposed(comp, value, [kept.index(d) for d in wanted], dot, module)
    value.shape = dot.shape
    if dot.metadata is not None:
        value.metadata = dot.metadata.copy()
    dot.replace_all_uses_with(value)
    comp.remove(dot)
    return value
