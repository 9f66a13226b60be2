"""The analytical GPU model: a roofline per kernel and a ring/tree model per collective.

Kernel time (after XLA's GpuPerformanceModel): compute time = flops / (tensor-core rate of the input type
for dot/convolution, FP32 lanes otherwise; transcendentals at a quarter of the FP32 rate); memory time =
bytes / HBM bandwidth, with operands that fit in L2 and are read again charged once; the two overlap
(the larger counts) and every kernel pays the launch overhead.

Collective time: group size from replica_groups; NVLink inside a node, the network across nodes; ring
(all-reduce 2(n-1)/n of the bytes, all-gather / reduce-scatter (n-1)/n, a fixed latency per step) or,
for small all-reduces, a tree (2 log2 n steps) — whichever is faster; collective-permute and send/recv
one hop; all-to-all (n-1)/n of the bytes with one latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Protocol, runtime_checkable

from cost_model.analysis import NO_DATA, Cost, instruction_cost
from cost_model.devices import DeviceSpec, get_device
from hlo.ir import Computation, Instruction, Module

__all__ = ["CostModel", "AnalyticalGpuModel", "get_cost_model", "InstructionTime", "collective_time_us",
           "module_time_us"]

COLLECTIVE_KINDS = {
    "all-reduce": "all-reduce", "all-reduce-start": "all-reduce", "all-gather": "all-gather",
    "all-gather-start": "all-gather", "reduce-scatter": "reduce-scatter", "all-to-all": "all-to-all",
    "ragged-all-to-all": "all-to-all", "collective-permute": "collective-permute",
    "collective-permute-start": "collective-permute", "collective-broadcast": "all-gather",
    "send": "collective-permute", "recv": "collective-permute",
}
_NO_KERNEL = NO_DATA | {"reshape", "while", "call", "conditional"}


@runtime_checkable
class CostModel(Protocol):
    """What fusion and the scheduler need: a node's time and an async op's start-to-done latency (us)."""

    def node_time_us(self, inst: Instruction) -> float:
        """Time the instruction occupies its stream."""

    def async_latency_us(self, start: Instruction) -> float:
        """Time between an async start and its done."""


@dataclass
class InstructionTime:
    """A kernel's modeled numbers."""

    cost: Cost
    time_us: float
    bound: str  # compute | memory | latency | collective | none


def _group_size(inst: Instruction, default: int) -> int:
    groups = inst.attrs.get("replica_groups")
    if groups is not None:
        try:
            g = groups.groups()
        except (ValueError, TypeError):
            g = []
        if g and g[0]:
            return len(g[0])
    pairs = inst.attrs.get("source_target_pairs")
    if pairs:
        return 2
    return default


def _payload_bytes(inst: Instruction) -> float:
    """Bytes each device contributes / receives, by collective kind."""
    kind = COLLECTIVE_KINDS.get(inst.opcode, inst.opcode)
    shape = inst.shape
    if inst.opcode.endswith("-start") and shape.is_tuple and kind != "all-reduce":
        shape = shape.elements[-1]
    out = float(max(shape.byte_size, 0))
    if kind == "reduce-scatter":
        return float(sum(max(op.shape.byte_size, 0) for op in inst.operands))
    return out


def collective_time_us(kind: str, nbytes: float, n: int, device: DeviceSpec) -> float:
    """Modeled time of one collective of `kind` moving `nbytes` (the full buffer) among n GPUs."""
    if n <= 1:
        return device.kernel_launch_us
    intra = n <= device.gpus_per_node
    bw = device.nvlink_bandwidth if intra else device.network_bandwidth
    lat = device.nvlink_latency_us if intra else device.network_latency_us
    if kind == "all-reduce":
        ring = 2 * (n - 1) / n * nbytes / bw * 1e6 + 2 * (n - 1) * lat
        tree = 2 * nbytes / bw * 1e6 + 2 * math.ceil(math.log2(n)) * lat
        return min(ring, tree)
    if kind in ("all-gather", "reduce-scatter"):
        return (n - 1) / n * nbytes / bw * 1e6 + (n - 1) * lat
    if kind == "all-to-all":
        return (n - 1) / n * nbytes / bw * 1e6 + lat
    return nbytes / bw * 1e6 + lat  # collective-permute, send/recv: one hop


class AnalyticalGpuModel:
    """The CostModel of one device."""

    def __init__(self, device: DeviceSpec | str = "h100", num_devices: int = 8):
        self.device = get_device(device) if isinstance(device, str) else device
        self.num_devices = num_devices

    def instruction_time(self, inst: Instruction) -> InstructionTime:
        """Roofline time of a kernel (or collective time), with the bound that set it."""
        op = inst.opcode
        base = op[:-6] if op.endswith("-start") and op != "async-start" else op
        if op == "async-start":
            calls = inst.attrs.get("calls")
            base = calls.root.opcode if calls is not None and calls.root is not None else op
        if base in COLLECTIVE_KINDS or op in COLLECTIVE_KINDS:
            target = inst if op != "async-start" else inst.attrs["calls"].root
            kind = COLLECTIVE_KINDS.get(target.opcode, COLLECTIVE_KINDS.get(op, "all-reduce"))
            t = collective_time_us(kind, _payload_bytes(target), _group_size(target, self.num_devices), self.device)
            return InstructionTime(instruction_cost(inst), t, "collective")
        if op in _NO_KERNEL or op.endswith("-done") or op.endswith("-update"):
            return InstructionTime(Cost(), 0.0, "none")
        cost = instruction_cost(inst)
        d = self.device
        dtype = inst.operand(0).shape.dtype if inst.operand_count and not inst.operand(0).shape.is_tuple else "f32"
        rate = d.tensor_flops(dtype) if op in ("dot", "convolution") or _has_dot(inst) else d.fp32_flops
        compute_s = cost.flops / rate + cost.transcendentals / (d.fp32_flops / 4)
        memory_s = self._memory_bytes(inst, cost) / d.hbm_bandwidth
        time_us = max(compute_s, memory_s) * 1e6 + d.kernel_launch_us
        if max(compute_s, memory_s) * 1e6 < d.kernel_launch_us:
            bound = "latency"
        else:
            bound = "compute" if compute_s >= memory_s else "memory"
        return InstructionTime(cost, time_us, bound)

    def _memory_bytes(self, inst: Instruction, cost: Cost) -> float:
        """Bytes from HBM: an operand read more than once is charged once when it fits in L2."""
        seen = set()
        total = float(max(inst.shape.byte_size, 0))
        if cost.bytes_accessed == 0:
            return 0.0
        for op in inst.operands:
            if op in seen and op.shape.byte_size <= self.device.l2_bytes:
                continue
            seen.add(op)
            total += max(op.shape.byte_size, 0)
        return min(total, cost.bytes_accessed) if cost.bytes_accessed else total

    def node_time_us(self, inst: Instruction) -> float:
        """Kernel time; while/call/conditional: their bodies' time (a while: times its trip count)."""
        op = inst.opcode
        if op == "while":
            trips = _trip_count(inst)
            return trips * (self.computation_time_us(inst.attrs["body"])
                            + self.computation_time_us(inst.attrs["condition"]))
        if op == "call":
            return self.computation_time_us(inst.attrs["to_apply"])
        if op == "conditional":
            branches = inst.attrs.get("branch_computations") or [inst.attrs.get("true_computation"),
                                                                  inst.attrs.get("false_computation")]
            return max((self.computation_time_us(b) for b in branches if b is not None), default=0.0)
        if (op.endswith("-start") or op == "async-start") and op not in ("copy-start",):
            return 0.0  # the collective runs on its own stream; see async_latency_us
        return self.instruction_time(inst).time_us

    def async_latency_us(self, start: Instruction) -> float:
        """The collective's time."""
        return self.instruction_time(start).time_us

    def computation_time_us(self, comp: Computation) -> float:
        """Sequential time of a computation (no overlap: the unscheduled estimate)."""
        total = 0.0
        for inst in comp.instructions:
            if inst.opcode.endswith("-start") or inst.opcode == "async-start":
                total += self.async_latency_us(inst)
            else:
                total += self.node_time_us(inst)
        return total

    def module_time_us(self, module: Module) -> float:
        """Sequential time of the entry computation."""
        return self.computation_time_us(module.entry)


def _has_dot(inst: Instruction) -> bool:
    if inst.opcode != "fusion":
        return False
    return any(i.opcode in ("dot", "convolution") for i in inst.attrs["calls"].instructions)


def _trip_count(loop: Instruction) -> int:
    try:
        cfg = loop.backend_config_json()
    except ValueError:
        cfg = None
    if isinstance(cfg, dict) and "known_trip_count" in cfg:
        return int(cfg["known_trip_count"].get("n", 1))
    cond = loop.attrs["condition"]
    root = cond.root
    if root is not None and root.opcode == "compare" and str(root.attrs.get("direction")) == "LT":
        bound = root.operand(1)
        if bound.opcode == "constant" and bound.shape.rank == 0:
            try:
                return max(int(bound.attrs["literal"].scalar()), 1)
            except (ValueError, TypeError):
                return 1
    return 1


@cache
def get_cost_model(device: str = "h100", num_devices: int = 8) -> AnalyticalGpuModel:
    """The analytical model of a built-in device."""
    return AnalyticalGpuModel(device, num_devices)


def module_time_us(module: Module, device: str = "h100") -> float:
    """Modeled sequential time of a module's entry computation on `device`."""
    return get_cost_model(device).module_time_us(module)
