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

4. Done sinking (last, `sink_dones`): every overlapped async done moves back down to just before its first
   user, control successor or the next async op of its kind, where XLA's list scheduler puts it. The hoists
   of step 3 leave a done exactly the estimated latency after its start; on the real machine a collective
   that runs longer than estimated would then hold the compute stream, while the sunk done waits only
   where its value is needed. The model is monotone here too (a done takes no stream time).

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
from typing import NamedTuple

import numpy as np
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
from hlopt.scheduler.costs import LatencyEstimator, is_overlapped_done, is_overlapped_start
from hlopt.scheduler.graph import Node, ScheduleGraph, buffer_bytes, loop_carried_edges

__all__ = ["Timeline", "fill_exposed_windows", "hoist_starts", "hoist_dones", "sink_dones"]

_EPS = 1e-9
#: Exact moves simulate the whole order per trial: at most this many instruction steps in all (a fraction of a second).
EXACT_STEPS = 500_000
#: Window rounds try at most this many candidates per window in computations above LARGE_COMPUTATION
#: instructions (on the 29k-instruction synthetic:mixed:3000: 1/3 less time, makespan within 0.05%).
LARGE_COMPUTATION = 20_000
LARGE_CANDIDATES = 16
#: Rounds of fill + stream re-ordering (`stream_order`), while a round shortens the makespan; computations
#: above STREAM_REORDER_LIMIT instructions get one fill and no re-ordering (its simulations grow with size).
STREAM_ROUNDS = 4
STREAM_REORDER_LIMIT = 4000

#: Roles of a slot in `Timeline.times`.
_PLAIN, _OVERLAPPED_START, _SYNCED_START, _OVERLAPPED_DONE = 0, 1, 2, 3

Slots = list[int]  # an order of a computation, as `Timeline` slot numbers


class Run(NamedTuple):
    """A simulation of one order on a `Timeline` (`Timeline.times`), per slot number."""

    makespan: float
    finish: list[float]  # when each slot's instruction finishes
    stream_before: list[float]  # when the compute stream is free before it
    comm_end: list[float]  # async starts: when their collective ends


def _is_inst_of(node: Node, inst: Instruction) -> bool:
    return node.inst is inst


def _slots(slot: dict[Instruction, int], insts: tuple[Instruction, ...]) -> tuple[int, ...]:
    """The slots of those of `insts` that have one, in their order."""
    try:
        return tuple(map(slot.__getitem__, insts))
    except KeyError:
        return tuple(slot[x] for x in insts if x in slot)


class Timeline:
    """`simulate`'s timing model for one computation, precomputed for fast repeated runs of any order.

    The instructions are numbered once (`slot`, in the computation's order) and everything the fill
    reads per instruction is kept in lists indexed by those numbers, so the post-pass works on orders
    of ints (`Slots`: `slots_of` / `insts_of` convert) without hashing instructions."""

    def __init__(self, comp: Computation, estimator: LatencyEstimator, limits: dict[str, int] | None = None,
                 graph: ScheduleGraph | None = None):
        """`graph` (optional): the `ScheduleGraph` of `comp` in its current order and sync marks, whose node
        costs and async flags are then used instead of asking the estimator and classifying every
        instruction again (only if it was built with the same `estimator`)."""
        limits = limits or {}
        self.comp = comp
        self.insts: list[Instruction] = list(comp.instructions)
        self.slot: dict[Instruction, int] = {inst: i for i, inst in enumerate(self.insts)}
        self.latency: dict[Instruction, float] = {}  # async start -> its collective's time
        self.kind: dict[Instruction, str] = {}
        self.start_of: dict[Instruction, Instruction] = {}  # overlapped done -> its start
        self.limit: dict[str, int] = {}
        self.synced: set[Instruction] = set()
        self.extra_preds: dict[Instruction, list[Instruction]] = {}  # start -> readers it must follow
        for reader, start in loop_carried_edges(comp):
            self.extra_preds.setdefault(start, []).append(reader)
        n = len(self.insts)
        self.cost = [0.0] * n
        self.role = [_PLAIN] * n
        self.start = [-1] * n  # overlapped done -> its start's slot
        self.lat = [0.0] * n
        self.slot_kind: list[str] = [""] * n
        self.async_kind: list[str | None] = [None] * n  # kind of any async start or done
        self.effect = [False] * n  # has a side effect
        self.movable = [False] * n
        self.hoistable = [False] * n  # an overlapped start without control successors
        self._bytes: list[int] | None = None
        nodes = graph.nodes if graph is not None and graph.comp is comp and graph.estimator is estimator else None
        if nodes is not None and len(nodes) == n and all(map(_is_inst_of, nodes, self.insts)):
            self._bytes = [node.bytes for node in nodes]
            for i, node in enumerate(nodes):
                self._classify_node(i, node, estimator, limits)
        else:
            for i, inst in enumerate(self.insts):
                self._classify(i, inst, estimator, limits)
        self._number()

    def _classify(self, i: int, inst: Instruction, estimator: LatencyEstimator, limits: dict[str, int]) -> None:
        """Slot `i`'s cost, role and flags (with the dicts of async starts and dones)."""
        start, done = is_async_start(inst), is_async_done(inst)
        if start:
            self._async_start(i, inst, is_overlapped_start(inst), estimator, limits)
        elif done:
            self._async_done(i, inst, is_overlapped_done(inst))
        else:
            self.cost[i] = float(estimator.node_cost(inst))
        self._flags(i, inst, start or done)

    def _classify_node(self, i: int, node: Node, estimator: LatencyEstimator, limits: dict[str, int]) -> None:
        """`_classify` from a graph node (its cost is `stream_cost`; `kind` is set on every async start
        and every overlapped done)."""
        inst = node.inst
        start = node.is_start or (not node.is_done and is_async_start(inst))
        done = node.is_done or (node.kind is None and is_async_done(inst))
        if start:
            self._async_start(i, inst, node.is_start, estimator, limits)
        elif done:
            self._async_done(i, inst, node.is_done)
        else:
            self.cost[i] = node.cost
        self._flags(i, inst, start or done)

    def _async_start(self, i: int, inst: Instruction, overlapped: bool, estimator: LatencyEstimator,
                     limits: dict[str, int]) -> None:
        done_inst = done_of(inst)
        latency = self.latency[inst] = float(estimator.latency(inst, done_inst)) if done_inst is not None else 0.0
        kind = self.kind[inst] = self.async_kind[i] = async_kind(inst)
        self.limit[kind] = stream_slots(limits.get(kind, limits.get("default", 1)))
        if overlapped:
            self.hoistable[i] = not inst.control_successors
        else:
            self.synced.add(inst)
            self.cost[i] = latency  # `stream_cost`: it blocks the stream for its collective

    def _async_done(self, i: int, inst: Instruction, overlapped: bool) -> None:
        self.async_kind[i] = async_kind(inst)
        if overlapped:
            start_inst = matching_start(inst)
            if start_inst is not None:
                self.start_of[inst] = start_inst

    def _flags(self, i: int, inst: Instruction, is_async: bool) -> None:
        effect = self.effect[i] = inst.has_side_effect
        self.movable[i] = not (is_async or effect or inst.opcode in COLLECTIVES or inst is self.comp.root)

    def _number(self) -> None:
        """The per-slot lists that refer to other slots."""
        slot = self.slot
        self.ops = [_slots(slot, inst.operands) for inst in self.insts]
        self.deps = [_slots(slot, (*inst.operands, *controls)) if (controls := inst.control_predecessors)
                      else ops for inst, ops in zip(self.insts, self.ops, strict=True)]
        self.anchors: dict[int, tuple[int, ...]] = {}  # hoistable start -> what it must follow (its slots)
        for i, inst in enumerate(self.insts):
            if self.hoistable[i]:
                self.anchors[i] = tuple(slot[a] for a in (*inst.operands, *inst.control_predecessors,
                                                           *self.extra_preds.get(inst, ())))
        for inst, start in self.start_of.items():
            if start in slot:
                i = slot[inst]
                self.role[i], self.start[i] = _OVERLAPPED_DONE, slot[start]
        for inst in self.latency:
            i = slot[inst]
            self.role[i] = _SYNCED_START if inst in self.synced else _OVERLAPPED_START
            self.lat[i], self.slot_kind[i] = self.latency[inst], self.kind[inst]
        role, start = self.role, self.start
        # what `_hoist_starts` visits (async ops, side effects) and `_hoist_dones` moves
        self.marks = [i for i, (kind, effect) in enumerate(zip(self.async_kind, self.effect, strict=True))
                       if kind is not None or effect]
        self.hoistable_dones = [i for i, r in enumerate(role)
                                 if r == _OVERLAPPED_DONE and role[start[i]] == _OVERLAPPED_START]

    def slots_of(self, order: list[Instruction]) -> Slots:
        """`order` as slot numbers."""
        slot = self.slot
        return [slot[inst] for inst in order]

    def insts_of(self, order: Slots) -> list[Instruction]:
        """Slot numbers back to instructions."""
        insts = self.insts
        return [insts[i] for i in order]

    def times(self, order: Slots) -> Run:
        """(makespan, finish, stream free before, collective end) per slot, executing `order`."""
        from hlopt.cost_model.streams import claim_slot

        n = len(self.cost)
        finish, before, comm = [0.0] * n, [0.0] * n, [0.0] * n
        ops, cost, role, start, lat, kind, limit = (self.ops, self.cost, self.role, self.start, self.lat,
                                                    self.slot_kind, self.limit)
        in_flight: dict[str, list[float]] = {}
        sync_slot = sync_start_holds_slot()
        t = 0.0
        for i in order:
            now = t
            for o in ops[i]:
                if finish[o] > now:
                    now = finish[o]
            before[i] = t
            r = role[i]
            if r == _PLAIN:
                t = now + cost[i]
            elif r == _OVERLAPPED_DONE:
                end = comm[start[i]]
                t = end if end > now else now
            else:
                begin = claim_slot(in_flight, kind[i], now, lat[i], limit[kind[i]]) \
                    if r == _OVERLAPPED_START or sync_slot else now
                comm[i] = begin + lat[i]
                t = comm[i] if r == _SYNCED_START else now
            finish[i] = t
        return Run(t, finish, before, comm)

    def run(self, order: list[Instruction]) -> TimelineRun:
        """Times of every instruction executing `order` (as `simulate` computes them)."""
        makespan, finish, before, comm = self.times(self.slots_of(order))
        return TimelineRun(makespan, _Times(self.slot, finish), _Times(self.slot, before), _Times(self.slot, comm))

    def makespan(self, order: list[Instruction]) -> float:
        """The simulated makespan of `order` (equal to `simulate(...).makespan_us`)."""
        return self.times(self.slots_of(order))[0]

    @property
    def bytes(self) -> list[int]:
        """`buffer_bytes` per slot."""
        if self._bytes is None:
            self._bytes = [buffer_bytes(inst) for inst in self.insts]
        return self._bytes

    def _last_uses(self, order: Slots) -> dict[int, int]:
        """Per slot read in `order` (and the root), the position of its last reader (the root: len(order))."""
        last_use: dict[int, int] = {}
        ops = self.ops
        for p, i in enumerate(order):
            for o in ops[i]:
                last_use[o] = p  # positions only grow
        root = self.slot.get(self.comp.root) if self.comp.root is not None else None
        if root is not None:
            last_use[root] = len(order)
        return last_use

    def peak_memory(self, order: Slots) -> int:
        """`simulator.peak_memory` of `order`."""
        size_of = self.bytes
        last_use = self._last_uses(order)
        frees: dict[int, int] = {}
        live = peak = 0
        for p, i in enumerate(order):
            size = size_of[i]
            if size and i in last_use:
                live += size
                end = last_use[i]
                frees[end] = frees.get(end, 0) + size
            if live > peak:
                peak = live
            live -= frees.pop(p, 0)
        return peak

    def live_profile(self, order: Slots) -> np.ndarray:
        """Live bytes at each position of `order`, as `simulator.peak_memory` counts them."""
        size_of = self.bytes
        last_use = self._last_uses(order)
        delta = np.zeros(len(order) + 2, dtype=np.int64)
        for p, i in enumerate(order):
            size = size_of[i]
            if size and i in last_use:
                delta[p] += size
                delta[last_use[i] + 1] -= size
        return np.cumsum(delta)[: len(order)]


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


def _positions(order: Slots, n: int) -> list[int]:
    """Position of each slot in `order` (-1 for slots not in it)."""
    pos = [-1] * n
    for p, i in enumerate(order):
        pos[i] = p
    return pos


def _closure(inst: int, timeline: Timeline, pos: list[int], window: int, moved: set[int],
             limit: int = 8) -> list[int] | None:
    """`inst` with the operands it needs that sit at or after position `window` and are not hoisted
    already (at most `limit`, all movable), in their order; None if it cannot move."""
    deps, movable = timeline.deps, timeline.movable
    need, stack = {inst}, [inst]
    while stack:
        x = stack.pop()
        for op in deps[x]:
            if op in need or op in moved or pos[op] < window:
                continue
            if not movable[op] or len(need) >= limit:
                return None
            need.add(op)
            stack.append(op)
    return sorted(need, key=pos.__getitem__)


@dataclass
class _Round:
    """One window round: the hoists found against one run of the current order."""

    order: Slots
    finish_of: list[float]  # the run's finish per slot
    profile: np.ndarray | None
    budget: int
    bytes_of: list[int] | None  # buffer bytes per slot (None: memory not counted)
    pos: list[int] = field(default_factory=list)
    moved: set[int] = field(default_factory=set)
    early: dict[int, float] = field(default_factory=dict)  # hoisted -> its finish in the window
    inserts: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pos = _positions(self.order, len(self.finish_of))

    def finish(self, inst: int) -> float:
        return self.early.get(inst, self.finish_of[inst])

    def fits_memory(self, block: list[int], window: int) -> bool:
        """Conservatively: each hoisted result is live from the window to its old position."""
        if self.profile is None:
            return True
        extra = np.zeros(len(self.order), dtype=np.int64)
        for inst in block:
            extra[max(window - 1, 0): self.pos[inst]] += self.bytes_of[inst]
        if int((self.profile + extra).max()) > self.budget:
            return False
        self.profile = self.profile + extra
        return True


def _block_times(block: list[int], t: float, ops: list[tuple[int, ...]], cost: list[float],
                 early: dict[int, float], finish: list[float]) -> dict[int, float]:
    """Finish times of `block` run one after another from `t` (each once its operands are ready: in the
    block, hoisted already (`early`), else as run (`finish`)); the `max`es written out as loops."""
    times: dict[int, float] = {}
    now = t
    for m in block:
        ready, first = 0.0, True
        for op in ops[m]:
            v = times[op] if op in times else early.get(op, finish[op])
            if first or v > ready:
                ready, first = v, False
        now = times[m] = (ready if ready > now else now) + cost[m]
    return times


def _fill_window(rnd: _Round, timeline: Timeline, d: int, end: float, t: float, max_candidates: int) -> list[int]:
    """Hoist into the window before the done at position `d` (its collective ends at `end`, the stream
    is free at `t`) what fits in it; tries at most `max_candidates` compute ops after it. Returns the
    slots hoisted."""
    order, moved, movable, cost, ops = rnd.order, rnd.moved, timeline.movable, timeline.cost, timeline.ops
    hoisted: list[int] = []
    tried = 0
    for k in range(d + 1, len(order)):
        inst = order[k]
        if end - t <= _EPS or tried >= max_candidates:
            break
        if inst in moved or not movable[inst] or cost[inst] <= 0:
            continue
        tried += 1
        block = _closure(inst, timeline, rnd.pos, d, moved)
        if block is None:
            continue
        times = _block_times(block, t, ops, cost, rnd.early, rnd.finish_of)
        now = times[block[-1]]
        if now > end + _EPS or not rnd.fits_memory(block, d):
            continue
        hoisted.extend(block)
        moved.update(block)
        rnd.early.update(times)
        t = now
    return hoisted


def _window_round(order: Slots, run: Run, timeline: Timeline, memory_budget: int,
                  max_candidates: int) -> Slots | None:
    """One window round over `order` (`run`: its times): the new order, or None if nothing was hoisted."""
    _, finish, before, comm = run
    profile = timeline.live_profile(order) if memory_budget else None
    rnd = _Round(order, finish, profile, memory_budget, timeline.bytes if memory_budget else None)
    role, start = timeline.role, timeline.start
    for d, done in enumerate(order):
        if role[done] != _OVERLAPPED_DONE:
            continue
        end = comm[start[done]]
        if end > before[done] + _EPS:
            hoisted = _fill_window(rnd, timeline, d, end, before[done], max_candidates)
            if hoisted:
                rnd.inserts[done] = hoisted
    if not rnd.inserts:
        return None
    new: Slots = []
    moved, inserts = rnd.moved, rnd.inserts
    for inst in order:
        if inst in inserts:
            new.extend(inserts[inst])
        if inst not in moved:
            new.append(inst)
    return new


def _exact_move(order: Slots, best: float, timeline: Timeline, memory_budget: int, max_candidates: int,
                trials: list[int]) -> tuple[Slots, float] | None:
    """The first single hoist (any size) that makes the makespan strictly shorter, within memory; at
    most `trials[0]` simulations (decremented in place)."""
    pos = _positions(order, len(timeline.insts))
    role, movable, cost = timeline.role, timeline.movable, timeline.cost
    for d, done in enumerate(order):
        if role[done] != _OVERLAPPED_DONE:
            continue
        tried = 0
        for inst in islice(order, d + 1, None):
            if not movable[inst] or cost[inst] <= 0:
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
            t = timeline.times(trial)[0]
            if t < best - _EPS and (not memory_budget or timeline.peak_memory(trial) <= memory_budget):
                return trial, t
            if tried >= max_candidates:
                break
    return None


def hoist_starts(order: list[Instruction], timeline: Timeline) -> list[Instruction]:
    """`order` with every overlapped async start moved up as far as its operands, its control
    predecessors, the readers of the loop-carried buffer it overwrites (`graph.loop_carried_edges`), the
    previous async op of its kind and the previous other side-effecting instruction allow (module
    docstring, step 3); the relative order of everything else is unchanged."""
    _check_complete(order, timeline)
    return timeline.insts_of(_hoist_starts(timeline.slots_of(order), timeline))


def _check_complete(order: list[Instruction], timeline: Timeline) -> None:
    """Raise unless `order` has as many instructions as the timeline's computation (the hoists move
    instructions by their positions in a complete order)."""
    if len(order) != len(timeline.insts):
        raise ValueError(f"order has {len(order)} instructions, its computation {len(timeline.insts)}")


def _hoist_starts(order: Slots, timeline: Timeline) -> Slots:
    """`hoist_starts` on slots (`order` itself if nothing moves). Only the async ops and side-effecting
    instructions (`Timeline._marks`) are visited, in their order."""
    pos = _positions(order, len(timeline.insts))
    hoistable, anchors_of, kind_of = timeline.hoistable, timeline.anchors, timeline.async_kind
    last_of_kind: dict[str, int] = {}
    last_effect = -1
    after: dict[int, list[int]] = {}  # anchor slot (-1: none, the top) -> starts placed right after it
    hoisted: set[int] = set()
    for p in sorted([pos[i] for i in timeline.marks]):
        inst = order[p]
        kind = kind_of[inst]
        if hoistable[inst]:
            anchor, anchor_pos = -1, -1
            for a in (*anchors_of[inst], last_of_kind.get(kind, -1), last_effect):
                if a >= 0 and pos[a] > anchor_pos:
                    anchor, anchor_pos = a, pos[a]
            if anchor < 0 or anchor_pos < p - 1:  # nothing to follow: to the top
                after.setdefault(anchor, []).append(inst)
                hoisted.add(inst)
        if kind is not None:
            last_of_kind[kind] = inst
        else:  # a side effect
            last_effect = inst
    if not hoisted:
        return order
    inserts = {0 if a < 0 else pos[a] + 1: _chained(a, after) for a in after if a not in hoisted}
    return _spliced(order, inserts, {pos[i] for i in hoisted})


def _chained(anchor: int, after: dict[int, list[int]]) -> list[int]:
    """What goes right after `anchor`: each start anchored to it, then (depth first) those anchored to that."""
    out: list[int] = []
    stack = list(reversed(after[anchor]))
    while stack:
        x = stack.pop()
        out.append(x)
        if x in after:
            stack.extend(reversed(after[x]))
    return out


def _spliced(order: Slots, inserts: dict[int, list[int]], removed: set[int]) -> Slots:
    """`order` with `inserts[p]` placed before position p and the positions in `removed` left out
    (copied in slices)."""
    new: Slots = []
    prev = 0
    for cut in sorted(inserts.keys() | removed):
        new += order[prev:cut]
        if cut in inserts:
            new += inserts[cut]
        prev = cut + 1 if cut in removed else cut
    new += order[prev:]
    return new


def hoist_dones(order: list[Instruction], timeline: Timeline, run: TimelineRun) -> list[Instruction]:
    """`order` with every overlapped async done moved up to the first position after its operands and
    control predecessors where, in `run`, the stream reaches it after its collective ended (module
    docstring, step 3)."""
    _check_complete(order, timeline)
    slots = timeline.slots_of(order)
    return timeline.insts_of(_hoist_dones(slots, timeline, run.stream_before.values, run.comm_end.values))


def _hoist_dones(order: Slots, timeline: Timeline, stream_before: list[float], comm_end: list[float]) -> Slots:
    """`hoist_dones` on slots, with a run's stream-free and collective-end times per slot (`order`
    itself if nothing moves)."""
    pos = _positions(order, len(timeline.insts))
    before = [stream_before[i] for i in order]
    start_of, deps = timeline.start, timeline.deps
    targets: dict[int, list[int]] = {}
    for i in sorted([pos[d] for d in timeline.hoistable_dones]):
        done = order[i]
        floor = 0
        for a in deps[done]:
            if pos[a] >= floor:
                floor = pos[a] + 1
        p = max(bisect_left(before, comm_end[start_of[done]] - _EPS, floor, i), floor)
        if p < i and before[p] < before[i] - _EPS:  # only past work, not across zero-time ops
            targets.setdefault(p, []).append(done)
    if not targets:
        return order
    return _spliced(order, targets, {pos[d] for ds in targets.values() for d in ds})


def _hoisted_async(order: Slots, run: Run, timeline: Timeline, memory_budget: int, max_rounds: int = 16,
                   patience: int = 4) -> tuple[Slots, Run]:
    """(order, its run) after rounds of `hoist_dones` + `hoist_starts` from `order` and its `run` (each
    round can enable the next: an earlier collective lets its done, then the next start of its kind, move
    up) until nothing moves or `patience` rounds in a row did not shorten the makespan, within
    `memory_budget` (0 = none); never slower (the model says so; the check keeps that true)."""
    best = run.makespan
    idle = 0
    for _ in range(max_rounds):
        trial = _hoist_starts(_hoist_dones(order, timeline, run.stream_before, run.comm_end), timeline)
        if trial == order:
            break
        trial_run = timeline.times(trial)
        t = trial_run.makespan
        if t > best + _EPS or (memory_budget and timeline.peak_memory(trial) > memory_budget):
            break
        idle = idle + 1 if t >= best - _EPS else 0
        order, best, run = trial, t, trial_run
        if idle >= patience:
            break
    return order, run


def _reordered_streams(order: Slots, run: Run, timeline: Timeline, memory_budget: int) -> tuple[Slots, Run]:
    """`stream_order.move_collectives_into_gaps` and `advance_dones`, then the async hoists, if they moved
    anything."""
    from hlopt.scheduler.stream_order import advance_dones, move_collectives_into_gaps

    moved, moved_run = move_collectives_into_gaps(order, run, timeline, memory_budget)
    moved, moved_run = advance_dones(moved, moved_run, timeline, memory_budget)
    if moved is order:
        return order, run
    return _hoisted_async(moved, moved_run, timeline, memory_budget)


def _filled_once(slots: Slots, run: Run, timeline: Timeline, budget: int, max_rounds: int, max_candidates: int,
                 exact_limit: int, exact_steps: int) -> tuple[Slots, Run]:
    """One pass of the fill: async hoists, window rounds, exact moves, async hoists (module docstring)."""
    slots, run = _hoisted_async(slots, run, timeline, budget)
    for _ in range(max_rounds):  # each round's run is the next one's (or the exact moves')
        trial = _window_round(slots, run, timeline, budget, max_candidates)
        if trial is None:
            break
        trial_run = timeline.times(trial)
        if trial_run.makespan >= run.makespan - _EPS or (budget and timeline.peak_memory(trial) > budget):
            break
        slots, run = trial, trial_run
    if len(slots) <= exact_limit:
        best, moved = run.makespan, False
        trials = [max(exact_steps // max(len(slots), 1), 1)]
        for _ in range(max_rounds):
            found = _exact_move(slots, best, timeline, budget, max_candidates, trials)
            if found is None:
                break
            (slots, best), moved = found, True
        if moved:
            run = timeline.times(slots)
    return _hoisted_async(slots, run, timeline, budget)


def fill_exposed_windows(comp: Computation, estimator: LatencyEstimator, order: list[Instruction],
                         limits: dict[str, int], max_rounds: int = 64, max_candidates: int = 64,
                         memory_limit: int = 0, exact_limit: int = 2000,
                         exact_steps: int = EXACT_STEPS, graph: ScheduleGraph | None = None) -> list[Instruction]:
    """`order` with compute hoisted into exposed windows (module docstring); never slower than `order`
    under `simulate`, and with `memory_limit` (bytes, 0 = none) never above max(memory_limit, the
    peak memory of `order`). `graph`: the computation's `ScheduleGraph`, if built (`Timeline`)."""
    order = list(order)
    if not any(is_overlapped_done(i) for i in order):
        return order  # no window to fill
    if len(order) > LARGE_COMPUTATION:
        max_candidates = min(max_candidates, LARGE_CANDIDATES)
    timeline = Timeline(comp, estimator, limits, graph)
    slots = timeline.slots_of(order)
    budget = max(memory_limit, timeline.peak_memory(slots)) if memory_limit else 0
    run = timeline.times(slots)
    reorder = len(slots) <= STREAM_REORDER_LIMIT
    for _ in range(STREAM_ROUNDS if reorder else 1):  # a collective moved into a stream gap can open windows
        before = run.makespan
        slots, run = _filled_once(slots, run, timeline, budget, max_rounds, max_candidates, exact_limit, exact_steps)
        if reorder:
            slots, run = _reordered_streams(slots, run, timeline, budget)
        if run.makespan >= before - _EPS:
            break
    return timeline.insts_of(_sunk_dones(slots, run, timeline, budget))


def _sunk_dones(order: Slots, run: Run, timeline: Timeline, memory_budget: int) -> Slots:
    """`sink_dones` on slots, kept where it simulates no slower within `memory_budget` (0 = none)."""
    sunk = _sink_dones(order, timeline)
    if sunk == order or timeline.times(sunk).makespan > run.makespan + _EPS:
        return order
    if memory_budget and timeline.peak_memory(sunk) > memory_budget:
        return order
    return sunk


def sink_dones(order: list[Instruction], timeline: Timeline) -> list[Instruction]:
    """`order` with every overlapped async done moved down to just before the first of its users, its
    control successors and the next async op of its kind (module docstring, step 4): where XLA's
    scheduler puts a done (kScheduleDone, bottom-up). The windows the hoists shrank to the estimated
    latency grow back, so a collective that runs longer than estimated stays hidden; nothing runs later
    in the model (a done takes no stream time and only waits), and each kind's order is kept."""
    _check_complete(order, timeline)
    return timeline.insts_of(_sink_dones(timeline.slots_of(order), timeline))


def _sink_dones(order: Slots, timeline: Timeline) -> Slots:
    """`sink_dones` on slots (`order` itself if nothing moves); the last done first, so that a done
    bounded by a later one of its kind follows it down."""
    dones = set(timeline.hoistable_dones)
    if not dones:
        return order
    users: dict[int, list[int]] = {}
    for i, deps in enumerate(timeline.deps):
        for d in deps:
            if d in dones:
                users.setdefault(d, []).append(i)
    kind_of = timeline.async_kind
    new = list(order)
    for d in sorted(dones, key=new.index, reverse=True):
        p = new.index(d)
        bound = {*users.get(d, ())}
        stop = len(new)
        for q in range(p + 1, len(new)):
            x = new[q]
            if x in bound or (kind_of[x] is not None and kind_of[x] == kind_of[d]):
                stop = q
                break
        if stop > p + 1:
            new.insert(stop, d)
            del new[p]
    return order if new == order else new
