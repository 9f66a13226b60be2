"""When collective-pipeliner's moves pay, by hlopt's cost model (the pass's `cost_model` option).

One iteration of the loop body is list-scheduled on one compute stream and one collective stream (the machine
of hlopt's scheduler, `cost_model.streams.StreamMachine`, which its simulator runs on too, with the times of
`cost_model.estimator.AnalyticalLatencyEstimator`, the scheduler's): compute ops run one at a time, the ready one with
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

XLA:GPU combines independent collectives of one kind in an iteration into one (its all-gather, reduce-scatter and
all-reduce combiners run before its scheduler), so a group of them releases its users only when the last of the
group is done: the weights a layer all-gathers separately arrive together, and the first matmul waits for all of
them (`_combined_groups`). Without that, separate all-gathers would look hidden behind each other's matmuls,
which the combined all-gather XLA:GPU really runs is not.

Moves are added greedily, largest collective first, while each lowers the modelled loop time; a loop whose
collectives are already hidden in their iteration keeps them.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from hlopt.cost_model.estimator import FREE_OPCODES, AnalyticalLatencyEstimator, LatencyEstimator
from hlopt.cost_model.streams import StreamMachine
from hlopt.hlo.ir import Computation, Instruction
from hlopt.hlo.opcodes import SYNC_COLLECTIVES

if TYPE_CHECKING:
    from hlopt.passes.collectives.collective_pipeliner import LoopInfo

__all__ = ["iteration_time_us", "loop_time_us", "profitable_collectives"]

_COLLECTIVE = SYNC_COLLECTIVES


class _Times:
    """Per-instruction times of one estimator (the scheduler's `LatencyEstimator`; by default the analytical
    model of a device), ops that launch nothing free: a collective (synchronous before XLA makes it async)
    takes its `node_cost` on the collective stream, any other op its `node_cost` on the compute stream."""

    def __init__(self, device: str | LatencyEstimator):
        self.estimator = AnalyticalLatencyEstimator(device) if isinstance(device, str) else device

    def __call__(self, inst: Instruction) -> float:
        return 0.0 if inst.opcode in FREE_OPCODES else float(self.estimator.node_cost(inst))


def _combined_groups(order: list[Instruction]) -> dict[Instruction, int]:
    """Collective -> group id: collectives of one opcode that do not depend on each other share a group (what
    XLA:GPU's combiners would merge)."""
    ancestors: dict[Instruction, frozenset[Instruction]] = {}
    for x in order:  # post order: operands first
        below: set[Instruction] = set()
        for o in x.operands:
            if o in ancestors:
                below |= ancestors[o]
                below.add(o)
        ancestors[x] = frozenset(below)
    groups: dict[Instruction, int] = {}
    members: list[tuple[str, list[Instruction]]] = []
    for x in order:
        if x.opcode not in _COLLECTIVE:
            continue
        for gid, (kind, group) in enumerate(members):
            if kind == x.opcode and not any(g in ancestors[x] for g in group):
                group.append(x)
                groups[x] = gid
                break
        else:
            groups[x] = len(members)
            members.append((x.opcode, [x]))
    return groups


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
    groups = _combined_groups(order)
    unissued: dict[int, list[Instruction]] = {}
    for x, gid in groups.items():
        if not (x in moved and quiet):
            unissued.setdefault(gid, []).append(x)
    held: dict[int, list[tuple[Instruction, float]]] = {}  # issued members of a group waiting for the rest
    done: dict[Instruction, float] = {}
    pending: list[tuple[float, int, Instruction]] = []  # compute ops by the time their operands are ready
    available: list[tuple[bool, float, int, Instruction]] = []  # compute ops ready by the compute clock
    machine = StreamMachine()  # the compute stream and the collective stream (the scheduler's simulator's)
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
                ends = machine.collective(r, times(x)) + times(x)  # issued once its operands are ready
                gid = groups[x]
                held.setdefault(gid, []).append((x, 0.0 if (x in moved and not forward) else ends))
                unissued[gid].remove(x)
                if not unissued[gid]:  # the combined collective is done: every member releases its users
                    for member, t in held.pop(gid):
                        finish(member, t if t == 0.0 else ends)
            elif times(x) == 0.0:
                finish(x, r)
            else:
                heapq.heappush(pending, (r, position[x], x))
        if not available and pending:
            machine.wait(pending[0][0])
        while pending and pending[0][0] <= machine.compute_free:
            _, pos, x = heapq.heappop(pending)
            heapq.heappush(available, (x not in feeds, -tail[x], pos, x))
        if not available:
            continue
        x = heapq.heappop(available)[-1]
        finish(x, machine.compute(machine.compute_free, times(x)))
    return machine.end


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
    """The candidates worth pipelining. XLA:GPU combines a group of independent same-kind collectives into one,
    so groups move together: added greedily, largest group first, while each lowers the loop time; moving every
    candidate is tried too, and the faster of the two kept."""
    times = _Times(device)
    groups: dict[int, list[Instruction]] = {}
    for c, gid in _combined_groups(info.body.post_order()).items():
        if c in candidates:
            groups.setdefault(gid, []).append(c)
    chosen: set[Instruction] = set()
    best = loop_time_us(info, times, chosen, forward)
    for group in sorted(groups.values(), key=lambda g: (-sum(times(x) for x in g), min(x.name for x in g))):
        trial = loop_time_us(info, times, chosen | set(group), forward)
        if trial < best - 1e-9:
            chosen |= set(group)
            best = trial
    every = set(candidates)
    if chosen != every and loop_time_us(info, times, every, forward) < best - 1e-9:
        return every
    return chosen
