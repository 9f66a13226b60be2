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

from hlo.ir import Computation, Instruction, Module
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


def keep_faster(comp: Computation, estimator: LatencyEstimator, result: ScheduleResult, graph: ScheduleGraph,
                limits: dict[str, int]) -> ScheduleResult:
    """`result`, or the computation's input order where that simulates strictly faster (not an XLA rule:
    a guard so that re-scheduling an already scheduled module never makes it slower)."""
    from scheduler.simulator import simulate

    ours = simulate(comp, estimator, [n.inst for n in result.order], limits).makespan_us
    given = simulate(comp, estimator, list(comp.instructions), limits)
    if given.makespan_us < ours:
        kept = sorted(graph.nodes, key=lambda n: n.index)
        return ScheduleResult(kept, result.seconds, result.reruns, given.peak_memory_bytes, kept_input=True)
    return result


def fill_exposed_windows(comp: Computation, estimator: LatencyEstimator, order: list[Instruction],
                         limits: dict[str, int], max_rounds: int = 64, max_candidates: int = 32) -> list[Instruction]:
    """Hoist compute ops to just before an async done while the simulated makespan drops (not an XLA
    rule: a post-pass for the windows a bottom-up list schedule leaves exposed, e.g. the prologue before
    the first all-gather's done, where independent work scheduled later could run)."""
    from hlo.opcodes import COLLECTIVES
    from scheduler.async_ops import is_async_done, is_async_start
    from scheduler.simulator import simulate

    def makespan(o: list[Instruction]) -> float:
        return simulate(comp, estimator, o, limits).makespan_us

    order = list(order)
    best = makespan(order)

    def movable(inst: Instruction) -> bool:
        return not (is_async_start(inst) or is_async_done(inst) or inst.opcode in COLLECTIVES
                    or inst is comp.root or inst.has_side_effect)

    def closure(inst: Instruction, after: set[Instruction]) -> list[Instruction] | None:
        """`inst` with the operands it needs that sit after the window (at most 8), or None."""
        need, stack = {inst}, [inst]
        while stack:
            for op in [*stack.pop().operands, *inst.control_predecessors]:
                if op in after and op not in need:
                    if not movable(op) or len(need) >= 8:
                        return None
                    need.add(op)
                    stack.append(op)
        return [i for i in order if i in need]

    for _ in range(max_rounds):
        improved = False
        for d, done in enumerate(order):
            if not is_async_done(done):
                continue
            after = set(order[d:])
            tried = 0
            for inst in order[d + 1:]:
                if not movable(inst) or estimator.node_cost(inst) <= 0:
                    continue
                moved = closure(inst, after)
                if moved is None:
                    continue
                tried += 1
                moving = set(moved)
                trial = order[:d] + moved + [i for i in order[d:] if i not in moving]
                t = makespan(trial)
                if t < best - 1e-9:
                    order, best, improved = trial, t, True
                    break
                if tried >= max_candidates:
                    break
            if improved:
                break
        if not improved:
            break
    return order


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
    """Schedule every non-fusion computation to overlap async collectives with compute.

    Beyond XLA's pass: `fill_windows` runs `fill_exposed_windows` after the list schedule, and
    `keep_input_if_faster` keeps a computation's input order where it simulates faster (`keep_faster`)."""

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
        if self.fill_windows:
            filled = fill_exposed_windows(comp, estimator, [n.inst for n in result.order], limits)
            node_of = {n.inst: n for n in graph.nodes}
            result.order = [node_of[i] for i in filled]
        if self.keep_input_if_faster:
            result = keep_faster(comp, estimator, result, graph, limits)
        return result
