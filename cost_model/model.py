"""The `CostModel` interface fusion and the scheduler take, and the analytical GPU model behind it.

`AnalyticalGpuModel(device)` times every instruction of a module:

- a kernel (fusion or unfused op): `cost_model.kernel` (XLA:GPU's roofline, tensor cores for GEMMs) plus the
  kernel launch overhead;
- a collective: `cost_model.collectives` (NCCL algorithms/protocols, NVLink inside a node, the network
  across nodes), group size from `replica_groups` / `source_target_pairs`; an async collective occupies
  no compute-stream time: its start->done latency is the collective's time;
- while loops their body times the trip count (known_trip_count, or a `i < constant` condition),
  conditionals their slowest branch, calls their body;
- instructions that launch nothing (parameters, tuples, bitcasts, ...) take no time.

The flops and bytes it reports are XLA's HloCostAnalysis (`cost_model.analysis`), so they match what
`jax`'s cost analysis prints. Plug in another model (a measured profile) by implementing `CostModel`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from hlopt.cost_model.analysis import Cost, CostAnalysis, leaf_bytes, shape_size
from hlopt.cost_model.collectives import CollectiveEstimate, collective_estimate
from hlopt.cost_model.devices import DeviceSpec, get_device
from hlopt.cost_model.kernel import KernelEstimate, KernelModel, combine
from hlopt.cost_model.op_profiles import DEFAULT_CYCLES, mean_transcendental_cycles
from hlopt.hlo.ir import Computation, Instruction, Module

__all__ = ["CostModel", "AnalyticalGpuModel", "get_cost_model", "InstructionTime", "collective_time_us",
           "module_time_us", "COLLECTIVE_KINDS", "collective_kind", "trip_count"]

#: Opcode -> collective kind for the collective model.
COLLECTIVE_KINDS = {
    "all-reduce": "all-reduce", "all-reduce-start": "all-reduce", "all-gather": "all-gather",
    "all-gather-start": "all-gather", "reduce-scatter": "reduce-scatter", "all-to-all": "all-to-all",
    "ragged-all-to-all": "all-to-all", "collective-permute": "collective-permute",
    "collective-permute-start": "collective-permute", "collective-broadcast": "collective-broadcast",
    "send": "send", "recv": "recv",
}
_CONTROL = frozenset({"while", "call", "conditional"})
#: Opcodes that take no time on a stream: no kernel (`kernel.NO_KERNEL`), never a collective or control flow
#: (a scheduled step's parameters and get-tuple-elements are a third of its nodes)
_NO_TIME = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast"})


@runtime_checkable
class CostModel(Protocol):
    """What fusion and the scheduler need: a node's time and an async op's start-to-done latency (us)."""

    def node_time_us(self, inst: Instruction) -> float:
        """Time the instruction occupies its stream."""

    def async_latency_us(self, start: Instruction) -> float:
        """Time between an async start and its done."""


@dataclass(init=False)
class InstructionTime:
    """An instruction's modeled numbers: XLA's flops/bytes, time (us), what bounds it.

    `cost` may be given as a function that computes it: it runs when `cost` is first read (the scheduler
    reads only the time, and XLA's HloCostAnalysis of a fusion walks its whole fused computation)."""

    time_us: float
    bound: str  # compute | memory | latency | network | none
    kernel: KernelEstimate | None = None
    collective: CollectiveEstimate | None = None

    def __init__(self, cost: Cost | Callable[[], Cost], time_us: float, bound: str,
                 kernel: KernelEstimate | None = None, collective: CollectiveEstimate | None = None) -> None:
        self._cost = cost
        self.time_us = time_us
        self.bound = bound
        self.kernel = kernel
        self.collective = collective

    @property
    def cost(self) -> Cost:
        """XLA's flops and bytes of the instruction (computed on first read when given as a function)."""
        if not isinstance(self._cost, Cost):
            self._cost = self._cost()
        return self._cost


def collective_kind(inst: Instruction) -> tuple[Instruction, str] | None:
    """(the collective instruction, its kind) for a collective or an async start wrapping one."""
    op = inst.opcode
    if op == "async-start":
        calls = inst.attrs.get("calls")
        root = calls.root if isinstance(calls, Computation) else None
        if root is not None and root.opcode in COLLECTIVE_KINDS:
            return root, COLLECTIVE_KINDS[root.opcode]
        return None
    if op in COLLECTIVE_KINDS:
        return inst, COLLECTIVE_KINDS[op]
    return None


def _payload_bytes(inst: Instruction, kind: str) -> float:
    """The collective's buffer: all-gather output, reduce-scatter input, else the data sent."""
    if kind == "reduce-scatter" or kind == "all-to-all":
        return float(sum(leaf_bytes(op.shape) for op in inst.operands))
    shape = inst.shape
    if inst.opcode.endswith("-start") and shape.is_tuple and shape.elements:
        shape = shape.elements[1] if kind == "all-gather" and len(shape.elements) > 1 else shape.elements[0]
    if kind in ("collective-permute", "send", "recv") and inst.operands:
        return float(leaf_bytes(inst.operand(0).shape))
    return float(leaf_bytes(shape))


def trip_count(loop: Instruction) -> int:
    """A while loop's trip count: backend_config's known_trip_count, or `i < N` / `N > i` with i from 0."""
    cfg = loop.backend_config_dict()
    if "known_trip_count" in cfg:
        try:
            return max(int(cfg["known_trip_count"].get("n", 1)), 1)
        except (TypeError, ValueError, AttributeError):
            return 1
    cond = loop.attrs.get("condition")
    root = cond.root if cond is not None else None
    if root is None or root.opcode != "compare":
        return 1
    direction = str(root.attrs.get("direction", ""))
    bound = root.operand(1) if direction == "LT" else root.operand(0) if direction == "GT" else None
    if bound is None or bound.opcode != "constant" or bound.shape.is_tuple or bound.shape.rank != 0:
        return 1
    try:
        return max(int(bound.attrs["literal"].to_numpy()), 1)
    except (KeyError, TypeError, ValueError, AttributeError):
        return 1


class AnalyticalGpuModel:
    """The CostModel of one device."""

    def __init__(self, device: DeviceSpec | str = "h100", num_devices: int = 8, library: str = "nccl"):
        self.device = get_device(device)
        self.num_devices = num_devices
        self.library = library
        self.kernels = KernelModel(self.device)
        self._xla = CostAnalysis()
        self._times: dict[Instruction, InstructionTime] = {}

    # -- per instruction

    def instruction_time(self, inst: Instruction) -> InstructionTime:
        """The instruction's modeled time (a kernel: with launch overhead; a collective: its duration)."""
        got = self._times.get(inst)
        if got is None:
            got = self._times[inst] = self._instruction_time(inst)
        return got

    def forget(self, inst: Instruction) -> None:
        """Drop cached numbers of an instruction that changed."""
        self._times.pop(inst, None)
        self.kernels.forget(inst)
        self._xla.forget(inst)

    def _instruction_time(self, inst: Instruction) -> InstructionTime:
        cost = functools.partial(self._xla.cost, inst)  # read on demand: the scheduler needs only the time
        coll = collective_kind(inst)
        if coll is not None:
            est = self.collective(inst)
            return InstructionTime(cost, est.time_us, est.bound, collective=est)
        if inst.opcode in _CONTROL:
            return InstructionTime(cost, self.node_time_us(inst), "none")
        if inst.opcode == "copy-start":
            t = shape_size(inst.operand(0).shape) / self.device.hbm_bandwidth * 1e6 + self.device.kernel_launch_us
            return InstructionTime(cost, t, "memory")
        kernel = self.kernels.estimate(inst)
        if kernel is None:
            return InstructionTime(cost, 0.0, "none")
        launch = self.device.kernel_launch_us
        bound = "latency" if kernel.exec_us < launch else kernel.bound
        return InstructionTime(cost, kernel.exec_us + launch, bound, kernel=kernel)

    def collective(self, inst: Instruction) -> CollectiveEstimate:
        """The collective model's estimate for a collective (or an async start wrapping one)."""
        found = collective_kind(inst)
        if found is None:
            raise ValueError(f"{inst.name} is not a collective")
        target, kind = found
        n, cross = self._group(target)
        return collective_estimate(kind, _payload_bytes(target, kind), n, self.device, self.library, cross)

    def _group(self, inst: Instruction) -> tuple[int, bool | None]:
        """Group size and whether a group spans nodes (None: decide by size)."""
        gpn = self.device.gpus_per_node
        pairs = inst.attrs.get("source_target_pairs")
        if pairs:
            cross = any(int(s) // gpn != int(t) // gpn for s, t in pairs)
            return 2, cross
        groups = inst.attrs.get("replica_groups")
        listed: list[list[int]] = []
        if groups is not None and hasattr(groups, "groups"):
            try:
                listed = [g for g in groups.groups() if g]
            except (ValueError, TypeError):
                listed = []
        if not listed:
            return self.num_devices, None
        cross = any(len({d // gpn for d in g}) > 1 for g in listed)
        return max(len(g) for g in listed), cross

    # -- the CostModel interface

    def node_time_us(self, inst: Instruction) -> float:
        """Time on the compute stream: kernels, sync collectives, control flow bodies; async starts 0."""
        if inst.opcode in _NO_TIME:
            return 0.0
        if inst.opcode in _CONTROL:
            return control_flow_time_us(inst, self.computation_time_us)
        if _is_async_start(inst):
            return 0.0
        return self.instruction_time(inst).time_us

    def async_latency_us(self, start: Instruction) -> float:
        """An async start's duration: the collective, the async copy, or the wrapped computation."""
        if collective_kind(start) is not None or start.opcode == "copy-start":
            return self.instruction_time(start).time_us
        calls = start.attrs.get("calls")
        if isinstance(calls, Computation):
            return self.computation_time_us(calls)
        return self.instruction_time(start).time_us

    # -- aggregates

    def computation_time_us(self, comp: Computation) -> float:
        """Sequential time of a computation (async work not overlapped: the unscheduled estimate)."""
        total = 0.0
        for inst in comp.instructions:
            total += self.async_latency_us(inst) if _is_async_start(inst) else self.node_time_us(inst)
        return total

    def module_time_us(self, module: Module) -> float:
        """Sequential time of the entry computation."""
        return self.computation_time_us(module.entry)

    def kernel_time_us(self, flops: float, transcendentals: float, nbytes: float) -> float:
        """A quick roofline for a kernel known only by XLA's HloCostAnalysis totals (one flop or one
        transcendental per element op), with the whole GPU busy and launch overhead included: what
        fusion uses to compare hypothetical kernels. Each flop costs XLA:GPU's default cycles per
        element op and each transcendental the device's mean transcendental cycles, so these estimates
        agree with `node_time_us` of unfused instructions."""
        return self.weighted_kernel_time_us(flops * DEFAULT_CYCLES + transcendentals * self._transcendental_cycles,
                                            nbytes)

    def weighted_kernel_time_us(self, gpu_flops: float, nbytes: float) -> float:
        """The same roofline for XLA:GPU-weighted flops (`gpu_flops`), launch included."""
        d = self.device
        return combine(gpu_flops / d.fp32_flops, nbytes / d.hbm_bandwidth) * 1e6 + d.kernel_launch_us

    def gpu_flops(self, inst: Instruction) -> float:
        """XLA:GPU's flops of one instruction (cycles per element times elements; a fusion: weighted by
        utilization): what `weighted_kernel_time_us` takes."""
        return self.kernels.gpu_cost(inst).flops

    @property
    def _transcendental_cycles(self) -> float:
        return mean_transcendental_cycles(self.device.op_profile, self.device.op_cycles)


def control_flow_time_us(inst: Instruction, computation_time_us) -> float:
    """A while (body and condition times the trip count, plus the last condition), call (its body) or
    conditional (its slowest branch), with `computation_time_us` timing the called computations."""
    op = inst.opcode
    if op == "while":
        body = computation_time_us(inst.attrs["body"])
        cond = computation_time_us(inst.attrs["condition"])
        return trip_count(inst) * (body + cond) + cond
    if op == "call":
        return computation_time_us(inst.attrs["to_apply"])
    return max((computation_time_us(b) for b in inst.called_computations if b is not None), default=0.0)


def _is_async_start(inst: Instruction) -> bool:
    op = inst.opcode
    return op in ("async-start", "all-reduce-start", "all-gather-start", "collective-permute-start",
                  "copy-start", "send", "recv")


def get_cost_model(device: str = "h100", num_devices: int = 8, library: str = "nccl") -> AnalyticalGpuModel:
    """A fresh model (it caches per instruction: one per analysis or pass run): the user model registered
    under `device` (`cost_model.register_cost_model`), else the analytical model of that device."""
    from hlopt.cost_model.profile import user_cost_model

    if isinstance(device, str):
        user = user_cost_model(device)
        if user is not None:
            return user
    return AnalyticalGpuModel(device, num_devices, library)


def module_time_us(module: Module, device: str = "h100") -> float:
    """Modeled sequential time of a module's entry computation on `device` (a fresh model, no caching)."""
    model = get_cost_model(device)
    if hasattr(model, "module_time_us"):
        return model.module_time_us(module)
    return sum(model.node_time_us(i) for i in module.entry.instructions)


def collective_time_us(kind: str, nbytes: float, n: int, device: DeviceSpec | str = "h100",
                       library: str = "nccl") -> float:
    """Modeled time (us) of one collective of `kind` on `nbytes` among `n` GPUs."""
    return collective_estimate(kind, nbytes, n, get_device(device), library).time_us
