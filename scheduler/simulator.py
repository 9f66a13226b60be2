"""Run a schedule on a model of the device: one compute stream and the async streams of the stream model.

In program order: a compute op runs on the compute stream once its operands are ready; an async start
launches its collective on its stream (`async_ops.async_kind`) once the compute stream reaches it (XLA:GPU's
async stream waits for the compute stream) and the stream is free, and the collective takes the
estimator's latency; a done waits for it — the wait is exposed communication. On XLA:GPU's model
(`async_ops.STREAM_MODELS`, the default) every async collective shares the one collective stream and runs
after the previous one; in the per-type model each collective type has `limit` streams. A synchronous
collective is all exposed, and so is an async start XLA marked `is_sync` (backend_config
collective_backend_config.is_sync): it runs on the compute stream for its latency (in the per-type model
also holding a slot of its kind), its done waits for nothing. The result gives makespan, exposed communication, overlap fraction,
peak memory and a lower bound valid for every order (`bounds.py`: critical path, per-stream work, and
single-machine bounds with release times and tails).

The streams' clocks are `cost_model.streams.StreamMachine`'s, the machine the collective-pipeliner's gate
list-schedules on too; the times are a `cost_model.estimator.LatencyEstimator`'s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hlopt.cost_model.streams import StreamMachine, claim_slot
from hlopt.hlo.ir import Computation, Instruction
from hlopt.hlo.opcodes import COLLECTIVES
from hlopt.scheduler.async_ops import (
    async_kind,
    done_of,
    is_async_done,
    is_async_start,
    matching_start,
    stream_slots,
    sync_start_holds_slot,
)
from hlopt.scheduler.bounds import basic_lower_bound, release_tail_bound
from hlopt.scheduler.costs import LatencyEstimator, is_overlapped_done, is_overlapped_start, stream_cost
from hlopt.scheduler.graph import buffer_bytes

__all__ = ["SimulationResult", "TraceEvent", "release_tail_bound", "simulate", "claim_slot"]


@dataclass
class TraceEvent:
    """One interval on one stream (for traces and Gantt charts), in microseconds."""

    name: str
    opcode: str
    stream: str
    start: float
    end: float


@dataclass
class SimulationResult:
    """What the simulated schedule achieved."""

    computation: str
    makespan_us: float
    lower_bound_us: float
    exposed_comm_us: float
    total_comm_us: float
    overlap_fraction: float
    peak_memory_bytes: int
    compute_us: float
    events: list[TraceEvent] = field(default_factory=list, repr=False)
    #: The same bound as `lower_bound_us` (kept for readers of the name): max of `basic_lower_bound_us` and
    #: the single-machine bounds with release times and tails of every stream (`bounds.release_tail_bound`).
    release_tail_bound_us: float = 0.0
    #: The looser bound reported before: max(critical path, total compute, per-kind serialized comm / limit).
    basic_lower_bound_us: float = 0.0

    def summary(self) -> dict:
        """The numbers, without the events."""
        d = asdict(self)
        d.pop("events")
        return d


def _sync_collective(inst: Instruction) -> bool:
    """A synchronous collective op (not a start/done pair): it blocks the compute stream."""
    return inst.opcode in COLLECTIVES and not is_async_start(inst)


def simulate(comp: Computation, estimator: LatencyEstimator, order: list[Instruction] | None = None,
             limits: dict[str, int] | None = None) -> SimulationResult:
    """Simulate `comp` executing `order` (default: its current order) on the current stream model
    (`async_ops.stream_model`); `limits` gives the overlap limit per resource (default 1 each; key
    "default" for all): in the per-type model that many of a kind run at once, on XLA:GPU's each stream
    runs one at a time. A start XLA marked `is_sync` holds the compute stream for its collective's time
    (and, per-type, a slot of its kind)."""
    order = order or comp.instructions
    limits = limits or {}
    sync_slot = sync_start_holds_slot()
    machine = StreamMachine()  # the compute stream and the async streams (cost_model.streams)
    finish: dict[Instruction, float] = {}
    comm_end: dict[Instruction, float] = {}
    events: list[TraceEvent] = []
    exposed = total_comm = compute = 0.0
    for inst in order:
        now = machine.wait(max((finish.get(op, 0.0) for op in inst.operands), default=0.0))
        if is_async_start(inst):
            kind = async_kind(inst)
            done = done_of(inst)
            latency = estimator.latency(inst, done) if done is not None else 0.0
            overlapped = is_overlapped_start(inst)
            if overlapped or sync_slot:
                begin = machine.collective(now, latency, kind, stream_slots(limits.get(kind, limits.get("default", 1))))
            else:
                begin = now
            comm_end[inst] = begin + latency
            total_comm += latency
            if overlapped:
                events.append(TraceEvent(inst.name, inst.opcode, kind, begin, begin + latency))
            else:  # sync-marked: the compute stream waits for the slot and the collective
                events.append(TraceEvent(inst.name, inst.opcode, inst.opcode, begin, begin + latency))
                exposed += begin + latency - now
                machine.wait(begin + latency)
        elif is_overlapped_done(inst):
            end = comm_end.get(matching_start(inst), 0.0)
            exposed += max(end - now, 0.0)
            machine.wait(end)
        elif is_async_done(inst):  # the done of a sync-marked start: nothing left to wait for
            pass
        elif _sync_collective(inst):
            cost = stream_cost(estimator, inst)
            total_comm += cost
            exposed += cost
            events.append(TraceEvent(inst.name, inst.opcode, inst.opcode, now, now + cost))
            machine.compute(now, cost)
        else:
            cost = estimator.node_cost(inst)
            if cost > 0:
                events.append(TraceEvent(inst.name, inst.opcode, "compute", now, now + cost))
            compute += cost
            machine.compute(now, cost)
        finish[inst] = machine.compute_free
    t = machine.compute_free
    basic = basic_lower_bound(comp, estimator, limits)
    lower = max(basic, release_tail_bound(comp, estimator, order, limits))
    overlap = (total_comm - exposed) / total_comm if total_comm > 0 else 1.0
    return SimulationResult(comp.name, t, lower, exposed, total_comm, overlap, peak_memory(comp, order), compute,
                            events, lower, basic)


def peak_memory(comp: Computation, order: list[Instruction]) -> int:
    """Peak bytes of live buffers executing `order` (a buffer lives from its definition to its last use)."""
    position = {inst: i for i, inst in enumerate(order)}
    last_use: dict[Instruction, int] = {}
    for inst in order:
        for op in inst.operands:
            last_use[op] = max(last_use.get(op, -1), position[inst])
    if comp.root is not None:
        last_use[comp.root] = len(order)
    frees: dict[int, int] = {}
    live = peak = 0
    for i, inst in enumerate(order):
        size = buffer_bytes(inst)
        if size and inst in last_use:
            live += size
            frees[last_use[inst]] = frees.get(last_use[inst], 0) + size
        peak = max(peak, live)
        live -= frees.pop(i, 0)
    return peak
