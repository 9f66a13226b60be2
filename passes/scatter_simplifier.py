"""scatter-simplifier: a scatter takes the canonical form XLA:GPU's scatter emitter reads (XLA's
ScatterSimplifier, xla/service/scatter_simplifier.cc, which XLA:GPU runs before fusion): indices [N, k] with
index_vector_dim 1, updates [N, window...] with the scatter dimensions transposed to the front and collapsed
into one, a size-1 dimension for each inserted window dimension, so that update_window_dims = 1..rank and no
inserted window dims remain. The operand and `scatter_dims_to_operand_dims` are kept.

Before:
    %s = f32[3,3] scatter(f32[3,3] %x, s32[2,1] %i, f32[2,3] %u), update_window_dims={1},
         inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add
After:
    %r = f32[2,1,3] reshape(%u)
    %s = f32[3,3] scatter(%x, %i, %r), update_window_dims={1,2}, inserted_window_dims={},
         scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add

Left alone: scatters already simplified (ScatterSimplifier::IsSimplifiedScatter), scatters into a scalar
(XLA inlines the update computation instead) and batched scatters (input_batching_dims: XLA normalizes those
with its BatchedGatherScatterNormalizer first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.builder import Builder
from hlopt.hlo.ir import Instruction
from hlopt.hlo.shape import Shape, default_layout
from hlopt.passes.framework.base import ExpanderPass
from hlopt.passes.framework.registry import register

__all__ = ["ScatterSimplifier", "is_simplified_scatter", "can_simplify_scatter", "simplified_scatter"]


def _parts(scatter: Instruction) -> tuple[list[Instruction], Instruction, list[Instruction]]:
    """(operands, indices, updates) of a (variadic) scatter."""
    n = scatter.operand_count // 2
    ops = list(scatter.operands)
    return ops[:n], ops[n], ops[n + 1:]


def is_simplified_scatter(scatter: Instruction) -> bool:
    """ScatterSimplifier::IsSimplifiedScatter: a non-scalar operand, index_vector_dim the indices' last
    dimension, at most one scatter dimension in the updates, update window dims sorted and without 0, no
    inserted window dims (the map `scatter_dims_to_operand_dims` may be any permutation)."""
    a = scatter.attrs
    operands, indices, updates = _parts(scatter)
    window = tuple(a.get("update_window_dims", ()))
    return (operands[0].shape.rank > 0 and a.get("index_vector_dim") == indices.shape.rank - 1
            and updates[0].shape.rank - len(window) <= 1 and 0 not in window and list(window) == sorted(window)
            and not a.get("inserted_window_dims"))


def can_simplify_scatter(inst: Instruction) -> bool:
    """A scatter this pass rewrites: not yet simplified, into arrays of rank > 0, without batching dims."""
    if inst.opcode != "scatter" or is_simplified_scatter(inst):
        return False
    operands, _, _ = _parts(inst)
    return operands[0].shape.rank > 0 and not inst.attrs.get("input_batching_dims")


def _shape_like(like: Shape, dims: Sequence[int]) -> Shape:
    """`like`'s element type with `dims`, a row-major layout where `like` has a layout."""
    return Shape(like.dtype, tuple(dims), (), default_layout(len(dims)) if like.layout is not None else None)


def _reshape(b: Builder, x: Instruction, dims: Sequence[int]) -> Instruction:
    """x reshaped to `dims`; a reshape this expansion just made (no users yet) is reshaped from its operand
    instead, so that the updates and indices get one reshape each, as XLA's simplifier leaves them."""
    if x.opcode == "reshape" and not x.users and x.parent is b.computation:
        src = x.operand(0)
        b.computation.remove(x)
        x = src
    if tuple(dims) == tuple(x.shape.dims):
        return x
    return b.op("reshape", x, shape=_shape_like(x.shape, dims))


def _transpose(b: Builder, x: Instruction, perm: Sequence[int]) -> Instruction:
    """x transposed by `perm` (none when it is the identity, as XLA's MaybeTranspose)."""
    if list(perm) == list(range(len(perm))):
        return x
    return b.op("transpose", x, shape=_shape_like(x.shape, [x.shape.dims[p] for p in perm]),
                dimensions=tuple(perm))


def _insert_ones(b: Builder, x: Instruction, at: Sequence[int]) -> Instruction:
    """x with size-1 dimensions at the positions `at` of the result (XLA's InsertDegenerateDims)."""
    dims = list(x.shape.dims)
    for d in sorted(at):
        dims.insert(d, 1)
    return _reshape(b, x, dims)


def _collapse_first(b: Builder, x: Instruction, n: int) -> Instruction:
    """x with its first `n` dimensions collapsed into one (XLA's CollapseFirstNDims)."""
    dims = x.shape.dims
    return _reshape(b, x, [math.prod(dims[:n]), *dims[n:]])


def _canonical_indices(b: Builder, indices: Instruction, index_vector_dim: int) -> Instruction:
    """The indices as [N, k] (XLA's TransformStartIndices)."""
    rank = indices.shape.rank
    if index_vector_dim == rank:
        indices = _insert_ones(b, indices, [rank])
        rank += 1
    elif index_vector_dim < rank - 1:
        perm = [d for d in range(rank) if d != index_vector_dim] + [index_vector_dim]
        indices = _transpose(b, indices, perm)
    if rank > 2:
        return _collapse_first(b, indices, rank - 1)
    if rank == 1:
        return _insert_ones(b, indices, [0])
    return indices


def _canonical_updates(b: Builder, updates: Instruction, window: Sequence[int], inserted: Sequence[int]) -> Instruction:
    """The updates as [N, window...] with a size-1 dimension per inserted window dimension (XLA's
    FlattenAndTransposeUpdates)."""
    rank = updates.shape.rank
    scatter_dims = [d for d in range(rank) if d not in window]
    updates = _transpose(b, updates, scatter_dims + list(window))
    if len(scatter_dims) > 1:
        updates = _collapse_first(b, updates, len(scatter_dims))
    elif not scatter_dims:
        updates = _insert_ones(b, updates, [0])
    if inserted:
        updates = _insert_ones(b, updates, [d + 1 for d in inserted])
    return updates


def simplified_scatter(scatter: Instruction) -> Instruction:
    """Build, before `scatter`, the scatter in ScatterSimplifier's canonical form; returns it."""
    a = scatter.attrs
    b = Builder(scatter.parent, before=scatter)
    operands, indices, updates = _parts(scatter)
    window, inserted = tuple(a.get("update_window_dims", ())), tuple(a.get("inserted_window_dims", ()))
    new_indices = _canonical_indices(b, indices, int(a["index_vector_dim"]))
    new_updates = [_canonical_updates(b, u, window, inserted) for u in updates]
    rank = operands[0].shape.rank
    attrs = {k: v for k, v in a.items() if k not in ("update_window_dims", "inserted_window_dims", "index_vector_dim")}
    attrs.update(update_window_dims=tuple(range(1, rank + 1)), inserted_window_dims=(), index_vector_dim=1)
    return b.op("scatter", *operands, new_indices, *new_updates, shape=scatter.shape, **attrs)


@register
@dataclass(frozen=True)
class ScatterSimplifier(ExpanderPass):
    """Rewrite scatters into XLA:GPU's canonical scatter form (see the module docstring)."""

    name: ClassVar[str] = "scatter-simplifier"
    opcodes: ClassVar[frozenset[str]] = frozenset({"scatter"})

    def instruction_matches(self, inst: Instruction) -> bool:
        return can_simplify_scatter(inst)

    def expand(self, inst: Instruction) -> Instruction:
        return simplified_scatter(inst)

    def explain_expansion(self, old: Instruction, new: Instruction) -> str:
        return (f"[{self.name}] {old.parent.name}: %{old.name} rewritten into the canonical scatter %{new.name} "
                "(XLA's ScatterSimplifier), which XLA:GPU's scatter emitter takes fused")
