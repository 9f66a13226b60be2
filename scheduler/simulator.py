"""Run a schedule on a model of the device: one compute stream, one stream per collective type.

In program order: a compute op runs on the compute stream once its operands are ready; an async start
launches its collective on that collective's stream (the schedule already respects overlap limits) and
the collective takes the estimator's latency; a done waits for it — the wait is exposed communication. A synchronous
collective is all exposed. The result gives makespan, exposed communication, overlap fraction, peak
memory and a lower bound (max of the critical path and total compute).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hlo.ir import Computation, Instruction
from hlo.opcodes import COLLECTIVES
from scheduler.async_ops import async_kind, is_async_done, is_async_start, matching_start
from scheduler.costs import LatencyEstimator
from scheduler.graph import ScheduleGraph, buffer_bytes

__all__ = ["SimulationResult", "TraceEvent", "release_tail_bound", "simulate"]


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
    #: A second, tighter valid bound: max(lower_bound_us, the compute stream's single-machine bound with
    #: release times and tails, see `release_tail_bound`). `lower_bound_us` keeps its meaning.
    release_tail_bound_us: float = 0.0

    def summary(self) -> dict:
        """The numbers, without the events."""
        d = asdict(self)
        d.pop("events")
        return d


def _sync_collective(inst: Instruction) -> bool:
    return inst.opcode in COLLECTIVES and not is_async_start(inst)


def simulate(comp: Computation, estimator: LatencyEstimator, order: list[Instruction] | None = None,
             limits: dict[str, int] | None = None) -> SimulationResult:
    """Simulate `comp` executing `order` (default: its current order); `limits` caps collectives in
    flight per kind (default 1 each; key "default" for all kinds)."""
    order = order or comp.instructions
    limits = limits or {}
    in_flight: dict[str, list[float]] = {}
    comm_by_kind: dict[str, float] = {}
    finish: dict[Instruction, float] = {}
    comm_end: dict[Instruction, float] = {}
    events: list[TraceEvent] = []
    t = 0.0
    exposed = total_comm = compute = 0.0
    for inst in order:
        ready = max((finish.get(op, 0.0) for op in inst.operands), default=0.0)
        if is_async_start(inst):
            kind = async_kind(inst)
            done = next((u for u in inst.users if is_async_done(u)), None)
            latency = estimator.latency(inst, done) if done is not None else 0.0
            begin = max(t, ready)
            running = [e for e in in_flight.get(kind, []) if e > begin]
            if len(running) >= limits.get(kind, limits.get("default", 1)):
                running.sort()
                begin = running.pop(0)
            in_flight[kind] = running + [begin + latency]
            comm_by_kind[kind] = comm_by_kind.get(kind, 0.0) + latency
            comm_end[inst] = begin + latency
            total_comm += latency
            events.append(TraceEvent(inst.name, inst.opcode, kind, begin, begin + latency))
            t = max(t, ready)
            finish[inst] = t
        elif is_async_done(inst):
            start = matching_start(inst)
            end = comm_end.get(start, 0.0)
            wait = max(end - max(t, ready), 0.0)
            exposed += wait
            t = max(t, ready, end)
            finish[inst] = t
        elif _sync_collective(inst):
            cost = estimator.node_cost(inst)
            begin = max(t, ready)
            total_comm += cost
            exposed += cost
            events.append(TraceEvent(inst.name, inst.opcode, inst.opcode, begin, begin + cost))
            t = begin + cost
            finish[inst] = t
        else:
            cost = estimator.node_cost(inst)
            begin = max(t, ready)
            if cost > 0:
                events.append(TraceEvent(inst.name, inst.opcode, "compute", begin, begin + cost))
            compute += cost
            t = begin + cost
            finish[inst] = t
    graph = ScheduleGraph(comp, estimator)
    serial_comm = max((v / limits.get(k, limits.get("default", 1)) for k, v in comm_by_kind.items()), default=0.0)
    lower = max(graph.critical_path(), graph.total_compute(), serial_comm)
    overlap = (total_comm - exposed) / total_comm if total_comm > 0 else 1.0
    tight = max(lower, release_tail_bound(comp, estimator, order))
    return SimulationResult(comp.name, t, lower, exposed, total_comm, overlap, peak_memory(comp, order), compute,
                            events, tight)


def release_tail_bound(comp: Computation, estimator: LatencyEstimator, order: list[Instruction] | None = None,
                       exact_limit: int = 400) -> float:
    """A makespan bound valid for every order under `simulate`'s model.

    Every non-async instruction runs on the one compute stream. Instruction v cannot start before its
    head (longest cost+latency path from the sources along operand edges, a start->done edge weighing
    the collective's latency) and, once it ends, at least its tail (the longest such path after it) must
    still pass. So for any set S of them: makespan >= min head(S) + sum cost(S) + min tail(S); S ranges
    over {head >= h and tail >= tau} (only h or only tau above `exact_limit` instructions)."""
    order = order or comp.instructions
    members = set(order)

    def cost(i: Instruction) -> float:
        return 0.0 if is_async_start(i) or is_async_done(i) else estimator.node_cost(i)

    def edge(a: Instruction, b: Instruction) -> float:
        return estimator.latency(a, b) if is_async_start(a) and is_async_done(b) else 0.0

    head: dict[Instruction, float] = {}
    for inst in order:
        head[inst] = max((head[op] + cost(op) + edge(op, inst) for op in inst.operands if op in head), default=0.0)
    tail: dict[Instruction, float] = {}
    for inst in reversed(order):
        tail[inst] = max((edge(inst, u) + cost(u) + tail[u] for u in inst.users if u in members and u in tail),
                         default=0.0)
    jobs = [(head[i], tail[i], cost(i)) for i in order if cost(i) > 0]
    if not jobs:
        return 0.0
    best = 0.0
    by_head = sorted(jobs, key=lambda j: -j[0])
    total = 0.0
    for h, _, c in by_head:  # S = {head >= h}
        total += c
        best = max(best, h + total)
    total = 0.0
    for _, tau, c in sorted(jobs, key=lambda j: -j[1]):  # S = {tail >= tau}
        total += c
        best = max(best, tau + total)
    if len(jobs) <= exact_limit:
        prefix: list[tuple[float, float, float]] = []
        for h, tau, c in by_head:
            prefix.append((h, tau, c))
            total = 0.0
            for _, t2, c2 in sorted(prefix, key=lambda j: -j[1]):
                total += c2
                best = max(best, h + total + t2)
    return best


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
