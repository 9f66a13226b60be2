"""dot-strength-reduction: a dot with a vector operand becomes multiply + reduce, as XLA:GPU's
DotStrengthReduction does before fusion (xla/service/gpu/transforms/dot_strength_reduction.cc), so that it
fuses; left as a dot, XLA would rewrite it after our fusion, outside any fusion.

Before:
    %d = f32[6] dot(f32[4] %v, f32[4,6] %w), lhs_contracting_dims={0}, rhs_contracting_dims={0}
After:
    %b = f32[4,6] broadcast(%v), dimensions={0}
    %m = f32[4,6] multiply(%b, %w)
    %d = f32[6] reduce(%m, f32[] constant(0)), dimensions={0}, to_apply=%scalar_add_f32

Matched as XLA matches (vector x vector always; vector x matrix when the matrices are small, < 10M
elements), for result types reduced exactly as the dot accumulates (f32, f64, s32, s64, u32, u64). Not
taken from XLA: its s32 dots with rhs contracting dimension 1 and the dots Triton's GEMM fusion cannot
handle (those are left as dots).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import Shape
from hlopt.passes.framework.base import ExpanderPass
from hlopt.passes.framework.registry import register

__all__ = [
    "DOT_STRENGTH_REDUCTION_THRESHOLD", "DotStrengthReduction", "is_strength_reducible_dot", "strength_reduce_dot",
    "strength_reduced",
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
    """Replace a strength-reducible dot by `strength_reduced(dot)`; returns the replacement."""
    value = strength_reduced(dot)
    dot.parent.replace_instruction(dot, value)
    return value


def strength_reduced(dot: Instruction) -> Instruction:
    """Build, before a strength-reducible dot, reduce(multiply(broadcast(vector), matrix)) over the
    contracting dimensions, keeping the matrix operand's dimension order; a transpose restores the dot's
    output order when needed. Returns the value that replaces the dot (with the dot's metadata)."""
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
    return value


@register
@dataclass(frozen=True)
class DotStrengthReduction(ExpanderPass):
    """Rewrite dots with a vector operand into multiply + reduce (see the module docstring)."""

    name: ClassVar[str] = "dot-strength-reduction"
    opcodes: ClassVar[frozenset[str]] = frozenset({"dot"})

    def instruction_matches(self, inst: Instruction) -> bool:
        return inst.opcode == "dot" and is_strength_reducible_dot(inst)

    def expand(self, inst: Instruction) -> Instruction:
        return strength_reduced(inst)

    def explain_expansion(self, old: Instruction, new: Instruction) -> str:
        return (f"[{self.name}] {old.parent.name}: %{old.name} rewritten as multiply + reduce %{new.name} "
                "(XLA:GPU's dot strength reduction), then fusible")
