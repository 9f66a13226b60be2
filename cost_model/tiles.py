"""How often a block-level Triton fusion (`__triton`: softmax, norms) evaluates each fused instruction.

XLA:GPU's GpuHloCostAnalysis weights each fused instruction by its utilization: how many times the loop
emitter recomputes one of its elements per element of the fusion's output. A reduction broadcast back
over its input's shape is then recomputed for every output element, which is how the loop emitter would
run it, but not how a block-level Triton kernel does: each program instance computes one output tile and
evaluates every instruction only over the tile of it that this output tile needs (what XLA's indexing
cost model counts). So an instruction of `n` elements whose tile has `t` elements is evaluated at most
`tiles x t / n` times per element, with `tiles` the number of output tiles, and `t` counted padded as
Triton's tensors are and as XLA's indexing cost model counts them: each tile dimension rounded up to a
power of two (a 10-wide row computed by every [1,4] output tile is 16 elements per program).

`block_level_caps` propagates tile shapes from the root to the parameters (elementwise ops keep the tile,
a broadcast keeps the dimensions it maps, a reduce widens its tile to the whole reduced dimensions, a
transpose permutes it, a bitcast or reshape keeps its element count, filled from the minor dimension),
and gives that bound per instruction; an instruction it cannot follow gets its whole shape as tile.
"""

from __future__ import annotations

import math

from hlopt.cost_model.analysis import is_elementwise
from hlopt.hlo.ir import Computation, Instruction

__all__ = ["block_level_caps", "output_tile"]


def output_tile(fusion: Instruction) -> list[int] | None:
    """The output tile sizes of a `__triton` (block-level, not GEMM) fusion's config, else None."""
    if fusion.opcode != "fusion" or not fusion.backend_config or "__triton" not in fusion.backend_config:
        return None
    backend = fusion.backend_config_value("fusion_backend_config") or {}
    if backend.get("kind") != "__triton":
        return None
    block = backend.get("block_level_fusion_config", {})
    tiles = block.get("output_tiles") or ([{"sizes": block["output_tile_sizes"]}] if "output_tile_sizes" in block
                                          else [])
    if not tiles:
        return None
    sizes = [int(s) for s in tiles[0].get("sizes", [])]
    return sizes or None


def _padded(size: int) -> int:
    """A tile dimension as Triton computes it: rounded up to a power of two."""
    return 1 << max(0, size - 1).bit_length()


def _dims(inst: Instruction) -> list[int]:
    shape = inst.shape
    return [] if shape.is_tuple else list(shape.dims)


def _clamp(tile: list[int], dims: list[int]) -> list[int]:
    return [max(1, min(t, d)) for t, d in zip(tile, dims, strict=False)] if len(tile) == len(dims) else dims


def _refill(count: int, dims: list[int]) -> list[int]:
    """A tile of about `count` elements of `dims`, filled from the minor (last) dimension."""
    tile = [1] * len(dims)
    for i in range(len(dims) - 1, -1, -1):
        if count <= 1:
            break
        tile[i] = min(dims[i], count)
        count = math.ceil(count / tile[i])
    return tile


def _operand_tile(user: Instruction, index: int, tile: list[int]) -> list[int]:
    """The tile of `user`'s operand `index` that a `tile` of `user` needs."""
    operand = user.operand(index)
    dims = _dims(operand)
    op = user.opcode
    if op == "broadcast":
        return [tile[d] for d in user.attrs.get("dimensions", ())] if len(tile) == len(_dims(user)) else dims
    if op == "reduce":
        if index >= len(user.operands) // 2:
            return dims  # init values
        reduced = set(user.attrs.get("dimensions", ()))
        kept = iter(tile)
        return [d if i in reduced else next(kept, d) for i, d in enumerate(dims)]
    if op == "transpose":
        perm = list(user.attrs.get("dimensions", ()))
        out = [1] * len(dims)
        for i, p in enumerate(perm):
            out[p] = tile[i] if i < len(tile) else dims[p]
        return out
    if op in ("bitcast", "reshape"):
        return _refill(math.prod(tile), dims)
    if op in ("slice", "dynamic-slice") and index == 0 or is_elementwise(user) or op == "convert":
        return _clamp(tile, dims)
    return dims


def block_level_caps(fusion: Instruction, comp: Computation) -> dict[Instruction, float] | None:
    """Per fused instruction, the most evaluations per element a block-level kernel makes (module
    docstring); None if `fusion` is not a `__triton` block-level fusion, or if its output tile is a single
    element (every program then computes one element, as the loop emitter's threads do, and XLA's utilization
    is the model: measured against XLA's estimates, tests/test_cost_model.py), except at a reduce root: a
    one-element tile of a row statistic still reads and computes its whole row once, in one program. A tuple
    root (a multi-output Triton fusion) is tiled by its first output's tile, each output covered by as many
    tiles."""
    tile = output_tile(fusion)
    root = comp.root
    if tile is None or root is None:
        return None
    roots = list(root.operands) if root.opcode == "tuple" else [root]  # a tuple root: its first output's tile
    first = roots[0]
    if first.shape.is_tuple or len(tile) != len(_dims(first)):
        return None
    if math.prod(tile) <= 1 and first.opcode != "reduce":
        return None  # one output element per program, recomputing what it reads: the loop emitter's model
    dims = _dims(first)
    tiles = math.prod(math.ceil(d / max(t, 1)) for d, t in zip(dims, tile, strict=True))
    need: dict[Instruction, list[int]] = {}
    for r in roots:  # the other outputs of a tuple root: the same number of tiles, each over its own shape
        r_dims = _dims(r)
        if r.shape.is_tuple:
            return None
        r_tile = _clamp(tile, r_dims) if len(r_dims) == len(tile) else _refill(math.ceil(r.shape.numel / tiles),
                                                                                r_dims)
        have = need.get(r)
        need[r] = r_tile if have is None else [max(a, b) for a, b in zip(have, r_tile, strict=False)]
    for inst in reversed(comp.post_order()):
        mine = need.get(inst)
        if mine is None:
            continue
        for i, operand in enumerate(inst.operands):
            if operand.shape.is_tuple:
                continue
            want = _operand_tile(inst, i, mine)
            have = need.get(operand)
            need[operand] = want if have is None else [max(a, b) for a, b in zip(have, want, strict=False)]
    caps = {}
    for inst, t in need.items():
        n = inst.shape.numel if not inst.shape.is_tuple else 0
        if n:
            caps[inst] = tiles * math.prod(_padded(x) for x in t) / n
    return caps
