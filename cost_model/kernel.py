"""The time of one GPU kernel: a roofline in the manner of XLA:GPU's GpuPerformanceModel.

For a fusion (or an unfused instruction, which XLA would wrap in a fusion of its own):

- flops are XLA:GPU's (`GpuCostAnalysis`: measured cycles per element, weighted by utilization);
- compute time = flops / (active FP32 lanes x 2 x clock), with min(threads per block, lanes per SM) lanes
  on min(blocks, SMs) SMs active (a one-block kernel uses one SM);
- each operand's read time: its first read comes from HBM, re-reads (utilization > 1) from L2 (2.5x) or L1
  (another 8x) when the operand is small enough; reads that are not coalesced (a transpose of the minor
  dimension) waste most of each 64-byte DRAM transaction; a kernel with few blocks cannot reach full
  bandwidth, as each SM issues one 32-byte transaction per clock;
- write time = output bytes / HBM bandwidth;
- compute and memory overlap: time = compute + memory - 0.95 x min(compute, memory) (XLA's priority-fusion
  setting); the kernel launch overhead (1 us) is added by the caller (`AnalyticalGpuModel`).

GEMMs and convolutions that run on tensor cores (Triton/cuBLAS/cuDNN fusions, dots large enough for XLA to
rewrite them) differ from XLA's default model, which times them on FP32 lanes: here the dot runs at the
dtype's tensor-core rate, tiled as IREE's GEMM heuristics tile it (small / medium / large problems by
arithmetic intensity get 64x64 / 128x128 / 128x256 tiles), and quantized in waves over the SMs (a partial
last wave costs a full wave). Fused epilogue work runs on the FP32 lanes as above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hlopt.cost_model.analysis import Cost, GpuCostAnalysis, convolution_flops, dot_flops, shape_size
from hlopt.cost_model.devices import DeviceSpec
from hlopt.cost_model.launch import LaunchDims, ceil_div, emitter_kind, is_gemm_kernel, launch_dims
from hlopt.hlo.ir import Instruction
from hlopt.hlo.opcodes import BINARY_ELEMENTWISE, TERNARY_ELEMENTWISE, UNARY_ELEMENTWISE
from hlopt.hlo.shape import Shape, TupleShape
from hlopt.hlo.structure import shared_keys

__all__ = ["KernelEstimate", "KernelModel", "read_time_s", "reread_weight", "read_weights", "reads_coalesced",
           "transposes_minor_dimension", "element_bytes", "write_time_s", "compute_time_s", "combine",
           "gemm_tile", "MEMORY_COMPUTE_PARALLELISM", "NO_KERNEL"]

#: XLA's GpuPerformanceModelOptions::PriorityFusion().memory_compute_parallelism.
MEMORY_COMPUTE_PARALLELISM = 0.95
L2_SPEEDUP = 2.5
L1_SPEEDUP = 8.0
#: Instructions that launch no kernel of their own.
NO_KERNEL = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "opt-barrier",
    "add-dependency", "domain", "while", "call", "conditional", "partition-id", "replica-id",
    "get-dimension-size", "set-dimension-size", "all-reduce-done", "all-gather-done", "collective-permute-done",
    "async-done", "async-update", "copy-done", "send-done", "recv-done", "rng-get-and-update-state",
})
#: Opcodes whose estimate reads nothing outside the instruction (its fused computation) but its operands'
#: shapes and which of them are the same value: remembered by structure (`KernelModel.estimate`). Unfused
#: elementwise ops too (a step's gradient accumulations, left unfused next to their dots, are a thousand
#: adds of a few shapes); not a lone transpose, whose coalescing reads the chain producing its operand, nor a
#: `map`, whose key holds its computation's number but not a later edit of a computation that one calls.
_BY_STRUCTURE = frozenset({"fusion", "dot"}) | UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | TERNARY_ELEMENTWISE
#: GEMM tiles (M x N) by problem class, after IREE's small/medium/large GEMM seeds.
GEMM_TILES = {"small": (64, 64), "medium": (128, 128), "large": (128, 256)}
_SMALL_INTENSITY = 32.0
_LARGE_INTENSITY = 256.0


@dataclass
class KernelEstimate:
    """A kernel's modeled numbers (times in microseconds, without launch overhead)."""

    flops: float
    bytes_read: float
    bytes_written: float
    compute_us: float
    memory_us: float
    exec_us: float
    launch: LaunchDims
    unit: str = "fp32"
    gemm_class: str = ""

    @property
    def bound(self) -> str:
        """compute or memory: which side of the roofline sets the time."""
        return "compute" if self.compute_us >= self.memory_us else "memory"

    @property
    def bytes_accessed(self) -> float:
        """Bytes read plus written."""
        return self.bytes_read + self.bytes_written


# ------------------------------------------------------------------------------------- roofline parts


def compute_time_s(device: DeviceSpec, flops: float, blocks: int, threads_per_block: int) -> float:
    """Seconds for `flops` on the FP32 lanes the grid keeps busy (XLA's ComputeTime)."""
    lanes = min(threads_per_block, device.fp32_lanes_per_sm) * min(blocks, device.sm_count)
    per_ns = int(device.clock_ghz * 2 * lanes)
    return (int(flops) / per_ns) * 1e-9 if per_ns > 0 else 0.0


def _adjust(device: DeviceSpec, bandwidth: float, blocks: int) -> float:
    return min(bandwidth, blocks * device.block_bandwidth)


def _read_bandwidths(device: DeviceSpec, blocks: int, net: float, element_bytes: int = 4,
                     coalesced: bool = True) -> tuple[float, float]:
    """(first read, re-read) bandwidths in bytes/s of an operand of `net` bytes (XLA's
    ReadTimeWithDRAMHeuristic): the first read from HBM, re-reads from L2 or L1 when the operand fits,
    both bounded by what `blocks` thread blocks can issue."""
    rate = 1.0 if coalesced else min(element_bytes / device.dram_to_l2_transaction_bytes, 1.0)
    dram = _adjust(device, device.hbm_bandwidth * rate, blocks)
    rest = device.hbm_bandwidth
    if net < device.l2_bytes:
        rest *= L2_SPEEDUP
        if net < device.l1_bytes_per_sm * device.sm_count:
            rest *= L1_SPEEDUP
    else:
        rest *= rate
    return dram, _adjust(device, rest, blocks)


def read_time_s(device: DeviceSpec, blocks: int, net: float, total: float, element_bytes: int = 4,
                coalesced: bool = True) -> float:
    """Seconds to read `total` bytes of an operand of `net` bytes (XLA's ReadTimeWithDRAMHeuristic)."""
    dram, rest = _read_bandwidths(device, blocks, net, element_bytes, coalesced)
    first = min(net, total)
    return int(first) / dram + int(total - first) / rest


def reread_weight(device: DeviceSpec, blocks: int, net: float) -> float:
    """What one re-read byte of an operand of `net` bytes costs, in first-read (HBM) bytes, in a kernel of
    `blocks` thread blocks (coalesced reads, `read_time_s`): re-reads come from L2 (or L1) at several times
    HBM bandwidth, but no faster than the blocks can issue transactions. With few blocks (a column
    reduction to a short row runs one) both rates are the blocks' issue rate, and a broadcast operand read
    N times costs N reads of its size: XLA:GPU's model refuses fusions that make a one-block reduction
    re-read a broadcast, and so must fusion's model."""
    dram, rest = _read_bandwidths(device, blocks, net)
    return dram / rest


def read_weights(device: DeviceSpec, blocks: int, net: float, element_bytes: int = 4,
                 coalesced: bool = True) -> tuple[float, float]:
    """(first read, re-read) cost of one byte of an operand of `net` bytes, in bytes of a coalesced HBM read
    at the rate `blocks` thread blocks can issue (`read_time_s`): an uncoalesced first read wastes most of
    each DRAM transaction (XLA: element bytes / transaction bytes of it is used)."""
    dram, rest = _read_bandwidths(device, blocks, net, element_bytes, coalesced)
    base = _adjust(device, device.hbm_bandwidth, blocks)
    return base / dram, base / rest


def write_time_s(device: DeviceSpec, nbytes: float) -> float:
    """Seconds to write `nbytes` to HBM."""
    return nbytes / device.hbm_bandwidth


def combine(compute_s: float, memory_s: float, parallelism: float = MEMORY_COMPUTE_PARALLELISM) -> float:
    """Overlapped compute and memory time."""
    return compute_s + memory_s - min(compute_s, memory_s) * parallelism


# ------------------------------------------------------------------------------------------ GEMMs


def _pow2_at_least(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(n - 1, 0).bit_length())


def _gemm_dims(dot: Instruction) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a dot or (as an implicit GEMM) a convolution."""
    out = dot.shape.elements[0] if dot.shape.is_tuple else dot.shape
    if dot.opcode == "dot":
        lhs = dot.operand(0).shape
        batch = math.prod(lhs.dims[d] for d in dot.attrs.get("lhs_batch_dims", ()))
        k = math.prod(lhs.dims[d] for d in dot.attrs.get("lhs_contracting_dims", ()))
        skip = set(dot.attrs.get("lhs_batch_dims", ())) | set(dot.attrs.get("lhs_contracting_dims", ()))
        m = math.prod(d for i, d in enumerate(lhs.dims) if i not in skip)
        n = max(out.numel // max(batch * m, 1), 1)
        return batch, m, n, k
    labels = str(dot.attrs.get("dim_labels", ""))
    out_labels = labels.split("->")[-1] if "->" in labels else ""
    n = out.dims[out_labels.index("f")] if "f" in out_labels else 1
    m = max(out.numel // max(n, 1), 1)
    k = max(convolution_flops(dot, out) // max(2 * m * n, 1), 1)
    return 1, m, n, k


def gemm_tile(m: int, n: int, k: int, element_bytes: float) -> tuple[str, int, int]:
    """The problem class (by arithmetic intensity) and the M x N tile a GEMM gets: the class's tile in
    the orientation that re-reads less operand data (a tile as wide as a small N reads A once), clamped to
    the problem (MMA granularity 16)."""
    intensity = 2.0 * m * n * k / max((m * k + k * n + m * n) * element_bytes, 1.0)
    cls = "small" if intensity < _SMALL_INTENSITY else "large" if intensity >= _LARGE_INTENSITY else "medium"
    a, b = GEMM_TILES[cls]

    def traffic(tm: int, tn: int) -> tuple[float, int]:
        tm, tn = min(tm, _pow2_at_least(m)), min(tn, _pow2_at_least(n))
        return m * k * ceil_div(n, tn) + k * n * ceil_div(m, tm), -ceil_div(m, tm) * ceil_div(n, tn)

    tm, tn = min(((a, b), (b, a)), key=lambda t: traffic(*t))
    return cls, min(tm, _pow2_at_least(m)), min(tn, _pow2_at_least(n))


def _find_gemm(inst: Instruction) -> Instruction | None:
    if inst.opcode in ("dot", "convolution", "custom-call"):
        return inst
    comp = inst.attrs.get("calls")
    if comp is None:
        return None
    return next((i for i in comp.instructions if i.opcode in ("dot", "convolution", "scaled-dot")), None)


# ------------------------------------------------------------------------------------------ the model


def _element_bytes(shape: Shape | TupleShape) -> int:
    while shape.is_tuple:
        if not shape.elements:
            return 4
        shape = shape.elements[0]
    return max(shape.element_type.bits // 8, 1)


def _transposes_minor(inst: Instruction) -> bool:
    if inst.opcode != "transpose":
        return False
    perm = tuple(inst.attrs.get("dimensions", ()))
    return bool(perm) and perm[-1] != inst.operand(0).shape.rank - 1 and inst.operand(0).shape.dims[perm[-1]] != 1


def _from_broadcast(inst: Instruction) -> bool:
    while True:
        if inst.opcode in ("broadcast", "iota"):
            return True
        if inst.operand_count != 1 or inst.opcode not in ("bitcast", "reshape", "convert", "negate", "copy"):
            return False
        inst = inst.operand(0)


def transposes_minor_dimension(inst: Instruction) -> bool:
    """Does the kernel `inst` (a fusion: any fused instruction) transpose the minor dimension of something
    other than a broadcast or iota (what breaks coalescing in XLA's IsReadCoalescedHeuristic)?"""
    comp = inst.attrs.get("calls") if inst.opcode == "fusion" else None
    body = comp.instructions if comp is not None else [inst]
    return any(_transposes_minor(i) and not _from_broadcast(i.operand(0)) for i in body)


def _coalesced(inst: Instruction, kind: str) -> bool:
    """XLA's IsReadCoalescedHeuristic: a transpose of the minor dimension (not of a broadcast) breaks
    coalescing, except in the tiled transpose emitter."""
    return kind == "transpose" or not transposes_minor_dimension(inst)


def reads_coalesced(inst: Instruction, device: DeviceSpec) -> bool:
    """XLA's IsReadCoalescedHeuristic for the kernel `inst` launches on `device`."""
    return _coalesced(inst, emitter_kind(inst, device))


def element_bytes(shape: Shape | TupleShape) -> int:
    """Bytes per element of a shape (of its first leaf: a tuple)."""
    return _element_bytes(shape)


class KernelModel:
    """Kernel times on one device (GPU flops and bytes cached per instruction)."""

    def __init__(self, device: DeviceSpec):
        self.device = device
        self.analysis = GpuCostAnalysis(device.op_profile, device.op_cycles)
        #: a fusion's (or dot's) structural key -> its estimate: its kernel depends on nothing outside it but its
        #: operands' shapes and which of them are the same value, so the same fusion of every layer is costed once
        self._fusions: dict[tuple, KernelEstimate | None] = {}

    def gpu_cost(self, inst: Instruction) -> Cost:
        """XLA:GPU's cost properties of the kernel."""
        return self.analysis.cost(inst)

    def forget(self, inst: Instruction) -> None:
        """Drop cached numbers of a changed instruction."""
        self.analysis.forget(inst)

    def estimate(self, inst: Instruction) -> KernelEstimate | None:
        """The kernel `inst` launches, or None when it launches none (a fusion's, a dot's or an elementwise op's
        remembered by its structure, `hlo.structure`: `_BY_STRUCTURE`)."""
        if inst.opcode not in _BY_STRUCTURE:
            return self._estimate(inst)
        try:
            parent = inst.parent  # the module's keys: the fusion passes keyed most fusions already
            key = shared_keys(parent.module if parent is not None else None).of_kernel(inst)
            if key in self._fusions:
                return self._fusions[key]
        except TypeError:  # an attribute value that is not hashable even as its parts
            return self._estimate(inst)
        if len(self._fusions) > 100_000:
            self._fusions.clear()
        got = self._fusions[key] = self._estimate(inst)
        return got

    def _estimate(self, inst: Instruction) -> KernelEstimate | None:
        op = inst.opcode
        if op in NO_KERNEL or (op == "reshape" and not inst.shape.is_tuple) or op == "custom-call" and \
                not is_gemm_kernel(inst) and _is_annotation(inst):
            return None
        kind = emitter_kind(inst, self.device)
        if kind == "none":
            return None
        dims = launch_dims(inst, self.device, kind)
        cost = self.gpu_cost(inst)
        if kind == "gemm":
            return self._gemm(inst, cost, dims)
        compute = compute_time_s(self.device, cost.flops, dims.blocks, dims.threads_per_block)
        read, nbytes = self._reads(inst, cost, dims.blocks, _coalesced(inst, kind))
        write = write_time_s(self.device, cost.output_bytes)
        exec_s = combine(compute, read + write)
        return KernelEstimate(cost.flops, nbytes, cost.output_bytes, compute * 1e6, (read + write) * 1e6,
                              exec_s * 1e6, dims)

    def _reads(self, inst: Instruction, cost: Cost, blocks: int, coalesced: bool,
               rereads: dict[int, float] | None = None) -> tuple[float, float]:
        """(seconds, bytes) to read the operands; a fusion operand listed twice is charged twice, as in XLA."""
        first_index: dict[Instruction, int] = {}
        seconds = total_bytes = 0.0
        for i, operand in enumerate(inst.operands):
            if operand in first_index and inst.opcode != "fusion":
                continue  # the fusion XLA would wrap around an unfused op takes each operand once
            idx = first_index.setdefault(operand, i)
            size = shape_size(operand.shape)
            total = cost.operand_bytes.get(idx, size)
            if rereads and idx in rereads:
                total *= rereads[idx]
            net = min(size, total)
            total_bytes += total
            seconds += read_time_s(self.device, blocks, net, total, _element_bytes(operand.shape), coalesced)
        return seconds, total_bytes

    def _gemm(self, inst: Instruction, cost: Cost, dims: LaunchDims) -> KernelEstimate:
        d = self.device
        gemm = _find_gemm(inst)
        if gemm is None or gemm.opcode == "custom-call" and not gemm.operands:
            return KernelEstimate(cost.flops, 0.0, cost.output_bytes, 0.0, 0.0, 0.0, dims)
        batch, m, n, k = _gemm_dims(gemm) if gemm.opcode != "custom-call" else _custom_gemm_dims(gemm)
        dtype = gemm.operand(0).shape.dtype if not gemm.operand(0).shape.is_tuple else "f32"
        ebytes = _element_bytes(gemm.operand(0).shape)
        cls, tm, tn = gemm_tile(m, n, k, ebytes)
        tiles = ceil_div(m, tm) * ceil_div(n, tn) * batch
        configured = _configured_tile(inst)
        if configured is not None:  # a Triton GEMM: its block-level config is the truth
            tm, tn = configured
            tiles = dims.blocks
        waves = ceil_div(tiles, d.sm_count)
        per_sm = d.tensor_flops(dtype) / d.sm_count
        tc_s = waves * (2.0 * tm * tn * k) / per_sm
        main = float(_gemm_flops(gemm))
        epilogue = max(cost.flops - main, 0.0)
        threads = dims.threads_per_block if dims.emitter == "triton" else 128
        compute = tc_s + compute_time_s(d, epilogue, tiles, threads)
        rereads = self._gemm_rereads(inst, gemm, m, n, tm, tn)
        read, nbytes = self._reads(inst, cost, tiles, True, rereads)
        write = write_time_s(d, cost.output_bytes)
        exec_s = combine(compute, read + write)
        launch = LaunchDims(tiles, dims.threads_per_block, "gemm")
        return KernelEstimate(main + epilogue, nbytes, cost.output_bytes, compute * 1e6, (read + write) * 1e6,
                              exec_s * 1e6, launch, unit=f"tensor-core:{dtype}", gemm_class=cls)

    @staticmethod
    def _gemm_rereads(inst: Instruction, gemm: Instruction, m: int, n: int, tm: int, tn: int) -> dict[int, float]:
        """Operand re-reads of a tiled GEMM: A once per column of tiles, B once per row of tiles."""
        if gemm is inst:
            return {0: float(ceil_div(n, tn)), 1: float(ceil_div(m, tm))}
        comp = inst.attrs["calls"]
        out: dict[int, float] = {}
        for side, factor in ((0, ceil_div(n, tn)), (1, ceil_div(m, tm))):
            src = gemm.operand(side)
            while src.opcode != "parameter" and src.operand_count == 1:
                src = src.operand(0)
            if src.opcode == "parameter" and src in comp.parameters:
                out[comp.parameters.index(src)] = float(factor)
        return out


def _configured_tile(inst: Instruction) -> tuple[int, int] | None:
    """The (M, N) output tile of a Triton GEMM fusion's block-level config."""
    if inst.opcode != "fusion" or inst.backend_config is None:
        return None
    block = inst.backend_config_value("fusion_backend_config", "block_level_fusion_config") or {}
    tiles = block.get("output_tiles") or []
    sizes = [int(x) for x in (tiles[0].get("sizes", []) if tiles else [])]
    return (sizes[-2], sizes[-1]) if len(sizes) >= 2 else None


def _gemm_flops(gemm: Instruction) -> int:
    if gemm.opcode == "dot":
        return dot_flops(gemm)
    if gemm.opcode == "convolution":
        return convolution_flops(gemm)
    b, m, n, k = _custom_gemm_dims(gemm)
    return 2 * b * m * n * k


def _custom_gemm_dims(call: Instruction) -> tuple[int, int, int, int]:
    dnums = call.backend_config_value("gemm_backend_config", "dot_dimension_numbers") or {}
    lhs = call.operand(0).shape
    batch = math.prod(lhs.dims[int(i)] for i in dnums.get("lhs_batch_dimensions", []))
    k = math.prod(lhs.dims[int(i)] for i in dnums.get("lhs_contracting_dimensions", [])) or lhs.dims[-1]
    m = max(lhs.numel // max(batch * k, 1), 1)
    out = call.shape.elements[0] if call.shape.is_tuple else call.shape
    n = max(out.numel // max(batch * m, 1), 1)
    return batch, m, n, k


def _is_annotation(call: Instruction) -> bool:
    """Custom calls that only annotate (sharding, shape casts) and launch nothing."""
    target = str(call.attrs.get("custom_call_target", ""))
    return target in ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost", "MoveToDevice",
                      "AllocateBuffer", "LayoutConstraint") or target.startswith("xla.sdy.")
