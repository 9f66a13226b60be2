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
2. Exact moves (computations of at most `exact_limit` instructions, within `exact_steps` simulated
   instruction steps): one hoist at a time, also ones that overflow their window, kept when the
   simulated makespan drops.
3. Async hoists (before the rounds and after them), repeated while they help: every overlapped async
   done whose collective has ended by an earlier point of the stream moves up to the first such point
   (`hoist_dones`: it takes no stream time there and waits for nothing), then every overlapped async
   start moves up to just after the last of its operands, its control predecessors, the previous async
   op of its own kind and the previous side-effecting instruction (`hoist_starts`). A start takes no
   stream time and its operands are done by then, so its collective begins no later than before, and
   the order of each kind's collectives (which slot each takes, XLA's overlap limit in program order)
   is unchanged: the model is monotone, nothing runs later. A list schedule can leave a start below
   another kind's done, or a done long after its collective ended and before the next collective of
   its kind, so that one waits; this undoes both.

Memory: start hoists keep each started buffer live longer; they are kept only within the budget. Each
move must keep the simulator's peak memory within max(`memory_limit`, the input order's
peak) when `memory_limit` is set (0 = no limit). Window rounds check a conservative live-bytes profile
(a hoisted result is counted live from its new place to its old one, freed operands are not credited);
exact moves check the peak itself.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from hlo.ir import Computation, Instruction
from hlo.opcodes import COLLECTIVES
from scheduler.async_ops import async_kind, done_of, is_async_done, is_async_start, matching_start
from scheduler.costs import LatencyEstimator, is_overlapped_done, is_overlapped_start, stream_cost
from scheduler.graph import buffer_bytes, loop_carried_edges

__all__ = ["Timeline", "fill_exposed_windows", "hoist_starts", "hoist_dones"]

_EPS = 1e-9
#: Exact moves simulate the whole order per trial: at most this many instruction steps in all (a fraction of a second).
EXACT_STEPS = 500_000
#: Window rounds try at most this many candidates per window in computations above LARGE_COMPUTATION
#: instructions (on the 29k-instruction synthetic:mixed:3000: 1/3 less time, makespan within 0.05%).
LARGE_COMPUTATION = 20_000
LARGE_CANDIDATES = 16


class Timeline:
    """`simulate`'s timing model for one computation, precomputed for fast repeated runs of any order
    (instructions numbered once; a run works on lists indexed by those numbers)."""

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
        self.extra_preds: dict[Instruction, list[Instruction]] = {}  # start -> readers it must follow
        for reader, start in loop_carried_edges(comp):
            self.extra_preds.setdefault(start, []).append(reader)
        self._number()

    def _number(self) -> None:
        insts = list(self.comp.instructions)
        self.slot = {inst: i for i, inst in enumerate(insts)}
        slot = self.slot
        self._ops = [tuple(slot[op] for op in inst.operands if op in slot) for inst in insts]
        self._cost = [self.cost[inst] for inst in insts]
        # per slot: 0 plain, 1 overlapped start, 2 synced start, 3 overlapped done (with `_start`)
        self._role = [0] * len(insts)
        self._start = [-1] * len(insts)
        self._lat = [0.0] * len(insts)
        self._kind: list[str] = [""] * len(insts)
        for inst, i in slot.items():
            if inst in self.latency:
                self._role[i] = 2 if inst in self.synced else 1
                self._lat[i], self._kind[i] = self.latency[inst], self.kind[inst]
            elif inst in self.start_of and self.start_of[inst] in slot:
                self._role[i], self._start[i] = 3, slot[self.start_of[inst]]

    def _times(self, order: list[Instruction]) -> tuple[float, list[float], list[float], list[float]]:
        """(makespan, finish, stream free before, collective end) per slot, executing `order`."""
        from scheduler.simulator import claim_slot

        n = len(self._cost)
        finish, before, comm = [0.0] * n, [0.0] * n, [0.0] * n
        ops, cost, role, start, lat, kind, limit = (self._ops, self._cost, self._role, self._start, self._lat,
                                                    self._kind, self.limit)
        in_flight: dict[str, list[float]] = {}
        slot = self.slot
        t = 0.0
        for inst in order:
            i = slot[inst]
            now = t
            for o in ops[i]:
                if finish[o] > now:
                    now = finish[o]
            before[i] = t
            r = role[i]
            if r == 0:
                t = now + cost[i]
            elif r == 3:
                end = comm[start[i]]
                t = end if end > now else now
            else:
                begin = claim_slot(in_flight, kind[i], now, lat[i], limit[kind[i]])
                comm[i] = begin + lat[i]
                t = comm[i] if r == 2 else now
            finish[i] = t
        return t, finish, before, comm

    def run(self, order: list[Instruction]) -> TimelineRun:
        """Times of every instruction executing `order` (as `simulate` computes them)."""
        makespan, finish, before, comm = self._times(order)
        return TimelineRun(makespan, _Times(self.slot, finish), _Times(self.slot, before), _Times(self.slot, comm))

    def makespan(self, order: list[Instruction]) -> float:
        """The simulated makespan of `order` (equal to `simulate(...).makespan_us`)."""
        return self._times(order)[0]


class _Times:
    """Read-only per-instruction view of a run's list of times."""

    __slots__ = ("slot", "values")

    def __init__(self, slot: dict[Instruction, int], values: list[float]):
        self.slot, self.values = slot, values

    def __getitem__(self, inst: Instruction) -> float:
        return self.values[self.slot[inst]]

    def get(self, inst: Instruction, default: float = 0.0) -> float:
        i = self.slot.get(inst)
        return default if i is None else self.values[i]


@dataclass
class TimelineRun:
    """One run of a `Timeline`: per instruction, when it finished, when the compute stream was free
    before it, and (async starts) when its collective ended."""

    makespan: float
    finish: _Times
    stream_before: _Times
    comm_end: _Times


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
                memory_budget: int, max_candidates: int, trials: list[int]) -> tuple[list[Instruction], float] | None:
    """The first single hoist (any size) that makes the makespan strictly shorter, within memory; at
    most `trials[0]` simulations (decremented in place)."""
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
            if trials[0] <= 0:
                return None
            trials[0] -= 1
            moving = set(block)
            trial = order[:d] + block + [i for i in order[d:] if i not in moving]
            t = timeline.makespan(trial)
            if t < best - _EPS and (not memory_budget or peak_memory(comp, trial) <= memory_budget):
                return trial, t
            if tried >= max_candidates:
                break
    return None


def hoist_starts(order: list[Instruction], timeline: Timeline) -> list[Instruction]:
    """`order` with every overlapped async start moved up as far as its operands, its control
    predecessors, the readers of the loop-carried buffer it overwrites (`graph.loop_carried_edges`), the
    previous async op of its kind and the previous other side-effecting instruction allow (module
    docstring, step 3); the relative order of everything else is unchanged."""
    pos = {inst: i for i, inst in enumerate(order)}
    last_of_kind: dict[str, Instruction] = {}
    last_effect: Instruction | None = None
    after: dict[Instruction | None, list[Instruction]] = {}
    hoisted: set[Instruction] = set()
    for inst in order:
        kind = async_kind(inst) if (is_async_start(inst) or is_async_done(inst)) else None
        if inst in timeline.latency and inst not in timeline.synced and not inst.control_successors:
            anchors = [*inst.operands, *inst.control_predecessors, *timeline.extra_preds.get(inst, ()),
                       last_of_kind.get(kind), last_effect]
            anchor = max((a for a in anchors if a is not None), key=pos.__getitem__, default=None)
            if anchor is None or pos[anchor] < pos[inst] - 1:
                after.setdefault(anchor, []).append(inst)
                hoisted.add(inst)
        if kind is not None:
            last_of_kind[kind] = inst
        elif inst.has_side_effect:
            last_effect = inst
    if not hoisted:
        return order
    new: list[Instruction] = []

    def emit(x: Instruction) -> None:
        new.append(x)
        for y in after.get(x, ()):
            emit(y)

    for y in after.get(None, ()):
        emit(y)
    for inst in order:
        if inst not in hoisted:
            emit(inst)
    return new


def hoist_dones(order: list[Instruction], timeline: Timeline, run: TimelineRun) -> list[Instruction]:
    """`order` with every overlapped async done moved up to the first position after its operands and
    control predecessors where, in `run`, the stream reaches it after its collective ended (module
    docstring, step 3)."""
    pos = {inst: i for i, inst in enumerate(order)}
    before = [run.stream_before[inst] for inst in order]
    targets: dict[int, list[Instruction]] = {}
    for i, done in enumerate(order):
        start = timeline.start_of.get(done)
        if start is None or start in timeline.synced:
            continue
        floor = max((pos[a] for a in (*done.operands, *done.control_predecessors)), default=-1) + 1
        p = max(bisect_left(before, run.comm_end.get(start, 0.0) - _EPS, floor, i), floor)
        if p < i and before[p] < before[i] - _EPS:  # only past work, not across zero-time ops
            targets.setdefault(p, []).append(done)
    if not targets:
        return order
    moved = {d for ds in targets.values() for d in ds}
    new: list[Instruction] = []
    for i, inst in enumerate(order):
        new.extend(targets.get(i, ()))
        if inst not in moved:
            new.append(inst)
    return new


def _hoisted_async(order: list[Instruction], best: float, timeline: Timeline, comp: Computation,
                   memory_budget: int, max_rounds: int = 16, patience: int = 4) -> tuple[list[Instruction], float]:
    """(order, makespan) after rounds of `hoist_dones` + `hoist_starts` (each round can enable the next:
    an earlier collective lets its done, then the next start of its kind, move up) until nothing moves
    or `patience` rounds in a row did not shorten the makespan, within `memory_budget` (0 = none); never
    slower (the model says so; the check keeps that true)."""
    from scheduler.simulator import peak_memory

    run = timeline.run(order)
    idle = 0
    for _ in range(max_rounds):
        trial = hoist_starts(hoist_dones(order, timeline, run), timeline)
        if len(trial) == len(order) and all(a is b for a, b in zip(trial, order, strict=True)):
            break
        trial_run = timeline.run(trial)
        t = trial_run.makespan
        if t > best + _EPS or (memory_budget and peak_memory(comp, trial) > memory_budget):
            break
        idle = idle + 1 if t >= best - _EPS else 0
        order, best, run = trial, t, trial_run
        if idle >= patience:
            break
    return order, best


def fill_exposed_windows(comp: Computation, estimator: LatencyEstimator, order: list[Instruction],
                         limits: dict[str, int], max_rounds: int = 64, max_candidates: int = 64,
                         memory_limit: int = 0, exact_limit: int = 2000,
                         exact_steps: int = EXACT_STEPS) -> list[Instruction]:
    """`order` with compute hoisted into exposed windows (module docstring); never slower than `order`
    under `simulate`, and with `memory_limit` (bytes, 0 = none) never above max(memory_limit, the
    peak memory of `order`)."""
    from scheduler.simulator import peak_memory

    order = list(order)
    if not any(is_overlapped_done(i) for i in order):
        return order  # no window to fill
    if len(order) > LARGE_COMPUTATION:
        max_candidates = min(max_candidates, LARGE_CANDIDATES)
    timeline = Timeline(comp, estimator, limits)
    budget = max(memory_limit, peak_memory(comp, order)) if memory_limit else 0
    best = timeline.makespan(order)
    order, best = _hoisted_async(order, best, timeline, comp, budget)
    for _ in range(max_rounds):
        trial = _window_round(order, timeline, comp, budget, max_candidates)
        if trial is None:
            break
        t = timeline.makespan(trial)
        if t >= best - _EPS or (budget and peak_memory(comp, trial) > budget):
            break
        order, best = trial, t
    if len(order) <= exact_limit:
        trials = [max(exact_steps // max(len(order), 1), 1)]
        for _ in range(max_rounds):
            found = _exact_move(order, best, timeline, comp, budget, max_candidates, trials)
            if found is None:
                break
            order, best = found
    order, best = _hoisted_async(order, best, timeline, comp, budget)
    return order

