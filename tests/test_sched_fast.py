"""The heap-served ready set of xla-default (`_XlaDefaultQueue`) picks what the generic scan picks."""

from __future__ import annotations

import pytest
from hlopt.passes.framework.base import non_fusion_computations
from hlopt.scheduler.costs import estimator_for
from hlopt.scheduler.graph import ScheduleGraph
from hlopt.scheduler.heuristics import StartDelay, XlaDefault, get_heuristic
from hlopt.scheduler.latency_hiding_scheduler import _heap_applies, schedule_computation

from hlopt import hlo


class _ScannedXlaDefault(XlaDefault):
    """The same rules, served by the generic scan (the heap path applies to the registered classes only)."""


class _ScannedStartDelay(StartDelay):
    """The same rules, served by the generic scan."""


@pytest.mark.parametrize("name,scanned", [("xla-default", _ScannedXlaDefault), ("start-delay", _ScannedStartDelay)])
def test_heap_order_equals_scan_order(name: str, scanned: type) -> None:
    from hlopt.corpus.transformer import transformer_step_text

    module = hlo.parse(transformer_step_text(2))
    est = estimator_for("analytical")
    heap, scan = get_heuristic(name), scanned()
    checked = 0
    for comp in non_fusion_computations(module):
        graph = ScheduleGraph(comp, est)
        assert _heap_applies(graph, heap, 0) and not _heap_applies(graph, scan, 0)
        fast = schedule_computation(comp, est, heap, {"default": 1}, graph=graph)
        slow = schedule_computation(comp, est, scan, {"default": 1}, graph=graph)
        assert [n.inst for n in fast.order] == [n.inst for n in slow.order], comp.name
        checked += len(comp.instructions)
    assert checked > 500


def test_heap_not_used_with_async_ops_or_memory_limit() -> None:
    from hlopt.passes.framework.pipeline import run_pipeline
    from hlopt.scheduler.synthetic import synthetic_module

    module = synthetic_module(2, "fsdp", hidden=64, batch=64)
    run_pipeline(module, "async-collective-creator")
    graph = ScheduleGraph(module.entry, estimator_for("approximate"))
    assert not _heap_applies(graph, get_heuristic("xla-default"), 0)
    plain = synthetic_module(2, "fsdp", hidden=64, batch=64)
    assert not _heap_applies(ScheduleGraph(plain.entry, estimator_for("approximate")), get_heuristic("xla-default"),
                             1 << 20)


@pytest.mark.parametrize("name,scanned", [("xla-default", _ScannedXlaDefault), ("start-delay", _ScannedStartDelay)])
@pytest.mark.parametrize("pattern,ratio", [("fsdp", 4.0), ("mixed", 1.0), ("mixed", 8.0), ("data-parallel", 2.0),
                                           ("pipeline", 1.0)])
def test_split_ready_set_order_equals_scan_order(name: str, scanned: type, pattern: str, ratio: float) -> None:
    """With async ops, `_SplitReady` serves the nodes without a resource kind from a heap and scans the
    rest: the same order as scanning everything."""
    from hlopt.passes.framework.pipeline import run_pipeline
    from hlopt.scheduler.latency_hiding_scheduler import _split_heap_applies
    from hlopt.scheduler.synthetic import synthetic_module

    module = synthetic_module(12, pattern, comm_ratio=ratio)
    run_pipeline(module, "async-collective-creator")
    est = estimator_for("analytical")
    heap, scan = get_heuristic(name), scanned()
    assert _split_heap_applies(heap, 0) and not _split_heap_applies(scan, 0)
    assert not _split_heap_applies(heap, 1 << 20)
    for limits in ({"default": 1}, {"default": 2}):
        graph = ScheduleGraph(module.entry, est)
        fast = schedule_computation(module.entry, est, heap, limits, graph=graph)
        slow = schedule_computation(module.entry, est, scan, limits, graph=graph)
        assert [n.inst for n in fast.order] == [n.inst for n in slow.order]
