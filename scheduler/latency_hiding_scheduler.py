"""latency-hiding-scheduler: order each computation so that async collectives overlap compute.

Bottom-up list scheduling (XLA's LatencyHidingScheduler): the ready set holds nodes whose users are all
scheduled; a heuristic ranks them; an async done opens an overlap window that lasts until its start is
scheduled `latency` later, so compute is pulled in between. Each collective type is a resource with an
overlap limit (how many may be in flight). Memory pressure is tracked with live buffers; over the limit
the computation is rescheduled under a tighter limit.

Before (sync collective right before its use):
    %ars = all-reduce-start(%g); %ard = all-reduce-done(%ars); %c = convolution(%a, %b); ROOT add(%ard, %c)
After:
    %ars = all-reduce-start(%g); %c = convolution(%a, %b); %ard = all-reduce-done(%ars); ROOT add(%ard, %c)
The module gets `is_scheduled=true`; optionally the order is also encoded as control dependencies.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field, replace
from typing import ClassVar

from hlo.ir import Computation, Instruction, Module
from passes.base import ModulePass, non_fusion_computations
from passes.registry import register
from scheduler.costs import LatencyEstimator, estimator_for
from scheduler.graph import Node, ScheduleGraph
from scheduler.heuristics import Heuristic, SchedState, get_heuristic

__all__ = ["LatencyHidingScheduler", "schedule_computation", "ScheduleResult", "ScheduleOptions",
           "schedule_with_options", "finish_computation", "keep_faster", "fill_exposed_windows"]


@dataclass
class ScheduleResult:
    """The order found for one computation and what it cost to find."""

    order: list[Node]
    seconds: float
    reruns: int = 0
    peak_memory: int = 0
    kept_input: bool = False  # keep_faster kept the input order


def _limits(overlap_limit: int, overrides: dict[str, int]) -> dict[str, int]:
    limits = {"default": overlap_limit}
    limits.update({k: v for k, v in overrides.items() if v > 0})
    return limits


def schedule_computation(
    comp: Computation,
    estimator: LatencyEstimator,
    heuristic: Heuristic,
    limits: dict[str, int],
    memory_limit: int = 0,
    graph: ScheduleGraph | None = None,
) -> ScheduleResult:
    """A bottom-up list schedule of `comp` (returned in program order)."""
    start = time.perf_counter()
    graph = graph or ScheduleGraph(comp, estimator)
    state = SchedState(limits=limits, memory_limit=memory_limit)
    respects_limits = getattr(heuristic, "respects_limits", True)
    for n in graph.nodes:
        n.unscheduled_succs = len(n.succs)
        n.ready_time = 0.0
        n.scheduled = False
        n.unlocks = 0
    for n in graph.nodes:
        if len(n.succs) == 1:
            n.succs[0][0].unlocks += 1
    ready = [n for n in graph.nodes if n.unscheduled_succs == 0]
    root = comp.root
    for n in graph.nodes:
        if n.inst is root:
            state.live.add(n)
            state.memory += n.bytes
    for n in ready:
        if n.is_done and n.kind:
            state.ready_dones[n.kind] = state.ready_dones.get(n.kind, 0) + 1
    order: list[Node] = []
    peak = state.memory
    if _heap_applies(graph, heuristic, memory_limit):
        queue = _XlaDefaultQueue(state, ready)
        while queue:
            best = queue.pop()
            _schedule(best, state, queue, queue.unlocked)
            order.append(best)
            peak = max(peak, state.memory)
    else:
        priority = heuristic.priority
        while ready:
            full = _full_kinds(state) if respects_limits else ()
            # what `_fits` keeps: nodes of a kind with a free slot, and overlapped starts (they free one)
            candidates = ([n for n in ready if n.kind not in full or n.is_start] or ready) if full else ready
            best = max(candidates, key=lambda n: priority(n, state))
            ready.remove(best)
            _schedule(best, state, ready)
            order.append(best)
            peak = max(peak, state.memory)
    order.reverse()
    if len(order) != len(graph.nodes):
        raise RuntimeError(f"scheduler lost instructions in {comp.name}")
    return ScheduleResult(order, time.perf_counter() - start, peak_memory=peak)


def keep_faster(comp: Computation, estimator: LatencyEstimator, result: ScheduleResult, graph: ScheduleGraph,
                limits: dict[str, int]) -> ScheduleResult:
    """`result`, or the computation's input order where that simulates strictly faster (not an XLA rule:
    a guard so that re-scheduling an already scheduled module never makes it slower)."""
    from scheduler.fill import Timeline
    from scheduler.simulator import peak_memory

    timeline = Timeline(comp, estimator, limits)
    given = list(comp.instructions)
    if timeline.makespan(given) < timeline.makespan([n.inst for n in result.order]):
        kept = sorted(graph.nodes, key=lambda n: n.index)
        return ScheduleResult(kept, result.seconds, result.reruns, peak_memory(comp, given), kept_input=True)
    return result


@dataclass(frozen=True)
class ScheduleOptions:
    """What runs around the list schedule of one computation (all but the memory limit beyond XLA).

    `fill_windows`: `fill.fill_exposed_windows` after the list schedule; `keep_input_if_faster`:
    `keep_faster`; `fill_within_memory` (default; not an XLA rule): without `fill_windows`, fill the
    windows as far as the list schedule's own peak memory allows (never slower, never more memory);
    `alternatives` (default: critical-path): heuristics whose list schedules are also
    made where the computation has async ops (and at most `alternatives_limit` instructions), the fastest
    under the simulator kept (`_best_of_alternatives`:
    a portfolio of list schedules, not an XLA rule); `redecide_sync` (default): XLA's `is_sync` marks come from its post-scheduling pass
    (GpuConvertAsyncCollectivesToSync marks the pairs its schedule left adjacent), so they are cleared
    first (the pairs may overlap again) and the pairs left with nothing between start and done are
    re-marked afterwards (`sync_marks`); without it a marked pair stays two ordinary instructions, as XLA's
    GPU scheduler treats marks present before it runs."""

    memory_limit: int = 0
    max_reruns: int = 3
    fill_windows: bool = False
    keep_input_if_faster: bool = False
    redecide_sync: bool = True
    alternatives: tuple[str, ...] = ("critical-path",)
    fill_within_memory: bool = True
    alternatives_limit: int = 4000  # computations above this many instructions get the heuristic alone

    SUFFIXES: ClassVar[dict[str, dict[str, object]]] = {
        "fill": {"fill_windows": True}, "keep": {"keep_input_if_faster": True},
        "keepsync": {"redecide_sync": False}, "unsync": {"redecide_sync": True},
        "alone": {"alternatives": (), "fill_within_memory": False}}

    @classmethod
    def parse(cls, spec: str, **kw) -> tuple[str, ScheduleOptions]:
        """`NAME+fill+keep+keepsync+alone` -> (NAME, options with those settings); `+alone` is the
        heuristic's list schedule alone (no alternatives, no memory-neutral fill)."""
        base, *suffixes = spec.split("+")
        for suffix in suffixes:
            if suffix not in cls.SUFFIXES:
                raise ValueError(f"unknown heuristic option +{suffix} (known: {', '.join(cls.SUFFIXES)})")
            kw.update(cls.SUFFIXES[suffix])
        options = cls(**kw)
        return base, replace(options, alternatives=tuple(a for a in options.alternatives if a != base))


def schedule_with_options(comp: Computation, estimator: LatencyEstimator, heuristic: Heuristic,
                          limits: dict[str, int], options: ScheduleOptions) -> ScheduleResult:
    """The list schedule of `comp` under the memory limit (re-run tighter while over it), then the
    options' post-passes. Does not change `comp` unless `redecide_sync` (it clears the marks)."""
    if options.redecide_sync:
        from scheduler.sync_marks import clear_sync_marks

        clear_sync_marks(comp)
    graph = ScheduleGraph(comp, estimator)
    result = _schedule_under_memory_limit(comp, estimator, heuristic, limits, graph, options)
    baseline = not getattr(heuristic, "respects_limits", True)  # original-order: no default extras
    if options.alternatives and not baseline and len(graph.nodes) <= options.alternatives_limit \
            and any(n.is_done for n in graph.nodes):
        result = _best_of_alternatives(comp, estimator, limits, graph, options, result)
    if options.fill_windows or (options.fill_within_memory and not baseline):
        result = _filled(comp, estimator, limits, graph, options, result)
    if options.keep_input_if_faster:
        result = keep_faster(comp, estimator, result, graph, limits)
    return result


def _filled(comp: Computation, estimator: LatencyEstimator, limits: dict[str, int], graph: ScheduleGraph,
            options: ScheduleOptions, result: ScheduleResult) -> ScheduleResult:
    """`result` after `fill_exposed_windows`: within `memory_limit` with `fill_windows`, else
    (`fill_within_memory`) within the list schedule's own peak memory."""
    from scheduler.fill import fill_exposed_windows
    from scheduler.simulator import peak_memory

    order = [n.inst for n in result.order]
    if options.fill_windows:
        budget = options.memory_limit
    else:
        budget = max(peak_memory(comp, order), 1)
    filled = fill_exposed_windows(comp, estimator, order, limits, memory_limit=budget)
    result.order = [graph.by_inst[i] for i in filled]
    return result


def _best_of_alternatives(comp: Computation, estimator: LatencyEstimator, limits: dict[str, int],
                          graph: ScheduleGraph, options: ScheduleOptions, result: ScheduleResult) -> ScheduleResult:
    """`result`, or the list schedule of an alternative heuristic where that simulates strictly faster
    and peaks no higher (simulated) than max(memory limit, `result`'s peak). Only computations with async
    ops get here: without them every order has the same makespan on the one compute stream."""
    from scheduler.fill import Timeline
    from scheduler.heuristics import get_heuristic
    from scheduler.simulator import peak_memory

    timeline = Timeline(comp, estimator, limits)
    run = timeline.run([n.inst for n in result.order])
    if not any(run.comm_end[start] > run.stream_before[done] + 1e-9 for done, start in timeline.start_of.items()):
        return result  # no done waits: the compute stream never idles, nothing can be faster
    best = run.makespan
    budget = max(options.memory_limit, peak_memory(comp, [n.inst for n in result.order]))
    for name in options.alternatives:
        other = _schedule_under_memory_limit(comp, estimator, get_heuristic(name), limits, graph, options)
        order = [n.inst for n in other.order]
        t = timeline.makespan(order)
        if t < best - 1e-9 and peak_memory(comp, order) <= budget:
            other.seconds += result.seconds
            result, best = other, t
    return result


def _schedule_under_memory_limit(comp: Computation, estimator: LatencyEstimator, heuristic: Heuristic,
                                 limits: dict[str, int], graph: ScheduleGraph,
                                 options: ScheduleOptions) -> ScheduleResult:
    limit = options.memory_limit
    result = schedule_computation(comp, estimator, heuristic, limits, limit, graph)
    reruns = 0
    while limit and result.peak_memory > options.memory_limit and reruns < options.max_reruns:
        limit = int(limit * 0.9)
        reruns += 1
        retry = schedule_computation(comp, estimator, heuristic, limits, limit, graph)
        if retry.peak_memory < result.peak_memory:
            result = retry
    result.reruns = reruns
    return result


def finish_computation(comp: Computation, result: ScheduleResult, options: ScheduleOptions,
                       control_deps: bool = False) -> bool:
    """Make `result` the order of `comp` (and re-mark sync pairs if `redecide_sync`); True if it changed."""
    changed = apply_order(comp, result.order, control_deps)
    if options.redecide_sync:
        from scheduler.sync_marks import mark_sync_pairs

        changed |= bool(mark_sync_pairs(comp))
    return changed


def fill_exposed_windows(comp: Computation, estimator: LatencyEstimator, order: list[Instruction],
                         limits: dict[str, int], max_rounds: int = 64, max_candidates: int = 64,
                         memory_limit: int = 0) -> list[Instruction]:
    """See `scheduler.fill.fill_exposed_windows` (kept here for existing imports)."""
    from scheduler.fill import fill_exposed_windows as fill

    return fill(comp, estimator, order, limits, max_rounds, max_candidates, memory_limit)


def _full_kinds(state: SchedState) -> set[str]:
    """Resource kinds with no free slot (only their nodes can fail `_fits`)."""
    return {k for k, n in state.in_flight.items() if n >= state.limit(k)}


def _fits(node: Node, state: SchedState) -> bool:
    """A done may open a window only while its resource has a free slot; a sync-marked collective
    (a start that is not `is_start`) cannot sit inside a window that holds its kind's last slot."""
    if node.kind is None or (node.is_start and not node.is_done):
        return True
    return state.in_flight.get(node.kind, 0) < state.limit(node.kind)


def _heap_applies(graph: ScheduleGraph, heuristic: Heuristic, memory_limit: int) -> bool:
    """xla-default or start-delay without a memory limit on a computation without async ops or collectives
    holding slots: the priority is then (-stall, unlocks, index), which `_XlaDefaultQueue` serves from heaps."""
    from scheduler.heuristics import StartDelay, XlaDefault

    return type(heuristic) in (XlaDefault, StartDelay) and not memory_limit and \
        all(n.kind is None for n in graph.nodes)


class _XlaDefaultQueue:
    """The ready set for `_heap_applies` cases, giving the node `max(ready, key=priority)` would give
    without scanning the set each step. A node's ready time is final once it is ready and the time only
    grows, so ready nodes are either stalled (a heap by ready time, then most unlocks, then latest index)
    or not (a heap by most unlocks, then latest index). Unlocks only grow while a node waits: each
    increase pushes a fresh entry, and stale ones are skipped when popped."""

    def __init__(self, state: SchedState, ready: list[Node]):
        self.state = state
        self.stalled: list[tuple] = []
        self.free: list[tuple] = []
        self.size = 0
        for node in ready:
            self.append(node)

    def __bool__(self) -> bool:
        return self.size > 0

    def append(self, node: Node) -> None:
        """`node` became ready."""
        self.size += 1
        self._push(node)

    def unlocked(self, node: Node) -> None:
        """`node`'s unlock count grew."""
        if node.unscheduled_succs == 0 and not node.scheduled:
            self._push(node)

    def _push(self, node: Node) -> None:
        if node.ready_time > self.state.current_time:
            heapq.heappush(self.stalled, (node.ready_time, -node.unlocks, -node.index, node.unlocks, node))
        else:
            heapq.heappush(self.free, (-node.unlocks, -node.index, node.unlocks, node))

    def pop(self) -> Node:
        """Remove and return the best ready node."""
        now = self.state.current_time
        while self.stalled and self.stalled[0][0] <= now:
            *_, unlocks, node = heapq.heappop(self.stalled)
            if not node.scheduled and unlocks == node.unlocks:
                heapq.heappush(self.free, (-node.unlocks, -node.index, node.unlocks, node))
        for heap in (self.free, self.stalled):
            while heap:
                *_, unlocks, node = heapq.heappop(heap)
                if not node.scheduled and unlocks == node.unlocks:
                    self.size -= 1
                    return node
        raise RuntimeError("ready set empty")


def _schedule(node: Node, state: SchedState, ready, on_unlock=None) -> None:
    """Place `node` (bottom-up): update time, resources, memory; newly ready operands go to `ready`."""
    state.memory += state.memory_delta(node)
    state.live.discard(node)
    for pred, _ in node.preds:
        state.live.add(pred)
    state.current_time = max(state.current_time, node.ready_time)
    node_time = state.current_time
    state.current_time += node.cost
    if node.is_done and node.kind:
        state.in_flight[node.kind] = state.in_flight.get(node.kind, 0) + 1
        state.ready_dones[node.kind] -= 1
    elif node.is_start and node.kind:
        state.in_flight[node.kind] = max(state.in_flight.get(node.kind, 0) - 1, 0)
    node.scheduled = True
    for pred, latency in node.preds:
        pred.ready_time = max(pred.ready_time, node_time + node.cost + latency)
        pred.unscheduled_succs -= 1
        if pred.unscheduled_succs == 1:  # its last unscheduled user now unlocks it
            for succ, _ in pred.succs:
                if not succ.scheduled:
                    succ.unlocks += 1
                    if on_unlock is not None:
                        on_unlock(succ)
                    break
        if pred.unscheduled_succs == 0:
            ready.append(pred)
            if pred.is_done and pred.kind:
                state.ready_dones[pred.kind] = state.ready_dones.get(pred.kind, 0) + 1


def apply_order(comp: Computation, order: list[Node], control_deps: bool = False) -> bool:
    """Make `order` the computation's instruction order; True if it changed."""
    new = [n.inst for n in order]
    changed = new != list(comp.instructions)
    comp.instructions = new
    if control_deps:
        named = [i for i in new if not i.inline]
        for a, b in zip(named, named[1:], strict=False):
            if b not in a.control_successors and a not in b.operands:
                a.add_control_successor(b)
                changed = True
    return changed


@register
@dataclass(frozen=True)
class LatencyHidingScheduler(ModulePass):
    """Schedule every non-fusion computation to overlap async collectives with compute.

    Beyond XLA's pass: `fill_windows` runs `fill_exposed_windows` after the list schedule,
    `keep_input_if_faster` keeps a computation's input order where it simulates faster (`keep_faster`),
    `redecide_sync` treats XLA's `is_sync` marks as a decision of the old order, the list schedules of
    `alternative_heuristics` are tried beside the heuristic's, and `fill_within_memory` fills windows within
    the list schedule's own peak memory (`ScheduleOptions`)."""

    name: ClassVar[str] = "latency-hiding-scheduler"
    heuristic: str = "xla-default"
    estimator: str = "analytical"
    device: str = "h100"
    overlap_limit: int = 1
    all_reduce_overlap_limit: int = 0
    all_gather_overlap_limit: int = 0
    reduce_scatter_overlap_limit: int = 0
    all_to_all_overlap_limit: int = 0
    collective_permute_overlap_limit: int = 0
    memory_limit: int = 0
    max_reruns: int = 3
    control_deps: bool = False
    keep_input_if_faster: bool = False
    fill_windows: bool = False
    redecide_sync: bool = True
    alternative_heuristics: str = "critical-path"  # comma-separated; "" = the heuristic alone
    fill_within_memory: bool = True
    results: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def kind_limits(self) -> dict[str, int]:
        """Overlap limit per resource kind."""
        return _limits(self.overlap_limit, {
            "all-reduce": self.all_reduce_overlap_limit, "all-gather": self.all_gather_overlap_limit,
            "reduce-scatter": self.reduce_scatter_overlap_limit, "all-to-all": self.all_to_all_overlap_limit,
            "collective-permute": self.collective_permute_overlap_limit,
        })

    def schedule_options(self) -> ScheduleOptions:
        """The per-computation options of this pass."""
        alternatives = tuple(h for h in self.alternative_heuristics.split(",") if h and h != self.heuristic)
        return ScheduleOptions(self.memory_limit, self.max_reruns, self.fill_windows, self.keep_input_if_faster,
                               self.redecide_sync, alternatives, self.fill_within_memory)

    def run(self, module: Module) -> bool:
        """Schedule and mark the module scheduled."""
        estimator = estimator_for(self.estimator, self.device)
        heuristic = get_heuristic(self.heuristic)
        limits = self.kind_limits()
        options = self.schedule_options()
        changed = False
        for comp in non_fusion_computations(module):
            result = schedule_with_options(comp, estimator, heuristic, limits, options)
            self.results[comp.name] = result
            changed |= finish_computation(comp, result, options, self.control_deps)
        if not module.is_scheduled:
            module.is_scheduled = True
            changed = True
        return changed
