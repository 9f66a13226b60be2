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
import re
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from annotated_types import Ge
from hlopt.hlo.gc_pause import collection_paused
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.passes.framework.base import ModulePass, non_fusion_computations
from hlopt.passes.framework.registry import register
from hlopt.scheduler.async_ops import XLA_GPU_STREAM_LIMITS, stream_model
from hlopt.scheduler.costs import LatencyEstimator, estimator_for
from hlopt.scheduler.graph import Node, ScheduleGraph, buffer_bytes
from hlopt.scheduler.heuristics import Heuristic, SchedState, get_heuristic

if TYPE_CHECKING:
    from hlopt.scheduler.fill import Timeline

__all__ = ["LatencyHidingScheduler", "schedule_computation", "ScheduleResult", "ScheduleOptions",
           "schedule_with_options", "finish_computation", "keep_faster", "fill_exposed_windows",
           "scheduler_memory_limit"]

#: XLA:GPU leaves 20% of device memory to allocations outside its allocator (GetSchedulerMemoryLimit).
DEVICE_MEMORY_FRACTION = 0.80
#: xla_gpu_memory_limit_slop_factor's default, in percent.
MEMORY_LIMIT_SLOP_PERCENT = 95


def scheduler_memory_limit(module: Module, device: str = "h100") -> int:
    """XLA:GPU's GetSchedulerMemoryLimit: 80% of the device's memory, less the entry's parameters and
    result (live throughout; an aliased output counted once), times the slop factor (95%). 0 when the
    device's memory is unknown (a registered cost model without a `DeviceSpec`) or the I/O exceeds it."""
    memory = _device_memory_bytes(device)
    if not memory:
        return 0
    base = int(memory * DEVICE_MEMORY_FRACTION)
    entry = module.entry
    io = sum(p.shape.byte_size for p in entry.parameters) + entry.root.shape.byte_size
    io -= sum(_subshape(entry.root.shape, index).byte_size for index in aliased_outputs(module))
    if io > base:
        return 0
    return (base - io) * MEMORY_LIMIT_SLOP_PERCENT // 100


def _device_memory_bytes(device: str) -> int:
    """The memory of a built-in or spec-file device, or of a registered cost model's `device` spec."""
    from hlopt.cost_model import get_cost_model
    from hlopt.cost_model.devices import DeviceSpec, get_device

    try:
        return get_device(device).memory_bytes
    except ValueError:
        spec = getattr(get_cost_model(device), "device", None)
        return spec.memory_bytes if isinstance(spec, DeviceSpec) else 0


_ALIAS_OUTPUT = re.compile(r"\{([0-9,\s]*)\}\s*:\s*\(")


def aliased_outputs(module: Module) -> list[tuple[int, ...]]:
    """The output indices of the module's `input_output_alias` entries (`{1}: (0, {}, may-alias)`)."""
    text = str(module.config.get("input_output_alias", ""))
    return [tuple(int(x) for x in m.group(1).replace(" ", "").split(",") if x) for m in _ALIAS_OUTPUT.finditer(text)]


def _subshape(shape, index: tuple[int, ...]):
    for i in index:
        shape = shape.elements[i]
    return shape



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
    if _heap_applies(graph, heuristic, memory_limit):
        order, peak = _run_heap(state, ready)
    elif _split_heap_applies(heuristic, memory_limit):
        order, peak = _run_split(state, ready, heuristic)
    else:
        order, peak = _run_scan(state, ready, heuristic, respects_limits)
    order.reverse()
    if len(order) != len(graph.nodes):
        raise RuntimeError(f"scheduler lost instructions in {comp.name}")
    return ScheduleResult(order, time.perf_counter() - start, peak_memory=peak)


def _run_heap(state: SchedState, ready: list[Node]) -> tuple[list[Node], int]:
    """The bottom-up order and peak memory from `ready`, served by `_XlaDefaultQueue` (`_heap_applies`)."""
    order: list[Node] = []
    peak = state.memory
    queue = _XlaDefaultQueue(state, ready)
    while queue:
        best = queue.pop()
        _schedule(best, state, queue, queue.unlocked)
        order.append(best)
        if state.memory > peak:
            peak = state.memory
    return order, peak


def _run_split(state: SchedState, ready: list[Node], heuristic: Heuristic) -> tuple[list[Node], int]:
    """The bottom-up order and peak memory from `ready`, served by `_SplitReady`
    (`_split_heap_applies`). The kinds without a free slot are kept up to date as dones and starts are
    scheduled (what `_full_kinds` gives), and a single candidate is taken without ranking it."""
    order: list[Node] = []
    peak = state.memory
    key = partial(heuristic.priority, state=state)  # xla-default or start-delay: priority(node, state)
    ready_set = _SplitReady(state, ready)
    full = _full_kinds(state)
    while ready_set:
        candidates = ready_set.candidates(full)
        best = candidates[0] if len(candidates) == 1 else max(candidates, key=key)
        ready_set.remove(best)
        _schedule(best, state, ready_set, ready_set.unlocked)
        order.append(best)
        if state.memory > peak:
            peak = state.memory
        kind = best.kind
        if kind and (best.is_done or best.is_start):  # `_schedule` changed its kind's slots in flight
            if state.in_flight[kind] >= state.limit(kind):
                full.add(kind)
            else:
                full.discard(kind)
    return order, peak


def _run_scan(state: SchedState, ready: list[Node], heuristic: Heuristic,
              respects_limits: bool) -> tuple[list[Node], int]:
    """The bottom-up order and peak memory from `ready`, ranking every candidate with the heuristic."""
    order: list[Node] = []
    peak = state.memory
    priority = heuristic.priority
    ready_set = _ReadySet(ready)
    while ready_set:
        full = _full_kinds(state) if respects_limits else ()
        best = max(ready_set.candidates(full), key=lambda n: priority(n, state))
        ready_set.remove(best)
        _schedule(best, state, ready_set, None)
        order.append(best)
        if state.memory > peak:
            peak = state.memory
    return order, peak


def keep_faster(comp: Computation, estimator: LatencyEstimator, result: ScheduleResult, graph: ScheduleGraph,
                limits: dict[str, int]) -> ScheduleResult:
    """`result`, or the computation's input order where that simulates strictly faster (not an XLA rule:
    a guard so that re-scheduling an already scheduled module never makes it slower)."""
    from hlopt.scheduler.fill import Timeline
    from hlopt.scheduler.simulator import peak_memory

    timeline = Timeline(comp, estimator, limits, graph)
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
    windows within `memory_limit`, or without one, with `fill_budget="device"` (default) within
    `fill_memory_limit` or else XLA's scheduler memory limit for the estimator's device
    (`scheduler_memory_limit`, as XLA:GPU bounds its own scheduler), with `"peak"` within the list
    schedule's own peak (never more memory); a fill move is kept only where it shortens the makespan;
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
    fill_budget: str = "device"  # the default fill's memory budget: "device" or "peak"
    fill_memory_limit: int = 0  # with "device": the budget in bytes (0 = scheduler_memory_limit)
    scheduled_input_alternative: bool = True  # a scheduled module's given order, filled, is a candidate
    stream_limits: tuple[int, ...] = (2, 3)  # XLA:GPU model: collective-stream limits also tried
    forward: bool = True  # XLA:GPU model: the stream-aware forward schedule (`scheduler.forward`) also tried
    forward_limit: int = 200_000  # computations above this many instructions do not get it

    SUFFIXES: ClassVar[dict[str, dict[str, object]]] = {
        "fill": {"fill_windows": True}, "keep": {"keep_input_if_faster": True},
        "keepsync": {"redecide_sync": False}, "unsync": {"redecide_sync": True},
        "alone": {"alternatives": (), "fill_within_memory": False, "scheduled_input_alternative": False,
                  "stream_limits": (), "forward": False},
        "samepeak": {"fill_budget": "peak"}}

    @classmethod
    def parse(cls, spec: str, **kw) -> tuple[str, ScheduleOptions]:
        """`NAME+fill+keep+keepsync+alone+samepeak` -> (NAME, options with those settings); `+alone` is
        the heuristic's list schedule alone (no alternatives, no default fill); `+samepeak` keeps the
        default fill within the list schedule's own peak memory (the pass's `fill_budget="peak"`)."""
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
    options' post-passes; on XLA:GPU's stream model also the same with the collective stream's overlap
    limit raised (`_stream_limit_alternatives`), the fastest kept. Does not change `comp` unless
    `redecide_sync` (it clears the marks)."""
    if options.redecide_sync:
        from hlopt.scheduler.sync_marks import clear_sync_marks

        clear_sync_marks(comp)
    graph = ScheduleGraph(comp, estimator)
    result = _schedule_with_graph(comp, estimator, heuristic, limits, options, graph)
    baseline = not getattr(heuristic, "respects_limits", True)
    raised = _stream_limit_alternatives(limits, options) if not baseline else []
    if raised and len(graph.nodes) <= options.alternatives_limit and any(n.is_done for n in graph.nodes):
        result = _fastest_of_raised_limits(comp, estimator, heuristic, limits, raised, options, graph, result)
    if _forward_applies(graph, options, baseline):
        # large computations: only the first raised limit where there is one (on the sweep's and
        # schedule_scale's modules it is the forward schedule's best; each run costs ~1 s at 15k instructions)
        tried = [limits, *raised] if len(graph.nodes) <= options.alternatives_limit else [*raised[:1]] or [limits]
        result = _with_forward(comp, estimator, limits, tried, graph, options, result)
    return result


def _with_forward(comp: Computation, estimator: LatencyEstimator, limits: dict[str, int],
                  tried: list[dict[str, int]], graph: ScheduleGraph, options: ScheduleOptions,
                  result: ScheduleResult) -> ScheduleResult:
    """`result`, or the fastest forward schedule under the limits `tried` (`_best_forward`), filled as
    `result` was, where that simulates strictly faster within the memory budget (`_faster`)."""
    from hlopt.scheduler.fill import Timeline

    timeline = Timeline(comp, estimator, limits, graph)
    forward = _best_forward(timeline, tried, graph, options)
    if options.fill_windows or options.fill_within_memory:
        forward = _filled(comp, estimator, limits, graph, options, forward)
    return _faster(comp, estimator, timeline, options, result, forward)


def _fastest_of_raised_limits(comp: Computation, estimator: LatencyEstimator, heuristic: Heuristic,
                              limits: dict[str, int], raised: list[dict[str, int]], options: ScheduleOptions,
                              graph: ScheduleGraph, result: ScheduleResult) -> ScheduleResult:
    """`result`, or the schedule under one of the `raised` limits where that simulates strictly faster
    within the fill's memory budget."""
    from hlopt.scheduler.fill import Timeline

    timeline = Timeline(comp, estimator, limits, graph)
    best = timeline.makespan([n.inst for n in result.order])
    budget = options.memory_limit or _fill_budget(comp, estimator, options, [n.inst for n in result.order])
    for other_limits in raised:
        other = _schedule_with_graph(comp, estimator, heuristic, other_limits, options, graph)
        result, best = _shorter_of(comp, timeline, budget, (result, best), other)
    return result


def _shorter_of(comp: Computation, timeline: Timeline, budget: float, kept: tuple[ScheduleResult, float],
                other: ScheduleResult) -> tuple[ScheduleResult, float]:
    """(schedule, makespan) of the one kept: `other` where its simulation is shorter than the kept one's and its
    peak memory within `budget` (its seconds then include the kept one's), else the kept one."""
    from hlopt.scheduler.simulator import peak_memory

    result, best = kept
    order = [n.inst for n in other.order]
    t = timeline.makespan(order)
    if t < best - 1e-9 and peak_memory(comp, order) <= budget:
        other.seconds += result.seconds
        return other, t
    return result, best


def _schedule_with_graph(comp: Computation, estimator: LatencyEstimator, heuristic: Heuristic,
                         limits: dict[str, int], options: ScheduleOptions, graph: ScheduleGraph) -> ScheduleResult:
    """`schedule_with_options` after the sync marks were cleared, with `graph` built."""
    result = _schedule_under_memory_limit(comp, estimator, heuristic, limits, graph, options)
    baseline = not getattr(heuristic, "respects_limits", True)  # original-order: no default extras
    if options.alternatives and not baseline and len(graph.nodes) <= options.alternatives_limit \
            and any(n.is_done for n in graph.nodes):
        result = _best_of_alternatives(comp, estimator, limits, graph, options, result)
    if options.fill_windows or (options.fill_within_memory and not baseline):
        result = _filled(comp, estimator, limits, graph, options, result)
        if options.scheduled_input_alternative and not baseline and comp.module is not None \
                and comp.module.is_scheduled and any(n.is_done for n in graph.nodes):
            result = _best_of_scheduled_input(comp, estimator, limits, graph, options, result)
    if options.keep_input_if_faster:
        result = keep_faster(comp, estimator, result, graph, limits)
    return result


def _forward_applies(graph: ScheduleGraph, options: ScheduleOptions, baseline: bool) -> bool:
    """Whether the forward schedule is tried: XLA:GPU's stream model, async ops, not too large."""
    from hlopt.scheduler.async_ops import current_stream_model

    return options.forward and not baseline and current_stream_model() == "xla-gpu" and \
        len(graph.nodes) <= options.forward_limit and any(n.is_done for n in graph.nodes)


def _best_forward(timeline: Timeline, tried: list[dict[str, int]], graph: ScheduleGraph,
                  options: ScheduleOptions) -> ScheduleResult:
    """The fastest (simulated on `limits`: the streams are the same) of the stream-aware forward schedules
    (`forward.forward_schedule`) under each of the overlap limits `tried`, with and (up to
    `alternatives_limit` instructions) without feeding the streams (not an XLA rule)."""
    from hlopt.scheduler.forward import forward_schedule

    start = time.perf_counter()
    best: tuple[float, list[Node]] | None = None
    feeds = (True, False) if len(graph.nodes) <= options.alternatives_limit else (True,)
    for other_limits in tried:
        for feed in feeds:
            order = forward_schedule(graph, other_limits, feed)
            t = timeline.makespan([n.inst for n in order])
            if best is None or t < best[0] - 1e-9:
                best = (t, order)
    return ScheduleResult(best[1], time.perf_counter() - start)


def _faster(comp: Computation, estimator: LatencyEstimator, timeline: Timeline, options: ScheduleOptions,
            result: ScheduleResult, other: ScheduleResult) -> ScheduleResult:
    """`other` where it simulates (on `timeline`) strictly faster than `result` and peaks no higher than
    the memory limit, else the `fill_budget`; else `result` (each charged the other's seconds)."""
    from hlopt.scheduler.simulator import peak_memory

    ours, theirs = [n.inst for n in result.order], [n.inst for n in other.order]
    budget = options.memory_limit or _fill_budget(comp, estimator, options, ours)
    if timeline.makespan(theirs) < timeline.makespan(ours) - 1e-9:
        peak = peak_memory(comp, theirs)
        if peak <= budget:
            other.seconds += result.seconds
            other.reruns, other.peak_memory = result.reruns, peak
            return other
    result.seconds += other.seconds
    return result


def _filled(comp: Computation, estimator: LatencyEstimator, limits: dict[str, int], graph: ScheduleGraph,
            options: ScheduleOptions, result: ScheduleResult) -> ScheduleResult:
    """`result` after `fill_exposed_windows`: within `memory_limit` (0 = none) with `fill_windows`, else
    (`fill_within_memory`) within `memory_limit` or the `fill_budget`. A budget no order of `comp` can
    reach is no limit (cheaper to fill)."""
    from hlopt.scheduler.fill import fill_exposed_windows

    order = [n.inst for n in result.order]
    if not any(n.is_done for n in graph.nodes):
        return result  # no async op: no window to fill
    if options.fill_windows:
        budget = options.memory_limit
    else:
        budget = options.memory_limit or _fill_budget(comp, estimator, options, order)
    if budget and budget >= sum(buffer_bytes(i) for i in order):
        budget = 0
    filled = fill_exposed_windows(comp, estimator, order, limits, memory_limit=budget, graph=graph)
    result.order = [graph.by_inst[i] for i in filled]
    return result


def _best_of_scheduled_input(comp: Computation, estimator: LatencyEstimator, limits: dict[str, int],
                             graph: ScheduleGraph, options: ScheduleOptions,
                             result: ScheduleResult) -> ScheduleResult:
    """`result`, or the computation's given order (a scheduled module's: XLA's own, re-scheduled) with
    the same window fill, where that simulates strictly faster within the same memory budget. On one
    shared collective stream the order of the collectives matters, and the fill keeps it: the given
    order is one more list schedule of the portfolio (not an XLA rule)."""
    from hlopt.scheduler.fill import Timeline
    from hlopt.scheduler.simulator import peak_memory

    given = ScheduleResult(sorted(graph.nodes, key=lambda n: n.index), 0.0)
    ours = [n.inst for n in result.order]
    budget = options.memory_limit or _fill_budget(comp, estimator, options, ours)
    other = _filled(comp, estimator, limits, graph, options, given)
    order = [n.inst for n in other.order]
    timeline = Timeline(comp, estimator, limits, graph)
    if timeline.makespan(order) < timeline.makespan(ours) - 1e-9 and peak_memory(comp, order) <= budget:
        result.order, result.kept_input = other.order, True
    return result


def _fill_budget(comp: Computation, estimator: LatencyEstimator, options: ScheduleOptions,
                 order: list[Instruction]) -> int:
    """The default fill's memory budget in bytes (`ScheduleOptions.fill_budget`)."""
    from hlopt.scheduler.simulator import peak_memory

    if options.fill_budget == "peak" or comp.module is None or comp.module.entry is None:
        return max(peak_memory(comp, order), 1)
    if options.fill_budget != "device":
        raise ValueError(f"unknown fill budget {options.fill_budget!r} (device, peak)")
    limit = options.fill_memory_limit or scheduler_memory_limit(comp.module, getattr(estimator, "device", "h100"))
    return limit or max(peak_memory(comp, order), 1)


def _stream_limit_alternatives(limits: dict[str, int], options: ScheduleOptions) -> list[dict[str, int]]:
    """On XLA:GPU's stream model, `limits` with the collective stream's overlap limit raised to each of
    `options.stream_limits`: the runtime still runs the collectives one after another on the one stream
    (the simulator too), the limit only decides how early the next start may be issued, before the
    previous done, so that a done held back behind compute does not leave the stream idle."""
    from hlopt.scheduler.async_ops import current_stream_model

    if current_stream_model() != "xla-gpu":
        return []
    base = limits.get("collective", limits.get("default", 1))
    return [{**limits, "collective": n} for n in options.stream_limits if n > base]


def _best_of_alternatives(comp: Computation, estimator: LatencyEstimator, limits: dict[str, int],
                          graph: ScheduleGraph, options: ScheduleOptions, result: ScheduleResult) -> ScheduleResult:
    """`result`, or the list schedule of an alternative heuristic where that simulates strictly faster
    and peaks no higher (simulated) than the memory limit, else the `fill_budget`. Only computations with async
    ops get here: without them every order has the same makespan on the one compute stream."""
    from hlopt.scheduler.fill import Timeline
    from hlopt.scheduler.heuristics import get_heuristic

    timeline = Timeline(comp, estimator, limits, graph)
    run = timeline.run([n.inst for n in result.order])
    if not any(run.comm_end[start] > run.stream_before[done] + 1e-9 for done, start in timeline.start_of.items()):
        return result  # no done waits: the compute stream never idles, nothing can be faster
    best = run.makespan
    budget = options.memory_limit or _fill_budget(comp, estimator, options, [n.inst for n in result.order])
    for name in options.alternatives:
        other = _schedule_under_memory_limit(comp, estimator, get_heuristic(name), limits, graph, options)
        result, best = _shorter_of(comp, timeline, budget, (result, best), other)
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
        from hlopt.scheduler.sync_marks import mark_sync_pairs

        changed |= bool(mark_sync_pairs(comp))
    return changed


def fill_exposed_windows(comp: Computation, estimator: LatencyEstimator, order: list[Instruction],
                         limits: dict[str, int], max_rounds: int = 64, max_candidates: int = 64,
                         memory_limit: int = 0) -> list[Instruction]:
    """See `scheduler.fill.fill_exposed_windows` (kept here for existing imports)."""
    from hlopt.scheduler.fill import fill_exposed_windows as fill

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
    from hlopt.scheduler.heuristics import StartDelay, XlaDefault

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

    @staticmethod
    def _key(node: Node) -> tuple:
        # async depth and done operands are fixed per node (both 0 without async ops)
        return (-node.async_depth, not node.has_done_operand, -node.unlocks, -node.index, node.unlocks, node)

    def _push(self, node: Node) -> None:
        if node.ready_time > self.state.current_time:
            heapq.heappush(self.stalled, (node.ready_time, *self._key(node)))
        else:
            heapq.heappush(self.free, self._key(node))

    def peek(self) -> Node | None:
        """The best ready node (None if there is none), left in the queue."""
        now = self.state.current_time
        while self.stalled and self.stalled[0][0] <= now:
            *_, unlocks, node = heapq.heappop(self.stalled)
            if not node.scheduled and unlocks == node.unlocks:
                heapq.heappush(self.free, self._key(node))
        for heap in (self.free, self.stalled):
            while heap:
                *_, unlocks, node = heap[0]
                if not node.scheduled and unlocks == node.unlocks:
                    return node
                heapq.heappop(heap)
        return None

    def pop(self) -> Node:
        """Remove and return the best ready node."""
        node = self.peek()
        if node is None:
            raise RuntimeError("ready set empty")
        heapq.heappop(self.free if self.free and self.free[0][-1] is node else self.stalled)
        self.size -= 1
        return node


class _ReadySet:
    """The ready list of the general case, with the nodes that take a resource slot when scheduled (dones,
    sync-marked collectives) kept per kind, so a step skips a full kind's nodes without scanning them."""

    def __init__(self, nodes: list[Node]):
        self.free: list[Node] = []  # no resource kind, or an overlapped start (it frees a slot)
        self.by_kind: dict[str, list[Node]] = {}
        for node in nodes:
            self.append(node)

    def __bool__(self) -> bool:
        return bool(self.free) or any(self.by_kind.values())

    def append(self, node: Node) -> None:
        """`node` became ready."""
        if node.kind is None or node.is_start:
            self.free.append(node)
        else:
            self.by_kind.setdefault(node.kind, []).append(node)

    def remove(self, node: Node) -> None:
        """`node` was scheduled."""
        if node.kind is None or node.is_start:
            self.free.remove(node)
        else:
            self.by_kind[node.kind].remove(node)

    def candidates(self, full, fallback: bool = True) -> list[Node]:
        """What `_fits` keeps: nodes of a kind with a free slot and overlapped starts; all nodes if none
        (and `fallback`)."""
        out = self.free + [n for kind, nodes in self.by_kind.items() if kind not in full for n in nodes]
        if out or not fallback:
            return out
        return self.free + [n for nodes in self.by_kind.values() for n in nodes]


def _split_heap_applies(heuristic: Heuristic, memory_limit: int) -> bool:
    """xla-default or start-delay without a memory limit: for nodes without a resource kind their
    priority is (-stall, async depth, done operand, unlocks, index), which `_XlaDefaultQueue` serves.
    Both respect the overlap limits (`respects_limits`), which `_run_split` assumes."""
    from hlopt.scheduler.heuristics import StartDelay, XlaDefault

    return type(heuristic) in (XlaDefault, StartDelay) and not memory_limit


class _SplitReady:
    """The ready set for `_split_heap_applies`. Every node but an overlapped start goes to an
    `_XlaDefaultQueue` per (resource kind or None, is a done): within one, the priority is (-stall, async
    depth, done operand, unlocks, index) whatever the resources, so only each queue's best is a
    candidate (and only for a kind with a free slot, as `_fits` asks); starts (at most their kind's limit
    are ready at once) are scanned. `max(candidates, key=priority)` picks what it would pick from the
    whole ready list."""

    def __init__(self, state: SchedState, nodes: list[Node]):
        self.state = state
        self.queues: dict[tuple[str | None, bool], _XlaDefaultQueue] = {}
        self.starts: list[Node] = []
        self.size = 0
        for node in nodes:
            self.append(node)

    def __bool__(self) -> bool:
        return self.size > 0

    def _queue(self, node: Node) -> _XlaDefaultQueue:
        key = (node.kind, node.is_done)
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = _XlaDefaultQueue(self.state, [])
        return queue

    def append(self, node: Node) -> None:
        """`node` became ready."""
        self.size += 1
        if node.is_start:
            self.starts.append(node)
        else:
            self._queue(node).append(node)

    def unlocked(self, node: Node) -> None:
        """`node`'s unlock count grew."""
        if not node.is_start:
            self._queue(node).unlocked(node)

    def remove(self, node: Node) -> None:
        """`node` was scheduled (a queue's best, or a start)."""
        self.size -= 1
        if node.is_start:
            self.starts.remove(node)
        else:
            popped = self._queue(node).pop()
            assert popped is node

    def candidates(self, full) -> list[Node]:
        """The starts and the best of each queue whose kind has a free slot; if none, every queue's best."""
        out = list(self.starts)
        held = []
        for (kind, _), queue in self.queues.items():
            top = queue.peek() if queue.size else None  # an empty queue's peek gives None
            if top is not None:
                (held if kind is not None and kind in full else out).append(top)
        return out or held


def _schedule(node: Node, state: SchedState, ready, on_unlock=None) -> None:
    """Place `node` (bottom-up): update time, resources, memory; newly ready operands go to `ready`."""
    live = state.live  # `memory_delta` and the liveness update in one pass over the operands
    delta = 0
    if node in live:
        delta = -node.bytes
        live.discard(node)
    for pred, _ in node.preds:
        if pred not in live:
            delta += pred.bytes
            live.add(pred)
    state.memory += delta
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
    the memory limit, by default XLA:GPU's for the device (`fill_budget="peak"`: within the list
    schedule's own peak; `ScheduleOptions`); on XLA:GPU's stream model `forward_schedule` also tries the
    stream-aware forward list schedule of `scheduler.forward`, kept where it simulates faster."""

    name: ClassVar[str] = "latency-hiding-scheduler"
    heuristic: str = "xla-default"
    estimator: str = "analytical"
    device: str = "h100"
    overlap_limit: Annotated[int, Ge(1)] = 1
    all_reduce_overlap_limit: Annotated[int, Ge(0)] = 0  # 0: overlap_limit
    all_gather_overlap_limit: Annotated[int, Ge(0)] = 0
    reduce_scatter_overlap_limit: Annotated[int, Ge(0)] = 0
    all_to_all_overlap_limit: Annotated[int, Ge(0)] = 0
    collective_permute_overlap_limit: Annotated[int, Ge(0)] = 0
    memory_limit: Annotated[int, Ge(0)] = 0
    max_reruns: Annotated[int, Ge(0)] = 3
    control_deps: bool = False
    keep_input_if_faster: bool = False
    fill_windows: bool = False
    redecide_sync: bool = True
    alternative_heuristics: str = "critical-path"  # comma-separated; "" = the heuristic alone
    fill_within_memory: bool = True
    fill_budget: str = "device"  # "device": XLA's scheduler memory limit; "peak": the list schedule's peak
    stream_model: Literal["xla-gpu", "per-type"] = "xla-gpu"  # async_ops.STREAM_MODELS
    forward_schedule: bool = True  # also try the stream-aware forward schedule (`scheduler.forward`)
    results: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def kind_limits(self) -> dict[str, int]:
        """Overlap limit per resource: on XLA:GPU's stream model `overlap_limit` for the collective stream
        (XLA's parallel collective overlap limit) and XLA's own for the P2P and memcpy streams; per type,
        `overlap_limit` or the type's own limit."""
        if self.stream_model == "xla-gpu":
            return {"default": self.overlap_limit, "collective": self.overlap_limit, **XLA_GPU_STREAM_LIMITS}
        return _limits(self.overlap_limit, {
            "all-reduce": self.all_reduce_overlap_limit, "all-gather": self.all_gather_overlap_limit,
            "reduce-scatter": self.reduce_scatter_overlap_limit, "all-to-all": self.all_to_all_overlap_limit,
            "collective-permute": self.collective_permute_overlap_limit,
        })

    def schedule_options(self) -> ScheduleOptions:
        """The per-computation options of this pass."""
        alternatives = tuple(h for h in self.alternative_heuristics.split(",") if h and h != self.heuristic)
        return ScheduleOptions(self.memory_limit, self.max_reruns, self.fill_windows, self.keep_input_if_faster,
                               self.redecide_sync, alternatives, self.fill_within_memory,
                               fill_budget=self.fill_budget, forward=self.forward_schedule)

    def run(self, module: Module) -> bool:
        """Schedule and mark the module scheduled."""
        estimator = estimator_for(self.estimator, self.device)
        heuristic = get_heuristic(self.heuristic)
        limits = self.kind_limits()
        options = self.schedule_options()
        if options.fill_budget == "device" and not options.memory_limit and not options.fill_memory_limit:
            options = replace(options, fill_memory_limit=scheduler_memory_limit(module, self.device))
        changed = False
        with collection_paused(), stream_model(self.stream_model):
            for comp in non_fusion_computations(module):
                result = schedule_with_options(comp, estimator, heuristic, limits, options)
                self.results[comp.name] = result
                changed |= finish_computation(comp, result, options, self.control_deps)
        if not module.is_scheduled:
            module.is_scheduled = True
            changed = True
        return changed
