"""Re-ordering the collectives of one shared async stream: move a later collective into an earlier idle gap.

On XLA:GPU every async collective runs on the one collective stream (`async_ops`, "xla-gpu"), one after
another, and the scheduler lets `overlap_limit` (default 1) be in flight. A list schedule fixes the order
of the collectives on that stream; the window fill (`fill.py`) keeps that order. When the stream sits idle
while compute runs (a gap between one collective's done and the next one's start) and a collective later
in the order has its operands ready before the gap, the stream could have run it there: the later
collective's start then moves into the gap (after its operands, its control predecessors and the last
side-effecting instruction before it) and its done to the end of the gap (just before the next start of
its stream), where `fill._hoisted_async` later moves the done up to where the collective has ended.

`advance_dones` treats the other way a limit-1 stream idles: a done placed after compute that ends past its
collective's end holds back the next start of the stream (it may only follow the done); moving the done up
before that compute makes the compute stream wait instead, which pays where the stream is the bottleneck.

Each move is simulated (`Timeline`) and kept only where it makes the makespan strictly shorter within the
memory budget, so the pass never makes an order slower. Not an XLA rule: XLA's bottom-up list schedule
packs the collectives of a limit-1 stream toward the end of their windows and never revisits the order.
"""

from __future__ import annotations

from bisect import bisect_left

from hlopt.scheduler.fill import _OVERLAPPED_DONE, _OVERLAPPED_START, Run, Slots, Timeline, _positions

__all__ = ["move_collectives_into_gaps", "advance_dones"]

_EPS = 1e-9


def _pairs_by_stream(order: Slots, timeline: Timeline) -> dict[str, list[tuple[int, int]]]:
    """Per stream, its overlapped (start, done) slot pairs in program order of their starts."""
    pos = _positions(order, len(timeline.insts))
    out: dict[str, list[tuple[int, int]]] = {}
    for d, role in enumerate(timeline.role):
        if role != _OVERLAPPED_DONE:
            continue
        s = timeline.start[d]
        if s < 0 or timeline.role[s] != _OVERLAPPED_START or not timeline.hoistable[s] or pos[s] < 0 or pos[d] < 0:
            continue
        out.setdefault(timeline.slot_kind[s], []).append((s, d))
    for pairs in out.values():
        pairs.sort(key=lambda sd: pos[sd[0]])
    return out


def _earliest(s: int, d: int, order: Slots, pos: list[int], timeline: Timeline) -> int:
    """The first position the start `s` may take: after its anchors (operands, control predecessors,
    loop-carried readers), the control predecessors of its done, and the last side-effecting instruction
    before it that is not an async op (as `fill.hoist_starts`)."""
    floor = 0
    for a in (*timeline.anchors.get(s, ()), *timeline.deps[d]):
        if a != s and pos[a] + 1 > floor:
            floor = pos[a] + 1
    for p in range(pos[s] - 1, floor - 1, -1):
        x = order[p]
        if timeline.effect[x] and timeline.async_kind[x] is None:  # async ops are the pairs themselves
            return p + 1
    return floor


def _moved(order: Slots, s: int, d: int, at: int, done_at: int) -> Slots:
    """`order` with `s` placed before position `at` and `d` before position `done_at` (both earlier than
    their current positions)."""
    out: Slots = []
    for p, x in enumerate(order):
        if p == at:
            out.append(s)
        if p == done_at:
            out.append(d)
        if x != s and x != d:
            out.append(x)
    return out


def _candidate_gaps(pairs: list[tuple[int, int]], index: int, pos: list[int], floor: int) -> list[tuple[int, int]]:
    """(start position, done position) for each gap of the stream before pair `index` that ends after
    `floor`: the positions between one pair's done and the next pair's start."""
    gaps = []
    previous_done = -1
    for s_other, d_other in pairs[:index]:
        lo, hi = previous_done + 1, pos[s_other]
        if hi > max(lo, floor):
            gaps.append((max(lo, floor), hi))
        previous_done = pos[d_other]
    return gaps


#: Simulated instruction steps the pass may spend (trials x instructions), so that large computations
#: try fewer moves.
STEP_BUDGET = 2_000_000


def move_collectives_into_gaps(order: Slots, run: Run, timeline: Timeline, memory_budget: int = 0,
                               max_trials: int = 400) -> tuple[Slots, Run]:
    """(order, its run) after moving later collectives into earlier idle gaps of their stream (module
    docstring), each move kept only where the simulated makespan drops and, with `memory_budget` (bytes,
    0 = none), the peak stays within it; at most `max_trials` simulations (fewer above
    STEP_BUDGET / max_trials instructions)."""
    max_trials = min(max_trials, max(STEP_BUDGET // max(len(order), 1), 1))
    trials = 0
    improved = True
    while improved and trials < max_trials:
        improved = False
        pos = _positions(order, len(timeline.insts))
        for pairs in _pairs_by_stream(order, timeline).values():
            for index in range(1, len(pairs)):
                s, d = pairs[index]
                floor = _earliest(s, d, order, pos, timeline)
                for at, done_at in _candidate_gaps(pairs, index, pos, floor):
                    if trials >= max_trials:
                        return order, run
                    trials += 1
                    trial = _moved(order, s, d, at, done_at)
                    trial_run = timeline.times(trial)
                    if trial_run.makespan < run.makespan - _EPS and \
                            (not memory_budget or timeline.peak_memory(trial) <= memory_budget):
                        order, run, improved = trial, trial_run, True
                        break
                if improved:
                    break
            if improved:
                break
    return order, run


def advance_dones(order: Slots, run: Run, timeline: Timeline, memory_budget: int = 0) -> tuple[Slots, Run]:
    """(order, its run) with overlapped dones moved up before the compute that ends past their collective's
    end (module docstring), in program order, each move kept only where the simulated makespan drops or
    stays while the collectives end earlier (`_better`), and the peak stays within `memory_budget` (0 =
    none); at most STEP_BUDGET simulated steps."""
    trials = max(STEP_BUDGET // max(len(order), 1), 1)
    dones = list(timeline.hoistable_dones)
    starts = [timeline.start[d] for d in dones]
    pos = _positions(order, len(timeline.insts))
    for d in sorted(dones, key=lambda x: pos[x]):
        if trials <= 0:
            break
        pos = _positions(order, len(timeline.insts))
        p = pos[d]
        end = run.comm_end[timeline.start[d]]
        before = run.stream_before
        if before[d] <= end + _EPS:
            continue  # the done waits for its collective: nothing held back
        floor = max((pos[a] + 1 for a in timeline.deps[d]), default=0)
        times = [before[order[q]] for q in range(floor, p)]
        q = floor + bisect_left(times, end - _EPS)  # the first point at or after the collective's end
        target = q - 1 if q > floor and q == p else q
        if target >= p or target < floor:
            continue
        trials -= 1
        trial = order[:target] + [d] + [x for x in order[target:] if x != d]
        trial_run = timeline.times(trial)
        if _better(trial_run, run, starts) and (not memory_budget or timeline.peak_memory(trial) <= memory_budget):
            order, run = trial, trial_run
    return order, run


def _better(trial: Run, run: Run, starts: list[int]) -> bool:
    """A shorter makespan, or the same one with the collectives ending earlier in sum (the stream freed
    sooner: a step that later moves can turn into a shorter makespan)."""
    if trial.makespan < run.makespan - _EPS:
        return True
    if trial.makespan > run.makespan + _EPS:
        return False
    return sum(trial.comm_end[s] for s in starts) < sum(run.comm_end[s] for s in starts) - _EPS
