"""Lower bounds on the makespan `simulator.simulate` can give a computation, valid for every order.

The model (see simulator.py): one compute stream runs every instruction that is not an overlapped async
start/done, one after another (a sync collective, or a start XLA marked `is_sync`, occupies it for its
latency); every async collective of resource k holds one of k's slots for its latency: on XLA:GPU's
stream model one slot per stream (`async_ops.stream_slots`) and only overlapped collectives; per type
`limit(k)` slots, `is_sync` ones included; an instruction starts only after its operands finished (a
done after its collective ended).

- `basic_lower_bound`: the longest cost+latency path, the compute stream's total work, and each
  collective kind's total latency / its limit.
- `release_tail_bound`: single-machine bounds with release times and tails. Instruction v cannot start
  before its head h(v) (the longest cost+latency path from the sources to v) and, once it ends, at least
  its tail q(v) (the longest path after it) must still pass. Jobs sharing one stream run disjointly, so
  for any set S of them: makespan >= min h(S) + work(S) + min q(S). Applied to the compute stream (S over
  the sets {h >= a} and {q >= b} and, for a few hundred jobs, {h >= a and q >= b}) and to each collective
  kind's stream (a collective's head is its start's, its tail its done's; with `limit` L at a time, the
  kind's streams are L machines, so work(S) counts divided by L).
"""

from __future__ import annotations

from collections.abc import Iterable

from hlopt.hlo.ir import Computation, Instruction
from hlopt.scheduler.async_ops import async_kind, done_of, is_async_start, stream_slots, sync_start_holds_slot
from hlopt.scheduler.costs import LatencyEstimator, is_overlapped_done, is_overlapped_start, stream_cost

__all__ = ["basic_lower_bound", "release_tail_bound", "heads_and_tails", "single_stream_bound"]

Job = tuple[float, float, float]  # (head, tail, work)


def _limit(limits: dict[str, int] | None, kind: str) -> int:
    """How many collectives of `kind` run at once (`async_ops.stream_slots` of its overlap limit)."""
    limits = limits or {}
    return stream_slots(limits.get(kind, limits.get("default", 1)))


def _on_async_stream(start: Instruction) -> bool:
    """Whether a start's collective occupies its resource's stream (a sync-marked one does only per type)."""
    return is_overlapped_start(start) or sync_start_holds_slot()


def basic_lower_bound(comp: Computation, estimator: LatencyEstimator, limits: dict[str, int] | None = None) -> float:
    """max(critical path, total compute, per-kind serialized communication / limit)."""
    from hlopt.scheduler.graph import ScheduleGraph

    graph = ScheduleGraph(comp, estimator)
    comm: dict[str, float] = {}
    for inst in comp.instructions:
        if is_async_start(inst) and _on_async_stream(inst):
            done = done_of(inst)
            kind = async_kind(inst)
            comm[kind] = comm.get(kind, 0.0) + (estimator.latency(inst, done) if done is not None else 0.0)
    serial = max((v / _limit(limits, k) for k, v in comm.items()), default=0.0)
    return max(graph.critical_path(), graph.total_compute(), serial)


def heads_and_tails(order: list[Instruction], estimator: LatencyEstimator
                    ) -> tuple[dict[Instruction, float], dict[Instruction, float]]:
    """Per instruction, its head (longest path from the sources to its start) and tail (longest path
    from its end to the sinks), along operand edges; a start->done edge weighs the collective's latency."""
    members = set(order)
    cost = {i: stream_cost(estimator, i) for i in order}

    def edge(a: Instruction, b: Instruction) -> float:
        return estimator.latency(a, b) if is_overlapped_start(a) and is_overlapped_done(b) else 0.0

    head: dict[Instruction, float] = {}
    for inst in order:
        head[inst] = max((head[op] + cost[op] + edge(op, inst) for op in inst.operands if op in head), default=0.0)
    tail: dict[Instruction, float] = {}
    for inst in reversed(order):
        tail[inst] = max((edge(inst, u) + cost[u] + tail[u] for u in inst.users if u in members and u in tail),
                         default=0.0)
    return head, tail


def single_stream_bound(jobs: Iterable[Job], exact_limit: int = 400) -> float:
    """max over job sets S of min head(S) + work(S) + min tail(S), for jobs sharing one stream."""
    jobs = [j for j in jobs if j[2] > 0]
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
        prefix: list[Job] = []
        for h, tau, c in by_head:  # S = {head >= h and tail >= t2}
            prefix.append((h, tau, c))
            total = 0.0
            for _, t2, c2 in sorted(prefix, key=lambda j: -j[1]):
                total += c2
                best = max(best, h + total + t2)
    return best


def release_tail_bound(comp: Computation, estimator: LatencyEstimator, order: list[Instruction] | None = None,
                       limits: dict[str, int] | None = None, exact_limit: int = 400) -> float:
    """The largest single-machine bound of the compute stream and of every collective stream (module
    docstring); `simulate` reports max(this, `basic_lower_bound`) as its lower bound."""
    order = list(order or comp.instructions)
    head, tail = heads_and_tails(order, estimator)
    best = single_stream_bound(((head[i], tail[i], stream_cost(estimator, i)) for i in order), exact_limit)
    streams: dict[str, list[Job]] = {}
    for inst in order:
        done = done_of(inst) if is_async_start(inst) and _on_async_stream(inst) else None
        if done is not None and done in tail:
            kind = async_kind(inst)
            work = estimator.latency(inst, done) / _limit(limits, kind)
            streams.setdefault(kind, []).append((head[inst], tail[done], work))
    for jobs in streams.values():
        best = max(best, single_stream_bound(jobs, exact_limit))
    return best
