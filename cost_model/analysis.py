"""Flops, transcendentals and bytes accessed per instruction, with XLA's HloCostAnalysis semantics.

`CostAnalysis` reproduces XLA's generic HloCostAnalysis (xla/service/hlo_cost_analysis.cc), the numbers
`jax`'s `hlo_module_cost_analysis` reports: elementwise ops count one flop (or one transcendental) per
output element; dot and convolution 2 flops per multiply-add; reduce, reduce-window, map, scatter and
select-and-scatter their sub-computation's flops per application; sort n*ceil(log2 n); fft
8*prod(log2 n)*elements. Bytes accessed default to operand bytes + output bytes, with the exceptions XLA
makes (slices, gathers and dynamic-update-slices touch only the moved part; bitcasts, tuples and
get-tuple-element move pointers). A fusion counts the flops of its fused instructions but only its external
bytes: outputs, large constants, and per parameter the bytes its fused users read. while loops count their
body and condition once; a conditional the maximum over its branches. Custom calls are opaque (XLA
reports -1 for them; see `Cost.xla_flops`).

`GpuCostAnalysis` is the variant XLA:GPU's performance model reads (xla/service/gpu/model/
gpu_hlo_cost_analysis.cc): elementwise flops are weighted by measured cycles per element
(`cost_model.op_profiles`), fusions weight each fused instruction's flops by how often it is evaluated
per output (its "utilization") and read each parameter `size * utilization` bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hlopt.hlo.ir import Computation, Instruction
from hlopt.hlo.opcodes import BINARY_ELEMENTWISE, TERNARY_ELEMENTWISE, UNARY_ELEMENTWISE
from hlopt.hlo.shape import Shape, TupleShape

__all__ = ["Cost", "CostAnalysis", "GpuCostAnalysis", "instruction_cost", "computation_cost", "module_cost",
           "TRANSCENDENTAL", "NO_DATA", "ELEMENTWISE_OPS", "shape_size", "leaf_bytes", "elements", "is_elementwise",
           "transpose_is_bitcast"]

#: Opcodes XLA's HloCostAnalysis counts as transcendentals (one per output element).
TRANSCENDENTAL = frozenset({
    "exponential", "log", "logistic", "power", "sqrt", "cbrt", "rsqrt", "tanh", "sine", "cosine",
    "exponential-minus-one", "log-plus-one", "atan2", "erf", "tan",
})
#: Opcodes that reach XLA's elementwise handler.
ELEMENTWISE_OPS = (UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | TERNARY_ELEMENTWISE) - {"copy"}
#: Instructions that move no data and do no work of their own.
NO_DATA = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
                     "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain"})
_POINTER_BYTES = 8
_ZERO_BYTES = frozenset({"get-tuple-element", "bitcast", "domain", "after-all", "add-dependency"})
_OPAQUE = frozenset({"custom-call"})


@dataclass
class Cost:
    """What one instruction does, as XLA's HloCostAnalysis properties.

    `operand_bytes` / `operand_utilization` are per operand index (XLA's "bytes accessed{i}" and
    "utilization{i}"). `xla_flops_delta` / `xla_bytes_delta` are what XLA's totals differ by: XLA counts
    an opaque instruction (custom-call) as -1 flops and -1 bytes, we count 0 flops and its operand and
    output bytes.
    """

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0
    output_bytes: float = 0.0
    operand_bytes: dict[int, float] = field(default_factory=dict)
    operand_utilization: dict[int, float] = field(default_factory=dict)
    xla_flops_delta: float = 0.0
    xla_bytes_delta: float = 0.0
    opaque: int = 0

    def __iadd__(self, other: Cost) -> Cost:
        self.flops += other.flops
        self.transcendentals += other.transcendentals
        self.bytes_accessed += other.bytes_accessed
        self.xla_flops_delta += other.xla_flops_delta
        self.xla_bytes_delta += other.xla_bytes_delta
        self.opaque += other.opaque
        return self

    @property
    def xla_flops(self) -> float:
        """Flops as XLA's HloCostAnalysis reports them (-1 per opaque instruction)."""
        return self.flops + self.xla_flops_delta

    @property
    def xla_bytes(self) -> float:
        """Bytes accessed as XLA's HloCostAnalysis reports them."""
        return self.bytes_accessed + self.xla_bytes_delta

    def xla_totals(self) -> dict[str, float]:
        """The totals exactly as XLA's HloCostAnalysis reports them (what `hlopt cost --json` prints):
        flops, transcendentals, bytes accessed (an opaque custom call, e.g. a `Sharding` annotation or a
        LAPACK call, counts -1 flops and -1 bytes), and how many opaque instructions there were."""
        return {"flops": self.xla_flops, "transcendentals": self.transcendentals,
                "bytes_accessed": self.xla_bytes, "opaque_instructions": float(self.opaque)}

    def totals(self) -> Cost:
        """A copy with the summable fields only (no per-operand detail)."""
        return Cost(self.flops, self.transcendentals, self.bytes_accessed, self.output_bytes,
                    xla_flops_delta=self.xla_flops_delta, xla_bytes_delta=self.xla_bytes_delta, opaque=self.opaque)


# ------------------------------------------------------------------------------------------ shapes


def shape_size(shape: Shape | TupleShape) -> float:
    """Bytes of a shape as XLA:CPU/GPU size it: arrays packed, tuples as 8-byte pointer tables."""
    if shape.is_tuple:
        return float(_POINTER_BYTES * len(shape.elements))
    if shape.dtype == "token":
        return 0.0
    if shape.dtype == "opaque":
        return float(_POINTER_BYTES)
    return float(shape.byte_size)


def leaf_bytes(shape: Shape | TupleShape) -> float:
    """Bytes of all array leaves (what XLA charges for writing a tuple-shaped result)."""
    if not shape.is_tuple:
        return shape_size(shape)
    return sum(shape_size(s) for s in shape.leaves())


def elements(shape: Shape | TupleShape) -> int:
    """Element count; for a tuple, the sum over its leaves (XLA's ElementsInRecursive)."""
    if shape.is_tuple:
        return sum(s.numel for s in shape.leaves() if s.dtype != "token")
    return shape.numel


def _first_array(shape: Shape | TupleShape) -> Shape:
    while shape.is_tuple:
        shape = shape.elements[0]
    return shape


def _minor_to_major(shape: Shape) -> tuple[int, ...]:
    if shape.layout is not None and len(shape.layout.minor_to_major) == shape.rank:
        return tuple(shape.layout.minor_to_major)
    return tuple(range(shape.rank - 1, -1, -1))


def transpose_is_bitcast(inst: Instruction) -> bool:
    """XLA's TransposeIsBitcast: the permutation maps the output layout exactly onto the input layout."""
    operand, out = inst.operand(0).shape, inst.shape
    perm = tuple(inst.attrs.get("dimensions", ()))
    if operand.is_tuple or out.is_tuple or len(perm) != out.rank:
        return False
    return [perm[d] for d in _minor_to_major(out)] == list(_minor_to_major(operand))


def is_elementwise(inst: Instruction) -> bool:
    """XLA's HloInstruction::IsElementwise (bitcast-converts that change the width are not)."""
    op = inst.opcode
    if op == "bitcast-convert":
        a, b = inst.shape, inst.operand(0).shape
        return not a.is_tuple and not b.is_tuple and a.element_type.bits == b.element_type.bits
    if op == "fusion":
        calls = inst.attrs.get("calls")
        return calls is not None and all(
            i.opcode == "parameter" or is_elementwise(i) for i in calls.instructions)
    return op in ELEMENTWISE_OPS or op in ("copy", "map")


def _log2_ceil(n: int) -> int:
    return 0 if n <= 1 else (n - 1).bit_length()


def _log2_floor(n: int) -> int:
    return max(n, 1).bit_length() - 1


# ------------------------------------------------------------------------------------ the analysis


class _BoundHandlers:
    """`CostAnalysis._handlers` without binding every method per instance: get/[] bind on lookup."""

    __slots__ = ("owner", "table")

    def __init__(self, owner: CostAnalysis):
        self.owner = owner
        self.table = type(owner).handler_table()

    def get(self, opcode: str) -> Callable[[Instruction, Cost], None] | None:
        fn = self.table.get(opcode)
        return None if fn is None else fn.__get__(self.owner)

    def __getitem__(self, opcode: str) -> Callable[[Instruction, Cost], None]:
        return self.table[opcode].__get__(self.owner)


class CostAnalysis:
    """XLA's generic HloCostAnalysis, instruction by instruction (results cached per instance)."""

    #: XLA's Options::count_multiple_input_accesses (the GPU model sets it).
    count_multiple_input_accesses = False

    def __init__(self) -> None:
        self._costs: dict[Instruction, Cost] = {}
        self._handlers: dict[str, Callable[[Instruction, Cost], None]] = _BoundHandlers(self)

    # -- public

    def cost(self, inst: Instruction) -> Cost:
        """The properties of one instruction (a fusion: its fused instructions' work, external bytes)."""
        got = self._costs.get(inst)
        if got is None:
            got = self._costs[inst] = self._compute(inst)
        return got

    def computation_cost(self, comp: Computation) -> Cost:
        """The sum over a computation's instructions (XLA's properties of a sub-computation)."""
        total = Cost()
        for inst in comp.instructions:
            total += self.cost(inst)
        return total

    def forget(self, inst: Instruction) -> None:
        """Drop a cached result (after the instruction changed)."""
        self._costs.pop(inst, None)

    # -- dispatch

    @classmethod
    def handler_table(cls) -> dict[str, Callable[..., None]]:
        """opcode -> handler function of this class (built once per class; overrides respected)."""
        table = cls.__dict__.get("_HANDLER_TABLE")
        if table is None:
            table = {op: getattr(cls, name) for op, name in cls._handler_names().items()}
            cls._HANDLER_TABLE = table
        return table

    @staticmethod
    def _handler_names() -> dict[str, str]:
        h: dict[str, str] = {op: "_elementwise" for op in ELEMENTWISE_OPS}
        h.update({
            "parameter": "_no_data", "constant": "_no_data", "get-tuple-element": "_pointer_op",
            "bitcast": "_pointer_op", "domain": "_pointer_op", "after-all": "_pointer_op",
            "add-dependency": "_pointer_op", "tuple": "_tuple", "slice": "_slice",
            "dynamic-slice": "_dynamic_slice", "dynamic-update-slice": "_dynamic_update_slice",
            "gather": "_gather", "scatter": "_scatter", "dot": "_dot", "convolution": "_convolution",
            "fft": "_fft", "triangular-solve": "_triangular_solve", "cholesky": "_cholesky",
            "map": "_map", "reduce": "_reduce", "reduce-window": "_reduce_window",
            "select-and-scatter": "_select_and_scatter", "broadcast": "_broadcast",
            "transpose": "_transpose", "rng": "_rng", "rng-bit-generator": "_rng_bit_generator",
            "sort": "_sort", "fusion": "_fusion", "call": "_call", "while": "_while",
            "conditional": "_conditional", "async-start": "_async_start", "all-reduce": "_all_reduce",
            "all-reduce-start": "_all_reduce", "custom-call": "_custom_call", "infeed": "_infeed",
            "outfeed": "_outfeed", "concatenate": "_concatenate",
        })
        return h

    def _compute(self, inst: Instruction) -> Cost:
        cost = self._preprocess(inst)
        handler = self._handlers.get(inst.opcode)
        if handler is not None:
            handler(inst, cost)
        return cost

    def _preprocess(self, inst: Instruction) -> Cost:
        out = leaf_bytes(inst.shape)
        cost = Cost(bytes_accessed=out, output_bytes=out)
        for i, op in enumerate(inst.operands):
            size = shape_size(op.shape)
            cost.bytes_accessed += size
            cost.operand_bytes[i] = size
            cost.operand_utilization[i] = 1.0
        return cost

    # -- handlers

    def _elementwise(self, inst: Instruction, cost: Cost) -> None:
        n = float(elements(inst.shape))
        if inst.opcode in TRANSCENDENTAL:
            cost.transcendentals = n
        else:
            cost.flops = n

    def _no_data(self, inst: Instruction, cost: Cost) -> None:
        cost.bytes_accessed = cost.output_bytes = 0.0

    def _pointer_op(self, inst: Instruction, cost: Cost) -> None:
        cost.bytes_accessed = cost.output_bytes = 0.0
        for i in cost.operand_bytes:
            cost.operand_bytes[i] = 0.0

    def _tuple(self, inst: Instruction, cost: Cost) -> None:
        cost.bytes_accessed = cost.output_bytes = shape_size(inst.shape)
        for i in cost.operand_bytes:
            cost.operand_bytes[i] = 0.0

    def _slice(self, inst: Instruction, cost: Cost) -> None:
        out = shape_size(inst.shape)
        cost.bytes_accessed, cost.output_bytes, cost.operand_bytes[0] = 2 * out, out, out
        cost.operand_utilization[0] = elements(inst.shape) / max(elements(inst.operand(0).shape), 1)

    def _dynamic_slice(self, inst: Instruction, cost: Cost) -> None:
        out, idx = shape_size(inst.shape), shape_size(inst.operand(1).shape)
        cost.bytes_accessed, cost.output_bytes = 2 * out + idx, out
        cost.operand_bytes[0], cost.operand_bytes[1] = out, idx
        cost.operand_utilization[0] = elements(inst.shape) / max(elements(inst.operand(0).shape), 1)

    def _dynamic_update_slice(self, inst: Instruction, cost: Cost) -> None:
        upd, idx = shape_size(inst.operand(1).shape), shape_size(inst.operand(2).shape)
        cost.bytes_accessed, cost.output_bytes = 2 * upd + idx, upd
        cost.operand_bytes[0], cost.operand_bytes[1], cost.operand_bytes[2] = 0.0, upd, idx
        n = max(elements(inst.shape), 1)
        cost.operand_utilization[0] = (n - elements(inst.operand(1).shape)) / n

    def _gather(self, inst: Instruction, cost: Cost) -> None:
        out, idx = shape_size(inst.shape), shape_size(inst.operand(1).shape)
        cost.bytes_accessed, cost.output_bytes = 2 * out + idx, out
        cost.operand_bytes[0], cost.operand_bytes[1] = out, idx
        cost.operand_utilization[0] = elements(inst.shape) / max(elements(inst.operand(0).shape), 1)

    def _scatter(self, inst: Instruction, cost: Cost) -> None:
        n = inst.operand_count // 2
        updates = inst.operands[n + 1:]
        total = 0.0
        for i, upd in enumerate(updates):
            size = shape_size(upd.shape)
            cost.operand_bytes[i] = cost.operand_bytes[n + 1 + i] = size
            total += size
        idx = shape_size(inst.operand(n).shape)
        cost.operand_bytes[n] = idx
        cost.bytes_accessed, cost.output_bytes = 3 * total + idx, total
        count = elements(updates[0].shape) if updates else 0
        self._apply_sub(cost, inst.attrs.get("to_apply"), count)

    def _dot(self, inst: Instruction, cost: Cost) -> None:
        cost.flops = float(dot_flops(inst))

    def _convolution(self, inst: Instruction, cost: Cost) -> None:
        cost.flops = float(convolution_flops(inst))

    def _fft(self, inst: Instruction, cost: Cost) -> None:
        real = _first_array(inst.operand(0).shape)
        factors = 1
        for n in inst.attrs.get("fft_length", ()):
            factors *= _log2_floor(int(n))
        cost.flops = float(2 * 4 * factors * real.numel)

    def _triangular_solve(self, inst: Instruction, cost: Cost) -> None:
        a, b = inst.operand(0).shape, inst.operand(1).shape
        out = shape_size(inst.shape)
        cost.output_bytes = out
        cost.bytes_accessed = out + shape_size(a) / 2 + shape_size(b)
        cost.operand_bytes[0] = shape_size(b)  # as XLA (it overwrites operand 0's entry)
        cost.flops = float(2 * a.dims[-1] * b.numel)

    def _cholesky(self, inst: Instruction, cost: Cost) -> None:
        a = inst.operand(0).shape
        half = shape_size(a) / 2
        cost.output_bytes, cost.operand_bytes[0], cost.bytes_accessed = half, half, 2 * half
        cost.flops = float(a.dims[-1] * a.numel // 3)

    def _map(self, inst: Instruction, cost: Cost) -> None:
        self._apply_sub(cost, inst.attrs.get("to_apply"), elements(inst.shape))

    def _reduce(self, inst: Instruction, cost: Cost) -> None:
        out = _first_array(inst.shape)
        count = inst.operand(0).shape.numel - out.numel
        self._apply_sub(cost, inst.attrs.get("to_apply"), count)

    def _reduce_window(self, inst: Instruction, cost: Cost) -> None:
        window = inst.attrs.get("window")
        dims = window.dims if window is not None else ()
        size = math.prod(d.size for d in dims) if dims else 1
        n_in = inst.operand(0).shape.numel
        n_out = _first_array(inst.shape).numel
        count = (size - 1) * n_out
        reduced = [d for d in dims if d.size != 1]
        padded = [d for d in dims if d.pad_low != 0 or d.pad_high != 0]
        if len(reduced) == 1 and len(padded) == 1 and not inst.shape.is_tuple:
            for i, d in enumerate(dims):
                if (d.size != 1 and d.pad_low != 0 and d.pad_low == d.pad_high and d.size == 2 * d.pad_low + 1
                        and d.pad_low == inst.shape.dims[i] - 1):
                    size = inst.shape.dims[i]
                    count = n_out // size + (size - 1)
                    break
        if self.count_multiple_input_accesses:
            cost.operand_utilization[0] = n_out * size / max(n_in, 1)
            cost.operand_bytes[0] = float(n_out * size * inst.operand(0).shape.element_type.bits // 8)
        self._apply_sub(cost, inst.attrs.get("to_apply"), count)

    def _select_and_scatter(self, inst: Instruction, cost: Cost) -> None:
        window = inst.attrs.get("window")
        size = math.prod(d.size for d in window.dims) if window is not None else 1
        source = inst.operand(1).shape.numel
        self._apply_sub(cost, inst.attrs.get("select"), source * (size - 1))
        scatter = self._sub_cost(inst.attrs.get("scatter"))
        cost.flops += scatter.flops * source
        cost.transcendentals += scatter.transcendentals * source

    def _broadcast(self, inst: Instruction, cost: Cost) -> None:
        if self.count_multiple_input_accesses:
            n = elements(inst.shape)
            cost.operand_bytes[0] = float(n)  # XLA stores the element count here
            cost.operand_utilization[0] = n / max(elements(inst.operand(0).shape), 1)

    def _transpose(self, inst: Instruction, cost: Cost) -> None:
        if transpose_is_bitcast(inst):
            self._pointer_op(inst, cost)

    def _rng(self, inst: Instruction, cost: Cost) -> None:
        cost.transcendentals = float(elements(inst.shape))

    def _rng_bit_generator(self, inst: Instruction, cost: Cost) -> None:
        cost.transcendentals = float(elements(inst.shape))

    def _sort(self, inst: Instruction, cost: Cost) -> None:
        n = inst.operand(0).shape.numel
        cost.flops = float(n * _log2_ceil(n))

    def _concatenate(self, inst: Instruction, cost: Cost) -> None:
        return

    def _call(self, inst: Instruction, cost: Cost) -> None:
        self._replace_with_sub(cost, self._sub_cost(inst.attrs.get("to_apply")))

    def _async_start(self, inst: Instruction, cost: Cost) -> None:
        comps = inst.called_computations
        if comps:
            self._replace_with_sub(cost, self._sub_cost(comps[0]))

    def _while(self, inst: Instruction, cost: Cost) -> None:
        total = self._sub_cost(inst.attrs.get("body"))
        total += self._sub_cost(inst.attrs.get("condition"))
        self._replace_with_sub(cost, total)

    def _conditional(self, inst: Instruction, cost: Cost) -> None:
        branches = [c for c in inst.called_computations if c is not None]
        subs = [self._sub_cost(c) for c in branches]
        best = Cost()
        for name in ("flops", "transcendentals", "bytes_accessed", "xla_flops_delta", "xla_bytes_delta",
                     "opaque"):
            setattr(best, name, max((getattr(s, name) for s in subs), default=0.0))
        self._replace_with_sub(cost, best)

    def _all_reduce(self, inst: Instruction, cost: Cost) -> None:
        leaves = inst.shape.leaves() if inst.shape.is_tuple else [inst.shape]
        arrays = [s for s in leaves if s.dtype != "token"]
        out = sum(shape_size(s) for s in arrays)
        cost.flops = float(sum(s.numel for s in arrays))
        cost.output_bytes = out
        cost.bytes_accessed = out + sum(shape_size(op.shape) for op in inst.operands)

    def _custom_call(self, inst: Instruction, cost: Cost) -> None:
        cost.opaque = 1
        cost.xla_flops_delta = -1.0 - cost.flops
        cost.xla_bytes_delta = -1.0 - cost.bytes_accessed

    def _infeed(self, inst: Instruction, cost: Cost) -> None:
        size = sum(shape_size(s) for s in (inst.shape.leaves() if inst.shape.is_tuple else [inst.shape]))
        cost.bytes_accessed = cost.output_bytes = size

    def _outfeed(self, inst: Instruction, cost: Cost) -> None:
        total = 0.0
        for i, op in enumerate(inst.operands):
            size = sum(shape_size(s) for s in (op.shape.leaves() if op.shape.is_tuple else [op.shape]))
            cost.operand_bytes[i] = size
            total += size
        cost.bytes_accessed = total

    # -- sub-computations

    def _sub_cost(self, comp: Computation | None) -> Cost:
        return self.computation_cost(comp) if comp is not None else Cost()

    def _apply_sub(self, cost: Cost, comp: Computation | None, count: float) -> None:
        sub = self._sub_cost(comp)
        cost.flops += sub.flops * count
        cost.transcendentals += sub.transcendentals * count
        cost.xla_flops_delta += sub.xla_flops_delta * count

    @staticmethod
    def _replace_with_sub(cost: Cost, sub: Cost) -> None:
        cost.flops, cost.transcendentals, cost.bytes_accessed = sub.flops, sub.transcendentals, sub.bytes_accessed
        cost.xla_flops_delta, cost.xla_bytes_delta, cost.opaque = sub.xla_flops_delta, sub.xla_bytes_delta, sub.opaque

    # -- fusion

    def _fusion(self, inst: Instruction, cost: Cost) -> None:
        comp: Computation = inst.attrs["calls"]
        if self._custom_fusion_gather_scatter(inst, comp, cost):
            return
        sub = self.computation_cost(comp)
        cost.flops, cost.transcendentals = sub.flops, sub.transcendentals
        cost.xla_flops_delta, cost.opaque = sub.xla_flops_delta, sub.opaque
        cost.xla_bytes_delta = 0.0
        self._fusion_flops(inst, comp, cost)
        cost.output_bytes = self._fusion_output_bytes(inst, comp)
        cost.bytes_accessed = cost.output_bytes
        for fused in comp.instructions:
            if fused.opcode == "constant" and elements(fused.shape) > 1:
                cost.bytes_accessed += shape_size(fused.shape) * self._constant_utilization(fused)
        for i, param in enumerate(comp.parameters):
            read = self._fusion_parameter_bytes(param)
            cost.operand_bytes[i] = read
            cost.operand_utilization[i] = self._parameter_utilization(param)
            cost.bytes_accessed += read

    def _custom_fusion_gather_scatter(self, inst: Instruction, comp: Computation, cost: Cost) -> bool:
        if str(inst.attrs.get("kind", "")) != "kCustom" or _backend_kind(inst) != "__custom_fusion":
            return False
        for fused in comp.instructions:
            if fused.opcode in ("gather", "scatter"):
                inner = self._preprocess(fused)
                self._handlers[fused.opcode](fused, inner)
                cost.flops, cost.transcendentals = inner.flops, inner.transcendentals
                cost.bytes_accessed, cost.output_bytes = inner.bytes_accessed, inner.output_bytes
                return True
        return False

    def _fusion_flops(self, inst: Instruction, comp: Computation, cost: Cost) -> None:
        """Hook: the GPU analysis weights fused flops by utilization."""

    def _fusion_output_bytes(self, inst: Instruction, comp: Computation) -> float:
        root = comp.root
        shape = inst.shape
        if not shape.is_tuple:
            if root.opcode == "dynamic-update-slice":
                self._on_in_place_root(root)
                return shape_size(root.operand(1).shape)
            return shape_size(shape)
        total = 0.0
        for i, sub in enumerate(shape.elements):
            if (not sub.is_tuple and root.opcode == "tuple" and i < root.operand_count
                    and root.operand(i).opcode == "dynamic-update-slice"):
                self._on_in_place_root(root.operand(i))
                total += shape_size(root.operand(i).operand(1).shape)
            elif sub.is_tuple:
                total += sum(shape_size(s) for s in sub.leaves())
            else:
                total += shape_size(sub)
        return total

    def _on_in_place_root(self, dus: Instruction) -> None:
        """Hook: XLA zeroes the in-place buffer's utilization of a DUS fusion root."""

    def _constant_utilization(self, constant: Instruction) -> float:
        return 1.0

    def _parameter_utilization(self, param: Instruction) -> float:
        return 1.0

    def _fusion_parameter_bytes(self, param: Instruction) -> float:
        if not param.shape.is_tuple:
            return self._read_bytes(param)
        total = 0.0
        for path in _leaf_paths(param.shape):
            node = param
            for index in path:
                nxt = next((u for u in node.users if u.opcode == "get-tuple-element"
                            and u.attrs.get("index") == index), None)
                if nxt is None:
                    break
                node = nxt
            total += self._read_bytes(node)
        return total

    def _read_bytes(self, hlo: Instruction) -> float:
        """XLA's generic FusionParameterReadBytes: what the fused users of a parameter read."""
        size = 0.0
        seen_trivial = False
        for user in hlo.users:
            op = user.opcode
            if op == "fusion":
                inner = user.attrs["calls"].parameters
                for idx, operand in enumerate(user.operands):
                    if operand is hlo:
                        size += self._read_bytes(inner[idx])
            elif op == "slice":
                size += shape_size(user.shape)
            elif op == "dynamic-slice":
                if user.operand(0) is hlo:
                    size += shape_size(user.shape)
                elif not seen_trivial:
                    seen_trivial = True
                    size += shape_size(hlo.shape)
            elif op == "dynamic-update-slice":
                if user.operand(0) is not hlo and not seen_trivial:
                    seen_trivial = True
                    size += shape_size(hlo.shape)
            elif op in ("broadcast", "reshape"):
                size += shape_size(hlo.shape)
            elif not seen_trivial:
                seen_trivial = True
                size += shape_size(hlo.shape)
        return size


def _leaf_paths(shape: TupleShape, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for i, sub in enumerate(shape.elements):
        if sub.is_tuple:
            out += _leaf_paths(sub, prefix + (i,))
        else:
            out.append(prefix + (i,))
    return out


def _backend_kind(inst: Instruction) -> str:
    return str(inst.backend_config_value("fusion_backend_config", "kind") or "")


# ------------------------------------------------------------------------------------- flop helpers


def dot_flops(inst: Instruction) -> int:
    """2 * output elements * contracted elements (XLA's GetDotFlops)."""
    lhs = inst.operand(0).shape
    width = 1
    for d in inst.attrs.get("lhs_contracting_dims", ()):
        width *= lhs.dims[d]
    return 2 * _first_array(inst.shape).numel * width


def _conv_labels(inst: Instruction) -> tuple[str, str, str] | None:
    labels = str(inst.attrs.get("dim_labels", ""))
    if "_" not in labels or "->" not in labels:
        return None
    lhs, rest = labels.split("_", 1)
    kernel, out = rest.split("->")
    return lhs, kernel, out


def _spatial(labels: str) -> list[int]:
    """Positions of the spatial dimensions (digits), ordered by their digit."""
    digits = sorted((int(c), i) for i, c in enumerate(labels) if c.isdigit())
    return [i for _, i in digits]


def _valid_positions(in_size: int, k_size: int, out_size: int, d) -> int:
    """Kernel x output position pairs that read a real (non-padding, non-dilation) input element."""
    if (in_size == out_size and k_size == out_size and in_size == d.lhs_dilate and d.rhs_dilate == 1
            and max(1, in_size - 1) == d.stride and d.pad_low == 0 and d.pad_high == 0):
        return in_size
    if (in_size == 1 and k_size == out_size and d.rhs_dilate == 1 and d.lhs_dilate == 1 and d.stride == 1
            and d.pad_high == out_size - 1 and d.pad_low == out_size - 1):
        return out_size
    count = 0
    for k in range(k_size):
        for o in range(out_size):
            undilated = o * d.stride - d.pad_low + k * d.rhs_dilate
            if d.lhs_dilate > 1:
                if undilated % d.lhs_dilate:
                    continue
                idx = undilated // d.lhs_dilate
            else:
                idx = undilated
            if 0 <= idx < in_size:
                count += 1
    return count


def convolution_flops(inst: Instruction, result_shape: Shape | None = None) -> int:
    """XLA's GetConvolutionFlops: 2 * (input features / groups) * output features * batch / batch groups
    * the valid kernel/output position pairs per spatial dimension."""
    labels = _conv_labels(inst)
    lhs, rhs = inst.operand(0).shape, inst.operand(1).shape
    out = result_shape or _first_array(inst.shape)
    if labels is None:
        return 0
    lhs_l, k_l, out_l = labels
    window = inst.attrs.get("window")
    wdims = list(window.dims) if window is not None else []
    positions = 1
    for s, (li, ki, oi) in enumerate(zip(_spatial(lhs_l), _spatial(k_l), _spatial(out_l), strict=False)):
        d = wdims[s] if s < len(wdims) else None
        if d is None:
            continue
        positions *= _valid_positions(lhs.dims[li], rhs.dims[ki], out.dims[oi], d)
    fgc = int(inst.attrs.get("feature_group_count", 1) or 1)
    bgc = int(inst.attrs.get("batch_group_count", 1) or 1)
    in_f = lhs.dims[lhs_l.index("f")]
    out_f = out.dims[out_l.index("f")]
    batch = lhs.dims[lhs_l.index("b")]
    return 2 * (in_f // fgc) * out_f * (batch // bgc) * positions


# ------------------------------------------------------------------------------------------ the GPU


class GpuCostAnalysis(CostAnalysis):
    """XLA:GPU's GpuHloCostAnalysis: measured cycles per element, utilization-weighted fusions."""

    count_multiple_input_accesses = True

    def __init__(self, profile: str = "sm_90", overrides: dict[str, dict[str, int]] | None = None) -> None:
        from hlopt.cost_model.op_profiles import cycles_per_element

        super().__init__()
        self.profile = profile
        self._cycles = lambda op, dtype: cycles_per_element(profile, op, dtype, overrides)
        self._util: dict[Instruction, float] = {}
        self._in_place_roots: set[Instruction] = set()

    def utilization(self, fused: Instruction) -> float:
        """How many times a fused instruction is evaluated per fusion output (after `cost(fusion)`)."""
        return self._util.get(fused, 0.0)

    def elementwise_flops(self, opcode: str, shape: Shape | TupleShape) -> float:
        """Cycles per element times elements (XLA's GetFlopsForElementwiseOp)."""
        dtype = _first_array(shape).dtype
        return float(self._cycles(opcode, dtype) * elements(shape))

    def _elementwise(self, inst: Instruction, cost: Cost) -> None:
        cost.flops = self.elementwise_flops(inst.opcode, inst.shape)

    def _concatenate(self, inst: Instruction, cost: Cost) -> None:
        n = elements(inst.shape)
        cost.flops = 6.0 * n
        dim = int(inst.attrs.get("dimensions", (0,))[0])
        if dim == 0:
            return
        # Warps that straddle operand boundaries run both branches: XLA charges 400 flops per element
        # then. Measured against XLA:GPU, the first operand decides (its check stops at the first
        # operand whose size is a multiple of the warp); its utilization multipliers have no effect.
        if inst.operands and inst.operand(0).shape.dims[dim] % 32:
            cost.flops = 400.0 * n

    def _all_reduce(self, inst: Instruction, cost: Cost) -> None:
        super()._all_reduce(inst, cost)
        reducer = inst.attrs.get("to_apply")
        opcode = reducer.root.opcode if reducer is not None and reducer.root is not None else "add"
        cost.flops = self.elementwise_flops(opcode, inst.shape)

    def _custom_call(self, inst: Instruction, cost: Cost) -> None:
        target = str(inst.attrs.get("custom_call_target", ""))
        if target in ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8"):
            cfg = _json(inst).get("gemm_backend_config", {})
            dnums = cfg.get("dot_dimension_numbers", {})
            lhs = inst.operand(0).shape
            width = math.prod(lhs.dims[int(d)] for d in dnums.get("lhs_contracting_dimensions", []))
            cost.flops = float(2 * _first_array(inst.shape).numel * width)
            return
        if target.startswith("__cudnn$conv"):
            cost.flops = float(convolution_flops(inst, _first_array(inst.shape)))
            if inst.shape.is_tuple:
                out = shape_size(inst.shape.elements[0])
                cost.bytes_accessed += out - cost.output_bytes
                cost.output_bytes = out
            return
        super()._custom_call(inst, cost)

    # -- fusions: utilization

    def _on_in_place_root(self, dus: Instruction) -> None:
        self._in_place_roots.add(dus)

    def _fusion_output_bytes(self, inst: Instruction, comp: Computation) -> float:
        return super()._fusion_output_bytes(inst, comp)

    def _fusion(self, inst: Instruction, cost: Cost) -> None:
        comp: Computation = inst.attrs["calls"]
        # the DUS roots are known before utilizations are computed, as in XLA
        super()._fusion_output_bytes(inst, comp)
        super()._fusion(inst, cost)

    def _fusion_flops(self, inst: Instruction, comp: Computation, cost: Cost) -> None:
        util = self._utilizations(comp)
        self._cap_block_level(inst, comp)
        cost.flops = sum(util[i] * self.cost(i).flops for i in comp.instructions)

    def _cap_block_level(self, inst: Instruction, comp: Computation) -> None:
        """A block-level Triton fusion evaluates each fused instruction only over the tiles its output
        tiles need (`tiles.block_level_caps`): utilizations are capped there (flops and reads follow)."""
        from hlopt.cost_model.tiles import block_level_caps

        caps = block_level_caps(inst, comp)
        for fused, cap in (caps or {}).items():
            if fused in self._util:
                self._util[fused] = min(self._util[fused], cap)

    def _utilizations(self, comp: Computation) -> dict[Instruction, float]:
        """XLA's FusionCalculateUtilizations: propagate output utilization from the root to the
        parameters; elementwise users pass it through, others scale it by their operand utilization."""
        order = list(reversed(comp.post_order()))
        roots_of: dict[Instruction, set[Instruction]] = {i: set() for i in order}
        root_util: dict[Instruction, float] = {i: 0.0 for i in order}
        root = comp.root
        root_util[root] = 1.0
        roots_of[root].add(root)
        for instr in order:
            u = sum(root_util[r] for r in roots_of[instr])
            self._util[instr] = u
            passthrough = is_elementwise(instr) or instr.opcode in ("tuple", "get-tuple-element")
            for idx, operand in enumerate(instr.operands):
                if passthrough:
                    roots_of[operand] |= roots_of[instr]
                    continue
                roots_of[operand].add(operand)
                op_util = 0.0 if (idx == 0 and instr in self._in_place_roots) else \
                    self.cost(instr).operand_utilization.get(idx, 1.0)
                n = elements(operand.shape)
                cu = math.ceil(u * op_util * n) / n if n else 0.0
                root_util[operand] += cu
        return self._util

    def _constant_utilization(self, constant: Instruction) -> float:
        return self._util.get(constant, 1.0)

    def _parameter_utilization(self, param: Instruction) -> float:
        return self._util.get(param, 0.0)

    def _read_bytes(self, hlo: Instruction) -> float:
        """XLA:GPU's FusionParameterReadBytes: size times utilization (not capped at 1 here)."""
        return shape_size(hlo.shape) * self._util.get(hlo, 0.0)


def _json(inst: Instruction) -> Mapping:
    return inst.backend_config_dict()


# ------------------------------------------------------------------------------------ conveniences


def instruction_cost(inst: Instruction, count_bytes: bool = True) -> Cost:
    """XLA's HloCostAnalysis of one instruction (bytes zeroed when `count_bytes` is False)."""
    cost = CostAnalysis().cost(inst)
    if not count_bytes:
        cost = Cost(cost.flops, cost.transcendentals, xla_flops_delta=cost.xla_flops_delta, opaque=cost.opaque)
    return cost


def computation_cost(comp: Computation) -> Cost:
    """The sum of XLA's HloCostAnalysis over a computation (a called computation counted where called)."""
    return CostAnalysis().computation_cost(comp)


def module_cost(module) -> Cost:
    """XLA's HloCostAnalysis totals of a module (what `hlo_module_cost_analysis` reports): the entry
    computation, called computations folded into their callers."""
    return computation_cost(module.entry)
