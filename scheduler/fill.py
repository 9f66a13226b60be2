"""`fill_exposed_windows`: move compute into the idle windows before async dones (not an XLA rule).

A bottom-up list scheduler decides the top of the program last; by then the ready set may hold little
but the first collective's done, so the compute stream idles while independent work sits further down.
The post-pass works in rounds on a `Timeline` (the simulator's model without events or bounds):

1. Window rounds (any size): simulate once; for each overlapped done whose wait is exposed, hoist compute
   ops that sit after it (each with the few operands it needs from after the window) to just before it,
   as long as they fit in the window as simulated: they start no earlier than their operands were ready
   and end before the collective does. Every instruction then runs no later than before (the model is
   monotone: the done ends when it did, and everything after it had only work removed or inputs made
   earlier), so a round never makes the makespan worse; it is kept when it makes it strictly shorter.
2. Exact moves (computations of at most `exact_limit` instructions): one hoist at a time, also ones that
   overflow their window, kept when the simulated makespan drops.

Memory: each move must keep the simulator's peak memory within max(`memory_limit`, the input order's
peak) when `memory_limit` is set (0 = no limit). Window rounds check a conservative live-bytes profile
(a hoisted result is counted live from its new place to its old one, freed operands are not credited);
exact moves check the peak itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from hlo.ir import Computation, Instruction
from hlo.opcodes import COLLECTIVES
from scheduler.async_ops import async_kind, done_of, is_async_done, is_async_start, matching_start
from scheduler.costs import LatencyEstimator, is_overlapped_done, is_overlapped_start, stream_cost
from scheduler.graph import buffer_bytes

__all__ = ["Timeline", "fill_exposed_windows"]

_EPS = 1e-9


class Timeline:
    """`simulate`'s timing model for one computation, precomputed for fast repeated runs of any order."""

    def __init__(self, comp: Computation, estimator: LatencyEstimator, limits: dict[str, int] | None = None):
        limits = limits or {}
        self.comp = comp
        self.cost: dict[Instruction, float] = {}
        self.latency: dict[Instruction, float] = {}  # async start -> its collective's time
        self.kind: dict[Instruction, str] = {}
        self.start_of: dict[Instruction, Instruction] = {}  # overlapped done -> its start
        self.limit: dict[str, int] = {}
        for inst in comp.instructions:
            self.cost[inst] = stream_cost(estimator, inst)
            if is_async_start(inst):
                done = done_of(inst)
                self.latency[inst] = float(estimator.latency(inst, done)) if done is not None else 0.0
                kind = self.kind[inst] = async_kind(inst)
                self.limit[kind] = limits.get(kind, limits.get("default", 1))
            elif is_overlapped_done(inst):
                start = matching_start(inst)
                if start is not None:
                    self.start_of[inst] = start
        self.synced = {i for i in self.latency if not is_overlapped_start(i)}
        self.movable = {i: _movable(i, comp) for i in comp.instructions}

    def run(self, order: list[Instruction]) -> TimelineRun:
        """Times of every instruction executing `order` (as `simulate` computes them)."""
        from scheduler.simulator import claim_slot

        run = TimelineRun()
        finish, comm_end, in_flight = run.finish, run.comm_end, run.in_flight
        t = 0.0
        for inst in order:
            ready = max((finish.get(op, 0.0) for op in inst.operands), default=0.0)
            run.stream_before[inst] = t
            now = max(t, ready)
            if inst in self.latency:
                kind, latency = self.kind[inst], self.latency[inst]
                begin = claim_slot(in_flight, kind, now, latency, self.limit[kind])
                comm_end[inst] = begin + latency
                t = begin + latency if inst in self.synced else now
            elif inst in self.start_of:
                t = max(now, comm_end.get(self.start_of[inst], 0.0))
            else:
                t = now + self.cost[inst]
            finish[inst] = t
        run.makespan = t
        return run

    def makespan(self, order: list[Instruction]) -> float:
        """The simulated makespan of `order` (equal to `simulate(...).makespan_us`)."""
        return self.run(order).makespan


@dataclass
class TimelineRun:
    """One run of a `Timeline`."""

    makespan: float = 0.0
    finish: dict[Instruction, float] = field(default_factory=dict)
    stream_before: dict[Instruction, float] = field(default_factory=dict)  # compute stream free, before it
    comm_end: dict[Instruction, float] = field(default_factory=dict)
    in_flight: dict[str, list[float]] = field(default_factory=dict)


def _movable(inst: Instruction, comp: Computation) -> bool:
    """What a hoist may move: no async op, collective, root or side effect."""
    return not (is_async_start(inst) or is_async_done(inst) or inst.opcode in COLLECTIVES
                or inst is comp.root or inst.has_side_effect)


def _closure(inst: Instruction, timeline: Timeline, pos: dict[Instruction, int], window: int,
             moved: set[Instruction], limit: int = 8) -> list[Instruction] | None:
    """`inst` with the operands it needs that sit at or after position `window` and are not hoisted
    already (at most `limit`, all movable), in their order; None if it cannot move."""
    need, stack = {inst}, [inst]
    while stack:
        x = stack.pop()
        for op in [*x.operands, *x.control_predecessors]:
            if op in need or op in moved or pos.get(op, -1) < window:
                continue
            if not timeline.movable.get(op, False) or len(need) >= limit:
                return None
            need.add(op)
            stack.append(op)
    return sorted(need, key=pos.__getitem__)


def live_profile(comp: Computation, order: list[Instruction]) -> np.ndarray:
    """Live bytes at each position of `order`, as `simulator.peak_memory` counts them."""
    pos = {inst: i for i, inst in enumerate(order)}
    last_use = {}
    for inst in order:
        for op in inst.operands:
            last_use[op] = max(last_use.get(op, -1), pos[inst])
    if comp.root is not None:
        last_use[comp.root] = len(order)
    delta = np.zeros(len(order) + 2, dtype=np.int64)
    for inst in order:
        size = buffer_bytes(inst)
        if size and inst in last_use:
            delta[pos[inst]] += size
            delta[last_use[inst] + 1] -= size
    return np.cumsum(delta)[: len(order)]


@dataclass
class _Round:
    """One window round: the hoists found against one run of the current order."""

    order: list[Instruction]
    run: TimelineRun
    profile: np.ndarray | None
    budget: int
    pos: dict[Instruction, int] = field(default_factory=dict)
    moved: set[Instruction] = field(default_factory=set)
    early: dict[Instruction, float] = field(default_factory=dict)  # hoisted -> its finish in the window
    inserts: dict[Instruction, list[Instruction]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pos = {inst: i for i, inst in enumerate(self.order)}

    def finish(self, inst: Instruction) -> float:
        return self.early.get(inst, self.run.finish.get(inst, 0.0))

    def fits_memory(self, block: list[Instruction], window: int) -> bool:
        """Conservatively: each hoisted result is live from the window to its old position."""
        if self.profile is None:
            return True
        extra = np.zeros(len(self.order), dtype=np.int64)
        for inst in block:
            extra[max(window - 1, 0): self.pos[inst]] += buffer_bytes(inst)
        if int((self.profile + extra).max()) > self.budget:
            return False
        self.profile = self.profile + extra
        return True


def _fill_window(rnd: _Round, timeline: Timeline, comp: Computation, d: int, done: Instruction,
                 max_candidates: int) -> None:
    """Hoist into the window before `done` (position `d`) what fits in it; tries at most
    `max_candidates` compute ops after it."""
    end = rnd.run.comm_end.get(timeline.start_of[done], 0.0)
    t = rnd.run.stream_before[done]
    tried = 0
    for k in range(d + 1, len(rnd.order)):
        inst = rnd.order[k]
        if end - t <= _EPS or tried >= max_candidates:
            return
        if inst in rnd.moved or not timeline.movable[inst] or timeline.cost[inst] <= 0:
            continue
        tried += 1
        block = _closure(inst, timeline, rnd.pos, d, rnd.moved)
        if block is None:
            continue
        times, now = {}, t
        for m in block:
            ready = max((times.get(op, rnd.finish(op)) for op in m.operands), default=0.0)
            now = times[m] = max(now, ready) + timeline.cost[m]
        if now > end + _EPS or not rnd.fits_memory(block, d):
            continue
        rnd.inserts.setdefault(done, []).extend(block)
        rnd.moved.update(block)
        rnd.early.update(times)
        t = now


def _window_round(order: list[Instruction], timeline: Timeline, comp: Computation, memory_budget: int,
                  max_candidates: int) -> list[Instruction] | None:
    """One window round over `order`: the new order, or None if nothing was hoisted."""
    run = timeline.run(order)
    profile = live_profile(comp, order) if memory_budget else None
    rnd = _Round(order, run, profile, memory_budget)
    for d, done in enumerate(order):
        if done not in timeline.start_of:
            continue
        if run.comm_end.get(timeline.start_of[done], 0.0) > run.stream_before[done] + _EPS:
            _fill_window(rnd, timeline, comp, d, done, max_candidates)
    if not rnd.inserts:
        return None
    new: list[Instruction] = []
    for inst in order:
        new.extend(rnd.inserts.get(inst, ()))
        if inst not in rnd.moved:
            new.append(inst)
    return new


def _exact_move(order: list[Instruction], best: float, timeline: Timeline, comp: Computation,
                memory_budget: int, max_candidates: int) -> tuple[list[Instruction], float] | None:
    """The first single hoist (any size) that makes the makespan strictly shorter, within memory."""
    from scheduler.simulator import peak_memory

    pos = {inst: i for i, inst in enumerate(order)}
    for d, done in enumerate(order):
        if done not in timeline.start_of:
            continue
        tried = 0
        for inst in islice(order, d + 1, None):
            if not timeline.movable[inst] or timeline.cost[inst] <= 0:
                continue
            block = _closure(inst, timeline, pos, d, set())
            if block is None:
                continue
            tried += 1
            moving = set(block)
            trial = order[:d] + block + [i for i in order[d:] if i not in moving]
            t = timeline.makespan(trial)
            if t < best - _EPS and (not memory_budget or peak_memory(comp, trial) <= memory_budget):
                return trial, t
            if tried >= max_candidates:
                break
    return None


def fill_exposed_windows(comp: Computation, estimator: LatencyEstimator, order: list[Instruction],
                         limits: dict[str, int], max_rounds: int = 64, max_candidates: int = 64,
                         memory_limit: int = 0, exact_limit: int = 2000) -> list[Instruction]:
    """`order` with compute hoisted into exposed windows (module docstring); never slower than `order`
    under `simulate`, and with `memory_limit` (bytes, 0 = none) never above max(memory_limit, the
    peak memory of `order`)."""
    from scheduler.simulator import peak_memory

    order = list(order)
    if not any(is_overlapped_done(i) for i in order):
        return order  # no window to fill
    timeline = Timeline(comp, estimator, limits)
    budget = max(memory_limit, peak_memory(comp, order)) if memory_limit else 0
    best = timeline.makespan(order)
    for _ in range(max_rounds):
        trial = _window_round(order, timeline, comp, budget, max_candidates)
        if trial is None:
            break
        t = timeline.makespan(trial)
        if t >= best - _EPS or (budget and peak_memory(comp, trial) > budget):
            break
        order, best = trial, t
    if len(order) <= exact_limit:
        for _ in range(max_rounds):
            found = _exact_move(order, best, timeline, comp, budget, max_candidates)
            if found is None:
                break
            order, best = found
    return order

