"""When collective-pipeliner's moves pay, by hlopt's cost model (the pass's `cost_model` option).

One iteration of the loop body is list-scheduled on one compute stream and one collective stream (the machine
of hlopt's scheduler, with hlopt's per-instruction times): compute ops run one at a time, the ready one with
what a collective of the iteration waits for first, then the longest path to the end of the iteration
(critical path), as a latency-hiding scheduler starts collectives early; a collective starts as soon as its operands are ready and the collective stream is
free; its users wait for it. The loop's time is compared in three forms:

- as it is: `N * T0`;
- pipelined backward (a moved collective's value is carried in: ready at the start of the iteration; the next
  iteration's copy still occupies the collective stream when its operands are ready): the first copies run
  exposed before the loop, then `N-1` pipelined iterations `T1`, then the peeled last iteration `Tq` (carried
  values, no next copy);
- pipelined forward (a moved collective reduces the previous iteration's value: its operand is ready at the
  start; its own operand is only stored): the peeled first iteration `Tq` (no collective), `N-1` pipelined
  iterations `T1`, then the last copies exposed after the loop.

Moves are added greedily, largest collective first, while each lowers the modelled loop time; a loop whose
collectives are already hidden in their iteration keeps them.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from hlopt.hlo.ir import Computation, Instruction

if TYPE_CHECKING:
    from hlopt.passes.collective_pipeliner import LoopInfo

__all__ = ["iteration_time_us", "loop_time_us", "profitable_collectives"]

_FREE = frozenset({"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "opt-barrier",
                   "after-all", "add-dependency"})
_COLLECTIVE = frozenset({"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                         "collective-broadcast", "ragged-all-to-all"})


class _Times:
    """Per-instruction times of one cost model, cached."""

    def __init__(self, device: str):
        from hlopt.cost_model import get_cost_model

        self.model = get_cost_model(device)
        self.cache: dict[Instruction, float] = {}

    def __call__(self, inst: Instruction) -> float:
        if inst not in self.cache:
            self.cache[inst] = 0.0 if inst.opcode in _FREE else float(self.model.node_time_us(inst))
        return self.cache[inst]


def iteration_time_us(body: Computation, times: _Times, moved: set[Instruction], forward: bool,
                      quiet: bool = False) -> float:
    """One iteration of `body` on one compute and one collective stream (module docstring). `moved` are the
    pipelined collectives: carried in (backward) or fed from the previous iteration (forward); with `quiet`
    they take no stream time (the peeled iteration)."""
    order = body.post_order()
    position = {x: n for n, x in enumerate(order)}
    users: dict[Instruction, list[Instruction]] = {x: [] for x in order}
    waiting: dict[Instruction, int] = {}
    for x in order:
        ops = {o for o in x.operands if o in users}
        if forward and x in moved:
            ops = set()  # reduces the previous iteration's value: ready at the start
        waiting[x] = len(ops)
        for o in ops:
            users[o].append(x)
    tail: dict[Instruction, float] = {}  # longest path to the end of the iteration (the list priority)
    for x in reversed(order):
        stays = not (x in moved and (quiet or not forward))
        tail[x] = (times(x) if stays else 0.0) + max((tail[u] for u in users[x]), default=0.0)
    feeds: set[Instruction] = set()  # operands (transitively) of collectives that run in this iteration
    for x in reversed(order):
        if (x.opcode in _COLLECTIVE and not (x in moved and (quiet or forward))) or any(u in feeds for u in users[x]):
            feeds.add(x)
    done: dict[Instruction, float] = {}
    pending: list[tuple[float, int, Instruction]] = []  # compute ops by the time their operands are ready
    available: list[tuple[bool, float, int, Instruction]] = []  # compute ops ready by the compute clock
    clock = 0.0  # when the compute stream is free
    stream_free = 0.0  # when the collective stream is free
    end = 0.0
    work: list[Instruction] = [x for x in order if waiting[x] == 0]

    def ready_time(x: Instruction) -> float:
        if forward and x in moved:
            return 0.0
        return max((done[o] for o in x.operands if o in done), default=0.0)

    def finish(x: Instruction, t: float) -> None:
        done[x] = t
        for u in users[x]:
            waiting[u] -= 1
            if waiting[u] == 0:
                work.append(u)

    while work or pending or available:
        while work:
            x = work.pop()
            r = ready_time(x)
            if x.opcode in _COLLECTIVE:
                if x in moved and quiet:
                    finish(x, 0.0)
                    continue
                start = max(r, stream_free)
                stream_free = start + times(x)
                end = max(end, stream_free)
                finish(x, 0.0 if (x in moved and not forward) else stream_free)
            elif times(x) == 0.0:
                finish(x, r)
            else:
                heapq.heappush(pending, (r, position[x], x))
        if not available and pending:
            clock = max(clock, pending[0][0])
        while pending and pending[0][0] <= clock:
            _, pos, x = heapq.heappop(pending)
            heapq.heappush(available, (x not in feeds, -tail[x], pos, x))
        if not available:
            continue
        x = heapq.heappop(available)[-1]
        clock += times(x)
        end = max(end, clock)
        finish(x, clock)
    return max(end, stream_free)


def loop_time_us(info: LoopInfo, times: _Times, moved: set[Instruction], forward: bool) -> float:
    """The modelled time of the whole loop with `moved` pipelined (module docstring)."""
    n = info.range.trip_count
    if not moved:
        return n * iteration_time_us(info.body, times, set(), forward)
    pipelined = iteration_time_us(info.body, times, moved, forward)
    peeled = iteration_time_us(info.body, times, moved, forward, quiet=True)
    exposed = sum(times(c) for c in moved)
    return exposed + (n - 1) * pipelined + peeled


def profitable_collectives(info: LoopInfo, candidates: list[Instruction], device: str,
                           forward: bool) -> set[Instruction]:
    """The candidates worth pipelining: added greedily, largest first, while each lowers the loop time."""
    times = _Times(device)
    chosen: set[Instruction] = set()
    best = loop_time_us(info, times, chosen, forward)
    for c in sorted(candidates, key=lambda x: (-times(x), x.name)):
        trial = loop_time_us(info, times, chosen | {c}, forward)
        if trial < best - 1e-9:
            chosen.add(c)
            best = trial
    return chosen
