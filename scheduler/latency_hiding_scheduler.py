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

import time
from dataclasses import dataclass, field
from typing import ClassVar

from hlo.ir import Computation, Module
from passes.base import ModulePass, non_fusion_computations
from passes.registry import register
from scheduler.costs import LatencyEstimator, estimator_for
from scheduler.graph import Node, ScheduleGraph
from scheduler.heuristics import Heuristic, SchedState, get_heuristic

__all__ = ["LatencyHidingScheduler", "schedule_computation", "ScheduleResult"]


@dataclass
class ScheduleResult:
    """The order found for one computation and what it cost to find."""

    order: list[Node]
    seconds: float
    reruns: int = 0
    peak_memory: int = 0


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
    priority = heuristic.priority
    while ready:
        candidates = [n for n in ready if not respects_limits or _fits(n, state)] or ready
        best = max(candidates, key=lambda n: priority(n, state))
        ready.remove(best)
        _schedule(best, state, ready)
        order.append(best)
        peak = max(peak, state.memory)
    order.reverse()
    if len(order) != len(graph.nodes):
        raise RuntimeError(f"scheduler lost instructions in {comp.name}")
    return ScheduleResult(order, time.perf_counter() - start, peak_memory=peak)


def _fits(node: Node, state: SchedState) -> bool:
    """A done may open a window only while its resource has a free slot."""
    if not node.is_done or node.kind is None:
        return True
    return state.in_flight.get(node.kind, 0) < state.limit(node.kind)


def _schedule(node: Node, state: SchedState, ready: list[Node]) -> None:
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
    """Schedule every non-fusion computation to overlap async collectives with compute."""

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
    results: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def kind_limits(self) -> dict[str, int]:
        """Overlap limit per resource kind."""
        return _limits(self.overlap_limit, {
            "all-reduce": self.all_reduce_overlap_limit, "all-gather": self.all_gather_overlap_limit,
            "reduce-scatter": self.reduce_scatter_overlap_limit, "all-to-all": self.all_to_all_overlap_limit,
            "collective-permute": self.collective_permute_overlap_limit,
        })

    def run(self, module: Module) -> bool:
        """Schedule and mark the module scheduled."""
        estimator = estimator_for(self.estimator, self.device)
        heuristic = get_heuristic(self.heuristic)
        limits = self.kind_limits()
        changed = False
        for comp in non_fusion_computations(module):
            result = self._schedule_with_reruns(comp, estimator, heuristic, limits)
            self.results[comp.name] = result
            changed |= apply_order(comp, result.order, self.control_deps)
        if not module.is_scheduled:
            module.is_scheduled = True
            changed = True
        return changed

    def _schedule_with_reruns(self, comp, estimator, heuristic, limits) -> ScheduleResult:
        graph = ScheduleGraph(comp, estimator)
        limit = self.memory_limit
        result = schedule_computation(comp, estimator, heuristic, limits, limit, graph)
        reruns = 0
        while limit and result.peak_memory > self.memory_limit and reruns < self.max_reruns:
            limit = int(limit * 0.9)
            reruns += 1
            retry = schedule_computation(comp, estimator, heuristic, limits, limit, graph)
            if retry.peak_memory < result.peak_memory:
                result = retry
        result.reruns = reruns
        return result
