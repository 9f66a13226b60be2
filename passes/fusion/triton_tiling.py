"""Tiling of would-be block-level Triton fusions, after XLA:GPU's SymbolicTileAnalysis and its choice of
output tile (GpuPerformanceModelWithIndexingAnalysis::TryFindBestTilingForFusion), for the ops that
normalization, softmax and their backward passes are made of.

A block-level Triton kernel runs one program per output tile; every fused instruction is evaluated over
the tile of it that the output tile needs. From the root's tile, tiles propagate to the operands:
- elementwise ops (convert, compare, select included) keep the tile;
- a broadcast keeps the tile of the dimensions it maps;
- a reduce (over one dimension, any one, of one array, with a reducer Triton supports) needs its whole
  reduced dimension: the operand's tile is the output tile with it inserted at full size;
- a transpose permutes the tile; a slice with unit strides keeps it;
- a reshape (a bitcast: the reshape of the physical shapes) keeps it when each group of dimensions it
  merges or splits is tiled as a contiguous block: ones in the major dimensions of the group, whole minor
  ones, and one partial dimension between them that divides its size (XLA's reshape constraints);
- parameters (values from outside the fusion) take any tile; constants must be scalars; an iota takes any.
Which ops and types Triton takes at all is XLA's IsTritonSupportedInstruction (`unsupported_reason`).
An instruction reached by several paths may get several tiles (it is then recomputed per tile, as XLA's
tiled HLO has one tiled instruction per distinct indexing).

The output tile is chosen as XLA does (TryFindBestTilingForFusion): among its good tilings (per dimension a
power of two below the size, or the size), the one of least time by XLA's indexing cost model
(EstimateRunTimeForTiledHloComputation): per program, every fused instruction computes its tile padded to
powers of two (XLA's flops per element), every input is read tile by tile (first from HBM, re-reads from
L2/L1 when the input fits there), the output is written once; warps follow the largest live tile (1 up to
512 elements, 2 up to 1024, 4 up to 16K, ...), and compute uses min(threads, 128) lanes on min(programs,
SMs) SMs; a tile over 40% of the block's registers is refused. Where the good tilings are many (rank 3 and
up), a descent from a 4-warp tile and a row tile (and the fusion's current tile) walks to the best
neighbour (one dimension doubled, halved, whole or one) while the time does not rise.

A tuple root (a multi-output Triton fusion) is tiled as XLA's SymbolicTileAnalysis tiles one: it needs exactly one
"real root", an output no other fused instruction reads (GetRootIndexing: "only simple multi-output fusions with one
real root"); the output tile is that root's, and every other output (an ancestor of it) takes the tile the
propagation gives it, which must cover it once: as many distinct tiles of it as there are programs
(TilingCoversWholeShapeUniquely; a tile it gets through a broadcast over several tiles, or a cutting slice,
does not). Every output is written once. XLA writes one output tile per output into the config
(BlockLevelParameters.output_tile_sizes); a config with a single tile for a tuple root gives the real root's. `triton_fusion_plan` is XLA's CanFuseTriton with the tiling its
PriorityFusion then gives the fused fusion: the one rule hlopt grows block-level Triton fusions by, in
`priority-fusion{triton_softmax_priority_fusion=true}` and in `triton-softmax-priority-fusion`.
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field
from typing import Any

from hlopt.cost_model.analysis import is_elementwise
from hlopt.hlo.ir import Computation, Instruction
from hlopt.hlo.shape import is_row_major

__all__ = ["FusedGraph", "TilingChoice", "best_tiling", "block_level_tile", "graph_of_fusion", "graph_of_pair",
           "is_generic_triton_fusion", "output_tiles", "outputs_of", "propagate_tiles", "tiled_root", "tiling_cost", "triton_config", "triton_fusion_plan",
           "unsupported_reason", "with_tiling"]


Tile = tuple[int, ...]

#: Element types the Triton emitter generates code for (XLA's triton_support, for the ops below).
_TYPES = {"pred", "s8", "s16", "s32", "s64", "f16", "bf16", "f32", "f64", "f8e5m2", "f8e4m3fn"}
_MOVERS = {"broadcast", "reduce", "bitcast", "reshape", "transpose", "slice", "iota"}
#: The largest tile (elements, padded) of any fused instruction: XLA's DoesTileFitsInRegisters (40% of the
#: 64K registers of a block).
_REGISTER_TILE_LIMIT = int(0.4 * 65536)
#: Up to this many good tilings all are tried; beyond, a descent from a few seeds.
_EXHAUSTIVE = 40
#: Steps of one descent; a tile of this many elements gets 4 warps (128 threads: every FP32 lane of an SM).
_MAX_STEPS = 64
_FULL_WARPS_TILE = 2048
_FREE = {"bitcast", "broadcast", "constant", "iota", "reshape", "slice", "transpose", "parameter", "tuple"}


@dataclass
class FusedGraph:
    """A would-be fused computation: `edges` gives the operands of every fused instruction (operands that
    are not keys are the fusion's inputs: parameters or outside values); `root` is its result."""

    root: Instruction
    edges: dict[Instruction, list[Instruction]] = field(default_factory=dict)
    _order: list[Instruction] | None = field(default=None, repr=False)
    _order_root: Instruction | None = field(default=None, repr=False)
    #: the graph as index lists, made on first use
    compiled: _Compiled | None = field(default=None, repr=False)

    def order(self) -> list[Instruction]:
        """The fused instructions, operands before users (the root last); computed once (a graph is not
        edited after it is built)."""
        if self._order is None or self._order_root is not self.root:
            self._order, self._order_root = self._post_order(), self.root
        return self._order

    def _post_order(self) -> list[Instruction]:
        seen: set[Instruction] = set()
        out: list[Instruction] = []
        stack: list[tuple[Instruction, bool]] = [(self.root, False)]
        while stack:
            inst, done = stack.pop()
            if done:
                out.append(inst)
                continue
            if inst in seen or inst not in self.edges:
                continue
            seen.add(inst)
            stack.append((inst, True))
            stack.extend((o, False) for o in reversed(self.edges[inst]) if o not in seen)
        return out

    def inputs(self) -> list[Instruction]:
        """The values read from outside the fusion (parameters and outside instructions), once each."""
        seen: dict[Instruction, None] = {}
        for inst in self.order():
            for o in self.edges[inst]:
                if o not in self.edges:
                    seen[o] = None
        return list(seen)


def outputs_of(graph: FusedGraph) -> list[Instruction]:
    """The values a fused graph outputs: a tuple root's elements, else the root."""
    root = graph.root
    return list(graph.edges.get(root, root.operands)) if root.opcode == "tuple" else [root]


def tiled_root(graph: FusedGraph) -> Instruction | str:
    """The output the output tile tiles: the root, or a tuple root's one real root (the one output no other
    fused instruction reads: XLA's SymbolicTileAnalysis::GetRootIndexing), or why there is none."""
    root = graph.root
    if root.opcode != "tuple":
        return root
    outputs = outputs_of(graph)
    if not outputs or any(o not in graph.edges for o in outputs):
        return f"{root.name}: an output that is not computed in the fusion"
    read = {o for inst, ops in graph.edges.items() if inst is not root for o in ops}
    real = list(dict.fromkeys(o for o in outputs if o not in read))
    if len(real) != 1:
        return f"{root.name}: only multi-output fusions with one real root are tiled ({len(real)} outputs unread)"
    return real[0]


def _out_dims(graph: FusedGraph) -> tuple[int, ...]:
    """The dimensions the output tile tiles: the tiled root's (none when there is no tiled root)."""
    root = tiled_root(graph)
    return () if isinstance(root, str) or root.shape.is_tuple else tuple(root.shape.dims)


def _add_body(graph: FusedGraph, fusion: Instruction, bound: dict[int, Instruction]) -> Instruction:
    """Put a fusion's body into `graph`, its parameter `n` read as `bound[n]` where given, else as the
    fusion's operand (so one outside value read by both parts is one input); its root."""
    body: Computation = fusion.attrs["calls"]
    alias: dict[Instruction, Instruction] = {}
    for inst in body.post_order():
        if inst.opcode == "parameter":
            number = inst.attrs["parameter_number"]
            alias[inst] = bound.get(number, fusion.operand(number))
            continue
        graph.edges[inst] = [alias.get(o, o) for o in inst.operands]
    return alias.get(body.root, body.root)


def graph_of_fusion(fusion: Instruction) -> FusedGraph:
    """The graph of an existing fusion's body."""
    graph = FusedGraph(fusion)
    graph.root = _add_body(graph, fusion, {})
    return graph


def graph_of_pair(producer: Instruction, consumer: Instruction, multi_output: bool = False) -> FusedGraph:
    """The graph of `producer` fused into `consumer` (each a fusion or a single instruction). With
    `multi_output` the producer's value is an output too, after the consumer's (XLA's
    HloFusionAdaptor::ForProducerConsumer with extra outputs, the fusion FuseInstructionIntoMultiOutput makes):
    the root is then a tuple of the consumer's outputs and the producer's, standing outside any computation."""
    graph = FusedGraph(consumer)
    if producer.opcode == "fusion":
        produced = _add_body(graph, producer, {})
    else:
        graph.edges[producer] = list(producer.operands)
        produced = producer
    if consumer.opcode == "fusion":
        bound = {n: produced for n, o in enumerate(consumer.operands) if o is producer}
        graph.root = _add_body(graph, consumer, bound)
    else:
        graph.edges[consumer] = [produced if o is producer else o for o in consumer.operands]
        graph.root = consumer
    if multi_output:
        outputs = outputs_of(graph) + [produced]
        if graph.root.opcode == "tuple":  # the consumer's own tuple root gives way to the new one
            del graph.edges[graph.root]
        from hlopt.hlo.shape import TupleShape

        tup = Instruction("tuple", TupleShape(tuple(o.shape for o in outputs)), name=f"{consumer.name}.outputs")
        graph.edges[tup] = outputs  # no operands of its own: the real instructions get no user
        graph.root = tup
    return graph


# ------------------------------------------------------------------------------------------ support


_FLOATS = {"bf16", "f16", "f32", "f64"}
_F8 = {"f8e5m2", "f8e4m3fn"}
_INTEGRAL = {"s8", "s16", "s32", "s64"}
_FLOAT_UNARY = {"cosine", "exponential", "exponential-minus-one", "floor", "ceil", "log", "log-plus-one", "rsqrt",
                "sine", "sqrt", "cbrt", "tan", "tanh", "erf"}


def _elementwise_supported(op: str, dtype: str) -> bool:
    """XLA's IsTritonSupportedElementwise: the unary, binary and ternary ops Triton generates per type."""
    if dtype == "pred":
        unary = {"convert", "not", "copy"}
    else:
        unary = {"abs", "convert", "copy"} | ({"negate"} if dtype not in _F8 else set()) \
            | ({"not"} if dtype in _INTEGRAL else set()) | (_FLOAT_UNARY if dtype in _FLOATS else set()) \
            | ({"reduce-precision"} if dtype in _FLOATS | _F8 else set())
    binary = set() if dtype in _F8 else {"add", "compare", "maximum", "minimum", "multiply"}
    if dtype == "pred":
        binary |= {"and", "or", "xor"}
    elif binary:
        binary.add("subtract")
        if dtype in _INTEGRAL:
            binary |= {"divide", "and", "or", "xor"}
        if dtype in ("f32", "f64"):
            binary |= {"atan2", "divide", "remainder", "power"}
        if dtype in ("bf16", "f16"):
            binary |= {"atan2", "power", "remainder"}
    ternary = {"select"} if dtype in _F8 else {"select", "clamp"}
    return op in unary or op in binary or op in ternary


def _reducer_supported(inst: Instruction) -> bool:
    reducer = inst.attrs.get("to_apply")
    if not isinstance(reducer, Computation) or reducer.root is None:
        return False
    return all(i.opcode == "parameter" or (i.opcode == "constant" and i.shape.rank == 0)
               or (not i.shape.is_tuple and _elementwise_supported(i.opcode, i.operand(i.operand_count - 1).shape.dtype))
               for i in reducer.instructions)


def _graph_reason(graph: FusedGraph) -> str | None:
    """Why a fused graph cannot be a block-level Triton fusion (an unsupported op; a tuple only as the root,
    over array outputs), or None."""
    for inst in graph.order():
        if inst is graph.root and inst.opcode == "tuple":
            outputs = outputs_of(graph)
            if not outputs or any(o.shape.is_tuple for o in outputs):
                return f"{inst.name}: a tuple root of tuples"
            real = tiled_root(graph)
            if isinstance(real, str):
                return real
            continue
        reason = unsupported_reason(inst)
        if reason:
            return reason
    return None


def unsupported_reason(inst: Instruction) -> str | None:
    """Why XLA's Triton emitter cannot take `inst` in a block-level fusion, or None if it can (XLA's
    IsTritonSupportedInstruction for the ops of these fusions: its data types, elementwise ops per type,
    reduces of one array over one dimension, scalar constants)."""
    shape = inst.shape
    if shape.is_tuple or shape.dtype not in _TYPES or any(shape.dynamic):
        return f"{inst.name}: type {shape} is not tiled by Triton"
    if any(o.shape.is_tuple or o.shape.dtype not in _TYPES for o in inst.operands):
        return f"{inst.name}: an operand's type is not tiled by Triton"
    if inst.has_side_effect:
        return f"{inst.name}: has a side effect"
    op = inst.opcode
    if op == "constant":
        return None if shape.numel == 1 else f"{inst.name}: only scalar constants are fused"
    if op == "reduce":
        if len(inst.operands) != 2 or len(inst.attrs.get("dimensions", ())) != 1 or not _reducer_supported(inst):
            return f"{inst.name}: only reduces of one array over one dimension with a supported reducer"
        return None
    if op == "slice":
        strides = [int(r[2]) for r in (inst.attrs.get("slice") or ())]
        return None if all(s == 1 for s in strides) else f"{inst.name}: strided slice"
    if op in _MOVERS:
        return None
    if op == "convert":
        return None
    if inst.operands and is_elementwise(inst) and _elementwise_supported(op, inst.operand(-1).shape.dtype):
        return None
    return f"{inst.name}: {op} is not fused into block-level Triton fusions"


# ------------------------------------------------------------------------------------- propagation


def _physical(dims: tuple[int, ...], inst: Instruction) -> tuple[list[int], list[int]]:
    """(physical dimensions major to minor, the logical dimension of each) of a value's layout."""
    layout = inst.shape.layout
    order = list(range(len(dims))) if layout is None or not layout.minor_to_major \
        else list(reversed(layout.minor_to_major))
    return [dims[d] for d in order], order


def _reshape_tile(out_dims: list[int], tile: list[int], in_dims: list[int]) -> list[int] | None:
    """The tile of a reshape's operand (row-major dims) for a `tile` of its result, or None if the tile is
    not a contiguous block of every merged or split group of dimensions."""
    i = j = 0
    result = [1] * len(in_dims)
    while i < len(out_dims) or j < len(in_dims):
        gi, gj = [i], [j]  # one group: the shortest runs of dims with equal products
        if i >= len(out_dims) or j >= len(in_dims):
            rest_out, rest_in = out_dims[i:], in_dims[j:]
            if any(d != 1 for d in rest_out + rest_in):
                return None
            break
        po, pi = out_dims[i], in_dims[j]
        i, j = i + 1, j + 1
        while po != pi:
            if po < pi:
                po *= out_dims[i]
                gi.append(i)
                i += 1
            else:
                pi *= in_dims[j]
                gj.append(j)
                j += 1
        count = _block_elements([out_dims[k] for k in gi], [tile[k] for k in gi])
        if count is None:
            return None
        filled = _fill_block([in_dims[k] for k in gj], count)
        if filled is None:
            return None
        for k, t in zip(gj, filled, strict=True):
            result[k] = t
    return result


def _block_elements(dims: list[int], tile: list[int]) -> int | None:
    """Elements of a tile that is a contiguous row-major block of `dims` (ones, then one partial dimension
    that divides its size, then whole dimensions), else None."""
    first = next((k for k, t in enumerate(tile) if t != 1), len(dims))
    if first < len(dims) and dims[first] % tile[first]:
        return None
    if any(t != d for d, t in zip(dims[first + 1:], tile[first + 1:], strict=True)):
        return None
    return math.prod(tile)


def _fill_block(dims: list[int], count: int) -> list[int] | None:
    """A contiguous row-major block of `count` elements of `dims`, filled from the minor dimension."""
    tile = [1] * len(dims)
    for k in range(len(dims) - 1, -1, -1):
        if count == 1:
            break
        d = dims[k]
        if count % d == 0:
            tile[k] = d
            count //= d
        elif d % count == 0:
            tile[k] = count
            count = 1
        else:
            return None
    return tile if count == 1 else None


def _operand_tile(graph: FusedGraph, inst: Instruction, index: int, tile: Tile) -> Tile | None:
    """The tile of operand `index` of `inst` that `tile` of `inst` needs, or None if not tileable."""
    operand = graph.edges[inst][index]
    dims = operand.shape.dims
    op = inst.opcode
    if op == "broadcast":
        return tuple(tile[d] for d in inst.attrs.get("dimensions", ()))
    if op == "reduce":
        if index == 1:
            return ()
        reduced = set(inst.attrs.get("dimensions", ()))
        kept = iter(tile)
        return tuple(d if k in reduced else next(kept) for k, d in enumerate(dims))
    if op == "transpose":
        perm = list(inst.attrs.get("dimensions", ()))
        out = [1] * len(dims)
        for k, p in enumerate(perm):
            out[p] = tile[k]
        return tuple(out)
    if op in ("bitcast", "reshape"):
        return _bitcast_tile(inst, operand, tile)
    if op == "slice":
        return tile
    if op == "tuple":  # a multi-output root is never propagated through: its real root takes the output tile
        return None
    if operand.shape.rank == 0:
        return ()
    return tile


def _bitcast_tile(inst: Instruction, operand: Instruction, tile: Tile) -> Tile | None:
    if inst.opcode == "reshape":
        out = _reshape_tile(list(inst.shape.dims), list(tile), list(operand.shape.dims))
        return None if out is None else tuple(out)
    out_dims, out_order = _physical(inst.shape.dims, inst)
    in_dims, in_order = _physical(operand.shape.dims, operand)
    physical = _reshape_tile(out_dims, [tile[d] for d in out_order], in_dims)
    if physical is None:
        return None
    logical = [1] * len(in_dims)
    for k, d in enumerate(in_order):
        logical[d] = physical[k]
    return tuple(logical)


def _groups(out_dims: list[int], in_dims: list[int]) -> list[tuple[list[int], list[int]]] | None:
    """The groups of a reshape: the shortest runs of result and operand dimensions with equal products."""
    i = j = 0
    groups = []
    while i < len(out_dims) and j < len(in_dims):
        gi, gj = [i], [j]
        po, pi = out_dims[i], in_dims[j]
        i, j = i + 1, j + 1
        while po != pi:
            if po < pi and i < len(out_dims):
                po *= out_dims[i]
                gi.append(i)
                i += 1
            elif pi < po and j < len(in_dims):
                pi *= in_dims[j]
                gj.append(j)
                j += 1
            else:
                return None
        groups.append((gi, gj))
    groups[-1:] = [(groups[-1][0] + list(range(i, len(out_dims))), groups[-1][1] + list(range(j, len(in_dims))))] \
        if groups else []
    return groups


def _reshaped_symbols(inst: Instruction, operand: Instruction, symbols: set[int]) -> set[int] | None:
    """The operand dimensions a reshape or bitcast maps the reduced (symbol) dimensions `symbols` of its result
    to, or None where a symbol would be split or merged with another dimension (XLA's SymbolicTileAnalysis
    cannot tile `s0 floordiv 4, s0 mod 4`)."""
    if not symbols:
        return set()
    if inst.opcode == "reshape":
        out_dims, out_order = list(inst.shape.dims), list(range(inst.shape.rank))
        in_dims, in_order = list(operand.shape.dims), list(range(operand.shape.rank))
    else:
        out_dims, out_order = _physical(inst.shape.dims, inst)
        in_dims, in_order = _physical(operand.shape.dims, operand)
    groups = _groups(out_dims, in_dims)
    if groups is None:
        return None
    mapped: set[int] = set()
    for gi, gj in groups:
        if not any(out_order[k] in symbols for k in gi):
            continue
        big_out = [k for k in gi if out_dims[k] != 1]
        big_in = [k for k in gj if in_dims[k] != 1]
        if len(big_out) > 1 or len(big_in) > 1:
            return None
        mapped.update(in_order[k] for k in big_in)
    return mapped


def _symbol_reason(graph: FusedGraph) -> str | None:
    """Why XLA's SymbolicTileAnalysis cannot tile the graph for any output tile: a reduced dimension (a symbol of
    the indexing maps) reaches a reshape or bitcast that splits it or merges it with another dimension."""
    symbols: dict[Instruction, set[int]] = {graph.root: set()}
    for inst in reversed(graph.order()):
        mine = symbols.get(inst)
        if mine is None:
            continue
        op = inst.opcode
        for k, operand in enumerate(graph.edges[inst]):
            if operand.shape.is_tuple or operand.shape.rank == 0:
                continue
            if op == "reduce":
                if k >= len(graph.edges[inst]) // 2:
                    continue
                reduced = set(inst.attrs.get("dimensions", ()))
                kept = [d for d in range(operand.shape.rank) if d not in reduced]
                want = reduced | {kept[d] for d in mine if d < len(kept)}
            elif op == "broadcast":
                want = {k2 for k2, d in enumerate(inst.attrs.get("dimensions", ())) if d in mine}
            elif op == "transpose":
                perm = list(inst.attrs.get("dimensions", ()))
                want = {perm[d] for d in mine if d < len(perm)}
            elif op in ("bitcast", "reshape"):
                found = _reshaped_symbols(inst, operand, mine)
                if found is None:
                    return f"{inst.name}: a reduced dimension is split or merged by a {op}"
                want = found
            else:
                want = {d for d in mine if d < operand.shape.rank}
            if operand in graph.edges:
                symbols.setdefault(operand, set()).update(want)
    return None


def _regroup_reason(graph: FusedGraph) -> str | None:
    """Why XLA's SymbolicTileAnalysis cannot tile the graph for any output tile: a chain of reshapes and row-major
    bitcasts (elementwise ops between them pass the indexing map on unchanged) that, composed, both splits and merges the
    dimensions of one group. XLA composes the indexing maps from the root, so a merge followed by a split
    ([8,256] -> [2048] -> [64,32]) reads the operand at `(d0 floordiv 8, (d0 mod 8) * 32 + d1)`, a sum with a
    remainder it cannot make a symbolic tile of, though each reshape alone can be tiled."""
    root = graph.root if graph.root.opcode != "tuple" else tiled_root(graph)
    if isinstance(root, str):
        return None  # reported by `_graph_reason`
    tops: dict[Instruction, set[tuple[int, ...]]] = {root: {tuple(root.shape.dims)}}  # where each chain starts
    for inst in reversed(graph.order()):
        mine = tops.get(inst)
        if not mine:
            continue
        op = inst.opcode
        for operand in graph.edges[inst]:
            if operand.shape.is_tuple or operand.shape.rank == 0:
                continue
            theirs = tuple(operand.shape.dims)
            if op == "reshape" or (op == "bitcast" and is_row_major(inst.shape) and is_row_major(operand.shape)):
                for top in mine:
                    groups = _groups(list(top), list(theirs))
                    if groups is None or any(sum(top[k] != 1 for k in gi) > 1 and sum(theirs[k] != 1 for k in gj) > 1
                                             for gi, gj in groups):
                        return (f"{inst.name}: the reshapes from {list(top)} to {list(theirs)} split and merge "
                                "dimensions at once")
                passed = mine
            elif is_elementwise(inst) and theirs == tuple(inst.shape.dims):
                passed = mine
            else:  # a new chain starts at the operand (a bitcast that changes the layout too: not followed)
                passed = {theirs}
            if operand in graph.edges:  # (an input is read where the chain ends: checked above)
                tops.setdefault(operand, set()).update(passed)
    return None


@functools.lru_cache(maxsize=65536)
def _padded(tile: Tile) -> int:
    return math.prod(1 << max(0, (t - 1).bit_length()) for t in tile) if tile else 1


class _Compiled:
    """A graph as index lists (no instruction hashing in the tilings' inner loop): fused instructions in
    post order (the root last), then the inputs."""

    def __init__(self, graph: FusedGraph):
        inside = graph.order()
        inputs = graph.inputs()
        self.nodes = inside + inputs
        self.inside = len(inside)
        index = {inst: i for i, inst in enumerate(self.nodes)}
        self.operands = [[index[o] for o in graph.edges[inst]] for inst in inside]
        self.memo: dict[tuple[int, int, Tile], Tile | None] = {}
        self.graph = graph
        #: where the output tile starts (the root, or a tuple root's real root) and the other outputs, by index
        real = tiled_root(graph)
        self.tileable = isinstance(real, Instruction)
        self.start = index[real] if isinstance(real, Instruction) else self.inside - 1
        self.others = sorted({index[o] for o in outputs_of(graph) if o in index} - {self.start}) \
            if graph.root.opcode == "tuple" else []
        self.out_dims = _out_dims(graph)
        #: per node: XLA's flops per element (fused instructions), (bytes per element, bytes) (inputs)
        self.costs: list | None = None

    def propagate(self, root_tile: Tile) -> list[set[Tile] | None] | str:
        tiles: list[set[Tile] | None] = [None] * len(self.nodes)
        tiles[self.start] = {tuple(root_tile)}
        memo, operands, graph, nodes = self.memo, self.operands, self.graph, self.nodes
        for i in range(self.inside - 1, -1, -1):
            mine = tiles[i]
            if mine is None:
                continue
            for tile in mine:
                for k, j in enumerate(operands[i]):
                    key = (i, k, tile)
                    want = memo.get(key, key)
                    if want is key:
                        want = memo[key] = _operand_tile(graph, nodes[i], k, tile)
                    if want is None:
                        return f"{nodes[i].name}: tile {list(tile)} is not a contiguous block of its operand"
                    there = tiles[j]
                    if there is None:
                        tiles[j] = {want}
                    else:
                        there.add(want)
        if self.others:
            why = self._covered(tiles, root_tile)
            if why:
                return why
        return tiles

    def _covered(self, tiles: list[set[Tile] | None], root_tile: Tile) -> str | None:
        """Why an output other than the real root is not covered once by the programs' tiles (XLA's
        TilingCoversWholeShapeUniquely, as a count: one of its tiles splits it into as many tiles as there are
        programs), or None."""
        programs = math.prod(-(-d // max(t, 1)) for d, t in zip(self.out_dims, root_tile, strict=True))
        for j in self.others:
            node = self.nodes[j]
            dims = node.shape.dims
            if not any(math.prod(-(-d // max(t, 1)) for d, t in zip(dims, tile, strict=True)) == programs
                       for tile in tiles[j] or ()):
                return f"output {node.name}: no tiling to reuse for it (its tiles do not cover it once per program)"
        return None


def _compiled(graph: FusedGraph) -> _Compiled:
    if graph.compiled is None or graph.compiled.graph.root is not graph.root:
        graph.compiled = _Compiled(graph)
    return graph.compiled


def propagate_tiles(graph: FusedGraph, root_tile: Tile) -> dict[Instruction, set[Tile]] | str:
    """The tiles every fused instruction and input is evaluated over for `root_tile` of the root, or the
    reason the fusion cannot be tiled that way."""
    compiled = _compiled(graph)
    if not compiled.tileable:
        real = tiled_root(graph)
        return real if isinstance(real, str) else "no tiled root"
    if len(root_tile) != len(compiled.out_dims):
        return "the output tile does not match the root's rank"
    tiles = compiled.propagate(tuple(root_tile))
    if isinstance(tiles, str):
        return tiles
    return {compiled.nodes[i]: t for i, t in enumerate(tiles) if t is not None}


# ------------------------------------------------------------------------------------------ choice


@dataclass(frozen=True)
class TilingChoice:
    """An output tile of a fusion, the warps XLA gives it and its modelled time (microseconds)."""

    tile: Tile
    cost_us: float
    programs: int
    num_warps: int


def _num_warps(largest_tile: int) -> int:
    """XLA's warps per program for the largest live tile (GetNumWarps)."""
    for limit, warps in ((512, 1), (1024, 2), (16384, 4), (32768, 8), (65536, 16)):
        if largest_tile <= limit:
            return warps
    return 32


def _flops_per_element(inst: Instruction, profile: str) -> float:
    from hlopt.cost_model.op_profiles import cycles_per_element

    op = inst.opcode
    if op in _FREE:
        return 0.0
    if op == "reduce":
        reducer: Computation = inst.attrs["to_apply"]
        factor = inst.operand(0).shape.numel // max(1, inst.shape.numel)
        return (factor - 1) * float(cycles_per_element(profile, reducer.root.opcode, inst.shape.dtype))
    return float(cycles_per_element(profile, op, inst.shape.dtype))


def _input_bytes(inst: Instruction) -> tuple[int, int] | None:
    """(bytes per element, bytes) of an input the kernel reads (None for scalar constants)."""
    if inst.opcode == "constant" or not inst.shape.rank:
        return None
    size = max(1, inst.shape.element_type.bits // 8)
    return size, inst.shape.numel * size


def tiling_cost(graph: FusedGraph, tile: Tile, device: str = "h100") -> TilingChoice | None:
    """XLA's indexing cost model of `graph` tiled with output `tile` (EstimateRunTimeForTiledHloComputation:
    padded tiles computed per program, tiles read per program from HBM then caches, the output written once,
    compute and memory overlapped), or None if it cannot be tiled so or a tile overflows the registers."""
    from hlopt.cost_model.devices import get_device
    from hlopt.cost_model.kernel import combine, compute_time_s, read_time_s, write_time_s

    compiled = _compiled(graph)
    dims = compiled.out_dims
    if len(tile) != len(dims) or not compiled.tileable:
        return None
    tiles = compiled.propagate(tuple(tile))
    if isinstance(tiles, str):
        return None
    spec = get_device(device)
    if compiled.costs is None:
        compiled.costs = [_flops_per_element(inst, spec.op_profile) for inst in compiled.nodes[:compiled.inside]] \
            + [_input_bytes(inst) for inst in compiled.nodes[compiled.inside:]]
    programs = math.prod(-(-d // max(t, 1)) for d, t in zip(dims, tile, strict=True))
    flops = 0.0
    largest = 1
    read_s = 0.0
    for i, its_tiles in enumerate(tiles):
        if its_tiles is None:
            continue
        padded = [_padded(t) for t in its_tiles]
        largest = max(largest, *padded)
        if i < compiled.inside:
            flops += compiled.costs[i] * programs * sum(padded)
        elif compiled.costs[i]:
            size, whole = compiled.costs[i]
            total = programs * sum(math.prod(t) for t in its_tiles) * size
            read_s += read_time_s(spec, programs, min(whole, total), total, size)
    if largest > _REGISTER_TILE_LIMIT:
        return None
    warps = _num_warps(largest)
    compute_s = compute_time_s(spec, flops, programs, warps * 32)
    outputs = outputs_of(graph)
    written = sum(o.shape.numel * max(1, o.shape.element_type.bits // 8) for o in outputs)
    cost = combine(compute_s, read_s + write_time_s(spec, written)) * 1e6
    return TilingChoice(tuple(tile), cost, programs, warps)


def _candidates(dims: tuple[int, ...]) -> list[Tile]:
    """XLA's good tilings: per dimension every power of two below its size, and its size."""
    per_dim = [sorted({1 << k for k in range(max(1, d).bit_length()) if 1 << k < d} | {d}) for d in dims]
    out: list[Tile] = [()]
    for options in per_dim:
        out = [t + (o,) for t in out for o in options if math.prod(t) * o <= _REGISTER_TILE_LIMIT]
    return out


def _neighbours(tile: Tile, dims: tuple[int, ...]) -> list[Tile]:
    """Tiles one step from `tile` among the good tilings: one dimension doubled, halved, whole or one."""
    out = []
    for k, (t, d) in enumerate(zip(tile, dims, strict=True)):
        below = 1 << max(0, (t - 1).bit_length() - 1) if t > 1 else 1  # the next good size down
        above = 1 << t.bit_length() if t & (t - 1) == 0 else 1 << (t - 1).bit_length()
        for size in {min(above, d), d, below, 1}:
            if size != t and (size == d or size & (size - 1) == 0):
                out.append(tile[:k] + (size,) + tile[k + 1:])
    return out


def _search(graph: FusedGraph, dims: tuple[int, ...], seeds: list[Tile], device: str) -> TilingChoice | None:
    """The best of XLA's good tilings: all of them when few, else a descent from `seeds` over neighbours."""
    candidates = _candidates(dims)
    if len(candidates) <= _EXHAUSTIVE:
        scored = (tiling_cost(graph, t, device) for t in candidates)
        return min((c for c in scored if c is not None), key=lambda c: c.cost_us, default=None)
    seen: dict[Tile, TilingChoice | None] = {}

    def cost(tile: Tile) -> TilingChoice | None:
        if tile not in seen:
            seen[tile] = tiling_cost(graph, tile, device) if _padded(tile) <= _REGISTER_TILE_LIMIT else None
        return seen[tile]

    best: TilingChoice | None = None
    for seed in seeds:
        here = cost(seed)
        walked = {seed}
        for _ in range(_MAX_STEPS):
            if here is None:
                break
            if best is None or here.cost_us < best.cost_us:
                best = here
            step = min((c for c in map(cost, _neighbours(here.tile, dims)) if c is not None and c.tile not in walked),
                       key=lambda c: c.cost_us, default=None)
            if step is None or step.cost_us > here.cost_us:  # equal costs: walk on (plateaus of warps)
                break
            here = step
            walked.add(here.tile)
    return best


def _row_seed(dims: tuple[int, ...], room: int = _REGISTER_TILE_LIMIT) -> Tile:
    """Ones in the major dimensions, then minor ones whole (a power of two of the first that does not fit)
    while they fit `room` elements."""
    tile = [1] * len(dims)
    for k in range(len(dims) - 1, -1, -1):
        if _padded((dims[k],)) > room:
            tile[k] = max(1, min(dims[k], room))
            break
        tile[k] = dims[k]
        room //= _padded((dims[k],))
    return tuple(tile)


def best_tiling(graph: FusedGraph, keep: Tile | None = None, device: str = "h100") -> TilingChoice | str:
    """The output tile of `graph` with the least modelled time among XLA's good tilings
    (TryFindBestTilingForFusion; searched by descent where they are many), or why it cannot be tiled.
    `keep`, the tile a fusion has now, stays when it is valid and within 1% of the best."""
    reason = _graph_reason(graph) or _symbol_reason(graph) or _regroup_reason(graph)
    if reason is not None:
        return reason
    for inst in graph.inputs():
        if inst.shape.is_tuple:
            return f"{inst.name}: a tuple input"
    dims = _out_dims(graph)
    ones = tuple(1 for _ in dims)
    seeds = list(dict.fromkeys(t for t in (_row_seed(dims, _FULL_WARPS_TILE), _row_seed(dims), tuple(keep)
                                           if keep is not None and len(keep) == len(dims) else None) if t is not None))
    best = _search(graph, dims, seeds, device) or _search(graph, dims, [ones], device)
    if best is None:
        found = propagate_tiles(graph, ones)
        return found if isinstance(found, str) else "no tiling fits the registers"
    if keep is not None and tuple(keep) != best.tile:
        kept = tiling_cost(graph, tuple(keep), device)
        if kept is not None and kept.cost_us <= best.cost_us * 1.01:
            return kept
    return best


# --------------------------------------------------------------------- Triton fusions of a module


def triton_config(fusion: Instruction) -> dict[str, Any] | None:
    """A fresh copy of the backend config of a block-level `__triton` fusion with one output tile (a
    multi-output one: one per output, or one), else None (callers edit it)."""
    if fusion.opcode != "fusion" or str(fusion.get("kind")) != "kCustom" or not fusion.backend_config:
        return None
    backend = fusion.backend_config_value("fusion_backend_config")
    if not isinstance(backend, dict) or backend.get("kind") != "__triton":
        return None
    tiles = (backend.get("block_level_fusion_config") or {}).get("output_tiles") or []
    outputs = len(fusion.shape.elements) if fusion.shape.is_tuple else 1
    return fusion.backend_config_json() if len(tiles) in (1, outputs) else None


def is_generic_triton_fusion(inst: Instruction) -> bool:
    """XLA's IsGenericTritonFusion: a kCustom fusion whose backend kind is `__triton` (block-level)."""
    return triton_config(inst) is not None


def block_level_tile(fusion: Instruction) -> Tile | None:
    """The output tile of a block-level `__triton` fusion (`cost_model.tiles.output_tile`) when it tiles the
    fusion's output (a tuple root: its real root, module docstring), else None."""
    from hlopt.cost_model.tiles import output_tile

    if not is_generic_triton_fusion(fusion):
        return None
    tile = output_tile(fusion)
    if tile is None:
        return None
    shape = fusion.shape
    if shape.is_tuple:  # a multi-output fusion: its real root's tile (one per output, or the only one)
        graph = graph_of_fusion(fusion)
        real = tiled_root(graph)
        if isinstance(real, str) or real.shape.is_tuple:
            return None
        tiles = fusion.backend_config_value("fusion_backend_config", "block_level_fusion_config", "output_tiles")
        outputs = outputs_of(graph)
        if isinstance(tiles, list) and len(tiles) == len(outputs) > 1:
            tile = [int(t) for t in tiles[outputs.index(real)].get("sizes", [])]
        rank = real.shape.rank
    else:
        rank = shape.rank
    return tuple(tile) if rank == len(tile) else None


def output_tiles(graph: FusedGraph, choice: TilingChoice) -> list[Tile]:
    """The tile of every output of `graph` at `choice` (XLA's BlockLevelParameters.output_tile_sizes, one per
    root in output order): the chosen tile, or for a tuple root each output's tile that covers it once."""
    if graph.root.opcode != "tuple":
        return [choice.tile]
    compiled = _compiled(graph)
    tiles = compiled.propagate(choice.tile)
    if isinstance(tiles, str):
        raise ValueError(tiles)
    programs = choice.programs
    index = {inst: i for i, inst in enumerate(compiled.nodes)}
    out = []
    for o in outputs_of(graph):
        dims = o.shape.dims
        own = sorted(tiles[index[o]] or ())
        out.append(next(t for t in own if math.prod(-(-d // max(k, 1)) for d, k in zip(dims, t, strict=True))
                        == programs) if index[o] != compiled.start else choice.tile)
    return out


def with_tiling(cfg: dict[str, Any], choice: TilingChoice, tiles: list[Tile] | None = None) -> dict[str, Any]:
    """`cfg` with `choice`'s output tile and warps (what XLA's Fuse writes into a grown Triton fusion);
    `tiles`: one tile per output of a multi-output fusion (`output_tiles`) instead."""
    out = copy.deepcopy(cfg)
    block = out["fusion_backend_config"]["block_level_fusion_config"]
    block["output_tiles"] = [{"sizes": [str(t) for t in tile]} for tile in (tiles or [choice.tile])]
    block["num_warps"] = str(choice.num_warps)
    out.pop("reification_cost", None)
    return out


_NOT_FUSED = frozenset({"fusion", "parameter", "constant", "tuple", "get-tuple-element"})


def _other_side_reason(other: Instruction) -> str | None:
    """Why the non-Triton side of a pair cannot join a Triton fusion (XLA's IsFusible and
    IsTritonSupported on it), or None."""
    if other.opcode == "fusion":
        return None if str(other.get("kind")) in ("kLoop", "kInput") else f"%{other.name} is not a fusible fusion"
    if other.opcode in _NOT_FUSED or other.has_side_effect or other.has_control_dependencies:
        return f"%{other.name} ({other.opcode}) is not Triton-fusible"
    reason = unsupported_reason(other)
    return None if reason is None else f"%{other.name} is not Triton-fusible: {reason}"


def triton_fusion_plan(producer: Instruction, consumer: Instruction, device: str = "h100", heroless: bool = False,
                       multi_output: bool = False) -> tuple[dict[str, Any], TilingChoice] | str:
    """XLA's PriorityFusion CanFuseTriton for a pair where the producer or the consumer is a block-level
    Triton fusion (with `heroless`, XLA's xla_gpu_experimental_enable_triton_heroless_priority_fusion: any pair
    of fusible, Triton-supported sides), with the tiling its Fuse gives the result: (the fused fusion's backend
    config, its tiling: the best of XLA's good tilings by XLA's indexing cost model, the consumer's own tile
    kept within 1%), or why not (a side is not fusible or not Triton-supported, or the fused computation
    cannot be tiled). With `multi_output` the producer stays an output of the fused fusion (XLA's CanFuseTriton
    with use_multi_output_fusion: `graph_of_pair(..., multi_output=True)`), and the config has a tile per output."""
    sides = [x for x in (producer, consumer) if is_generic_triton_fusion(x)]
    if not sides and not heroless:
        return "neither side is a block-level Triton fusion"
    for other in (producer, consumer):
        if other not in sides:
            reason = _other_side_reason(other)
            if reason:
                return reason
    graph = graph_of_pair(producer, consumer, multi_output)
    choice = best_tiling(graph, keep=block_level_tile(consumer), device=device)
    if isinstance(choice, str):
        return f"the fused computation cannot be tiled ({choice})"
    cfg = triton_config(sides[-1]) if sides else _fresh_triton_config()
    assert cfg is not None
    tiles = output_tiles(graph, choice) if graph.root.opcode == "tuple" else None
    return with_tiling(cfg, choice, tiles), choice


def _fresh_triton_config() -> dict[str, Any]:
    """The backend config of a new block-level Triton fusion (its tiling is filled in by `with_tiling`)."""
    return {"fusion_backend_config": {"kind": "__triton",
                                      "block_level_fusion_config": {"output_tiles": [], "num_warps": "1"}}}
