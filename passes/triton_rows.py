"""Row tiling of XLA:GPU's block-level Triton normalization fusions (`__triton`), for
`priority-fusion{triton_softmax_priority_fusion=true}`: whether a producer/consumer pair with a Triton side
still splits into whole rows once fused (XLA's CanFuseTriton, checked conservatively), and the fused
fusion's output tile.

Row-tileable: every value is a scalar, a row value (one element per row), a column value (one row's worth,
the same for every row, such as a layer norm's scale) or a full value (rows x row length); reduces reduce
exactly the minor dimensions that make one row, broadcasts add exactly those, bitcasts keep rows whole,
layouts are row-major, and the root is a full or a row value. A full root's output tile is whole rows (as
XLA's own normalization fusions have it, one or several rows per program); a row root's tile is 1 in every
dimension. `passes/triton_tiling.py` is the general tiling analysis (XLA's SymbolicTileAnalysis) that
`triton-softmax-priority-fusion` uses; this module keeps the row rule priority-fusion's queue was tuned with.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from hlopt.cost_model.analysis import is_elementwise
from hlopt.hlo.ir import Computation, Instruction

__all__ = ["triton_config", "triton_row_geometry", "row_tile", "is_generic_triton_fusion", "triton_fusion_plan"]

SCALAR, ROW, COLUMN, FULL = "scalar", "row", "column", "full"
_REDUCERS = {"add", "maximum", "minimum", "multiply", "and", "or"}
_MOVERS = {"broadcast", "reduce", "bitcast", "reshape"}


def triton_config(fusion: Instruction) -> dict[str, Any] | None:
    """The parsed backend config of a block-level `__triton` fusion with one output tile, else None."""
    if fusion.opcode != "fusion" or str(fusion.get("kind")) != "kCustom" or not fusion.backend_config:
        return None
    backend = fusion.backend_config_value("fusion_backend_config")
    if not isinstance(backend, dict) or backend.get("kind") != "__triton":
        return None
    tiles = (backend.get("block_level_fusion_config") or {}).get("output_tiles") or []
    return fusion.backend_config_json() if len(tiles) == 1 else None  # a fresh copy: callers edit it


def _row_major(inst: Instruction) -> bool:
    layout = inst.shape.layout
    return layout is None or tuple(layout.minor_to_major) == tuple(range(inst.shape.rank - 1, -1, -1))


def _minor_split(dims: tuple[int, ...], row: int) -> int | None:
    """How many minor dimensions make one row of `row` elements (None if no suffix does)."""
    product = 1
    for k in range(1, len(dims) + 1):
        product *= dims[-k]
        if product == row:
            return k
        if product > row:
            return None
    return None


def row_tile(dims: tuple[int, ...], row: int) -> list[int] | None:
    """One row of a full value as an output tile: 1 for the major dimensions, whole minor ones."""
    k = _minor_split(dims, row)
    return None if k is None else [1] * (len(dims) - k) + list(dims[len(dims) - k:])


def _reduce_geometry(fusion: Instruction) -> tuple[int, int] | None:
    """(rows, row length) of a row-root Triton fusion, from the row reductions in its body."""
    found = {(r.shape.numel, r.operand(0).shape.numel // max(1, r.shape.numel))
             for r in fusion.attrs["calls"].instructions if r.opcode == "reduce" and not r.shape.is_tuple}
    if len(found) != 1:
        return None
    rows, row = found.pop()
    return (rows, row) if rows == fusion.shape.numel else None


def _whole_minor_size(dims: tuple[int, ...], sizes: list[int]) -> int:
    """The row length of a tile: the product of the minor dimensions the tile covers whole (XLA's normalization
    tiles take one or a few rows per program: [1, 512] of [16, 512], [1, 4, 128] of [8, 128, 128])."""
    row = 1
    for d in range(len(dims) - 1, -1, -1):
        if sizes[d] != dims[d]:
            break
        row *= dims[d]
    return row


def triton_row_geometry(fusion: Instruction) -> tuple[int, int] | None:
    """(rows, row length) of a `__triton` fusion whose output tile is one whole row (or, for a row root, a
    single element of it), else None."""
    cfg = triton_config(fusion)
    if cfg is None or fusion.shape.is_tuple or not _row_major(fusion):
        return None
    sizes = [int(s) for s in cfg["fusion_backend_config"]["block_level_fusion_config"]["output_tiles"][0]["sizes"]]
    dims = fusion.shape.dims
    if len(sizes) != len(dims):
        return None
    if sizes and math.prod(sizes) == 1:
        geometry = _reduce_geometry(fusion)
        rows, row = geometry if geometry is not None else (0, 0)
    else:
        row = _whole_minor_size(dims, sizes)
        rows = fusion.shape.numel // row if row > 1 else 0
    return (rows, row) if rows > 1 and row > 1 and rows != row else None


class _RowClasses:
    """Scalar / row / full classes of the values of a would-be fused computation, or a reason why not."""

    def __init__(self, rows: int, row: int):
        self.rows, self.row = rows, row
        self.of: dict[Instruction, str] = {}

    def by_size(self, inst: Instruction) -> str | None:
        shape = inst.shape
        if shape.is_tuple or not _row_major(inst):
            return None
        n = shape.numel
        if n == 1:
            return SCALAR
        if n == self.rows:
            return ROW
        if n == self.row:
            return COLUMN
        if n == self.rows * self.row and _minor_split(shape.dims, self.row) is not None:
            return FULL
        return None

    def value(self, inst: Instruction) -> str | None:
        """The class of an operand: known, or an outside value (a parameter) classed by its size."""
        if inst not in self.of:
            cls = self.by_size(inst)
            if cls is None:
                return None
            self.of[inst] = cls
        return self.of[inst]

    def add(self, inst: Instruction, operands: list[Instruction]) -> bool:
        """Class `inst` (its operands as given); False if the result would not be row-tileable."""
        classes = [self.value(o) for o in operands]
        own = self.by_size(inst)
        if own is None or any(c is None for c in classes):
            return False
        if not self._allowed(inst, operands, classes, own):
            return False
        self.of[inst] = own
        return True

    def _allowed(self, inst: Instruction, operands: list[Instruction], classes: list[str | None],
                 own: str) -> bool:
        op = inst.opcode
        if op == "parameter":
            return True
        if op == "constant":
            return own == SCALAR
        if op == "broadcast":
            return self._broadcast_ok(inst, classes[0], own)
        if op == "reduce":
            return self._reduce_ok(inst, operands, classes, own)
        if op in ("bitcast", "reshape"):
            return classes[0] == own
        if is_elementwise(inst) and op not in ("rng", "rng-bit-generator", "map"):
            return all(c == own for c in classes)
        return False

    def _broadcast_ok(self, inst: Instruction, source: str | None, own: str) -> bool:
        if source == SCALAR or source == own:
            return source == SCALAR or inst.shape.numel == inst.operand(0).shape.numel
        k = _minor_split(inst.shape.dims, self.row)
        if source not in (ROW, COLUMN) or own != FULL or k is None:
            return False
        major = inst.shape.rank - k
        mapped = tuple(inst.attrs.get("dimensions", ()))
        if source == COLUMN:  # the same vector for every row: it must cover the minor dimensions in order
            return mapped == tuple(range(major, inst.shape.rank)) \
                and inst.operand(0).shape.dims == inst.shape.dims[major:]
        return all(d < major for d in mapped)

    def _reduce_ok(self, inst: Instruction, operands: list[Instruction], classes: list[str | None],
                   own: str) -> bool:
        reducer = inst.attrs.get("to_apply")
        root = reducer.root if isinstance(reducer, Computation) else None
        if root is None or root.opcode not in _REDUCERS or len(operands) != 2 or classes[1] != SCALAR:
            return False
        dims = operands[0].shape.dims
        if classes[0] != FULL or own != ROW:
            return False
        k = _minor_split(dims, self.row)
        return k is not None and set(inst.attrs.get("dimensions", ())) == set(range(len(dims) - k, len(dims)))


def _body(fusion: Instruction) -> list[Instruction]:
    return list(fusion.attrs["calls"].post_order())


def _classes_of_fusion(classes: _RowClasses, fusion: Instruction, outer: dict[Instruction, Instruction]) -> bool:
    """Class a fusion's body; its parameters read `outer` values (classes given) or their own size."""
    for inst in _body(fusion):
        if inst.opcode == "parameter":
            value = fusion.operand(inst.attrs["parameter_number"])
            source = outer.get(value)
            cls = classes.value(source) if source is not None else classes.value(inst)
            if cls is None:
                return False
            classes.of[inst] = cls
        elif not classes.add(inst, list(inst.operands)):
            return False
    return True


def _fused_tile(producer: Instruction, consumer: Instruction, geometry: tuple[int, int]) -> list[int] | None:
    """The output tile of `producer` fused into `consumer` if row-tileable (full or row root), else None."""
    classes = _RowClasses(*geometry)
    if producer.opcode == "fusion":
        if not _classes_of_fusion(classes, producer, {}):
            return None
        produced = producer.attrs["calls"].root
    else:
        if not classes.add(producer, list(producer.operands)):
            return None
        produced = producer
    if consumer.opcode == "fusion":
        if not _classes_of_fusion(classes, consumer, {producer: produced}):
            return None
        root = consumer.attrs["calls"].root
    else:
        ops = [produced if o is producer else o for o in consumer.operands]
        if not classes.add(consumer, ops):
            return None
        root = consumer
    if classes.of.get(root) == ROW:
        return [1] * consumer.shape.rank
    if classes.of.get(root) != FULL:
        return None
    return row_tile(consumer.shape.dims, geometry[1])


def is_generic_triton_fusion(inst: Instruction) -> bool:
    """XLA's IsGenericTritonFusion: a kCustom fusion whose backend kind is `__triton` (block-level)."""
    return triton_config(inst) is not None


def triton_fusion_plan(producer: Instruction, consumer: Instruction) -> tuple[dict[str, Any], list[int]] | str:
    """XLA's PriorityFusion CanFuseTriton, for a pair where the producer or the consumer is a block-level Triton
    fusion: (the fused fusion's backend config, its output tile) when the fused result stays row-tileable, else
    why not. The other side must be fusible and Triton-supported (a single elementwise op or row mover, or a
    fusion of them); both Triton sides must tile the same rows."""
    sides = [x for x in (producer, consumer) if is_generic_triton_fusion(x)]
    geometries = {triton_row_geometry(x) for x in sides}
    if not sides or len(geometries) != 1 or None in geometries:
        return "the Triton fusion is not a row-tiled normalization hlopt can tile"
    geometry = geometries.pop()
    assert geometry is not None
    for other in (producer, consumer):
        if other in sides:
            continue
        if other.opcode == "fusion":
            if str(other.get("kind")) not in ("kLoop", "kInput"):
                return f"%{other.name} is not a fusible fusion"
        elif not _single_fusible(other) or other.has_side_effect or other.has_control_dependencies:
            return f"%{other.name} ({other.opcode}) is not Triton-fusible"
    tile = _fused_tile(producer, consumer, geometry)
    if tile is None:
        return "the fused computation cannot be tiled by rows"
    cfg = triton_config(sides[-1])
    assert cfg is not None
    return _with_tile(cfg, tile), tile


def _single_fusible(inst: Instruction) -> bool:
    """An op XLA's PriorityFusion may fuse into a Triton fusion: elementwise (no map) or a row mover."""
    return inst.opcode in _MOVERS or (is_elementwise(inst) and inst.opcode not in ("fusion", "map"))


def _with_tile(cfg: dict[str, Any], tile: list[int]) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    out["fusion_backend_config"]["block_level_fusion_config"]["output_tiles"] = [{"sizes": [str(t) for t in tile]}]
    return out
