"""scheduler/forward.py: the stream-aware forward list schedule gives legal orders, and the pass keeps it only
where it simulates faster (it closes the sweep's worst gaps on XLA:GPU's one collective stream)."""

from __future__ import annotations

import pytest
from hlopt.cli.schedule import schedule_module
from hlopt.hlo.ir import Module
from hlopt.passes.framework.pipeline import run_pipeline
from hlopt.scheduler.async_ops import stream_model
from hlopt.scheduler.costs import estimator_for
from hlopt.scheduler.fill import Timeline
from hlopt.scheduler.forward import forward_schedule
from hlopt.scheduler.graph import ScheduleGraph
from hlopt.scheduler.latency_hiding_scheduler import LatencyHidingScheduler
from hlopt.scheduler.simulator import simulate
from hlopt.scheduler.synthetic import PATTERNS, synthetic_module


def _async(layers: int, pattern: str, **kw) -> Module:
    module = synthetic_module(layers, pattern, **kw)
    run_pipeline(module, "async-collective-creator")
    return module


def _is_topological(order: list, comp) -> bool:
    seen: set = set()
    for inst in order:
        if any(op not in seen for op in (*inst.operands, *inst.control_predecessors)):
            return False
        seen.add(inst)
    return len(order) == len(comp.instructions) and seen == set(comp.instructions)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("limit", [1, 2])
def test_forward_order_is_legal_and_simulates_as_the_timeline_says(pattern: str, limit: int) -> None:
    module = _async(8, pattern, comm_ratio=2.0)
    est = estimator_for("analytical")
    limits = {"default": limit, "collective": limit}
    comp = module.entry
    order = [n.inst for n in forward_schedule(ScheduleGraph(comp, est), limits)]
    assert _is_topological(order, comp)
    result = simulate(comp, est, order, limits)
    assert result.makespan_us == pytest.approx(Timeline(comp, est, limits).makespan(order))
    assert result.makespan_us >= result.lower_bound_us - 1e-6


def test_forward_respects_the_overlap_limit_in_program_order() -> None:
    comp = _async(8, "mixed", comm_ratio=2.0).entry
    order = forward_schedule(ScheduleGraph(comp, estimator_for("analytical")), {"default": 1, "collective": 1})
    in_flight = 0
    for node in order:
        if node.is_start:
            in_flight += 1
            assert in_flight <= 1, node.inst.name
        elif node.is_done:
            in_flight -= 1


def _makespan(module: Module, forward: bool) -> float:
    est = estimator_for("analytical")
    lhs = LatencyHidingScheduler(forward_schedule=forward)
    lhs.run(module)
    with stream_model("xla-gpu"):
        return simulate(module.entry, est, limits=lhs.kind_limits()).makespan_us


@pytest.mark.parametrize("pattern,layers,ratio", [("fsdp", 4, 2.0), ("fsdp", 8, 2.0), ("mixed", 16, 4.0),
                                                  ("mixed", 8, 1.0), ("pipeline", 8, 4.0),
                                                  ("data-parallel", 8, 1.0)])
def test_pass_with_forward_never_slower(pattern: str, layers: int, ratio: float) -> None:
    with_forward = _makespan(_async(layers, pattern, comm_ratio=ratio), True)
    without = _makespan(_async(layers, pattern, comm_ratio=ratio), False)
    assert with_forward <= without + 1e-6


@pytest.mark.parametrize("source", ["synthetic:fsdp:4:2", "synthetic:fsdp:8:2", "synthetic:mixed:16:4"])
def test_sweeps_worst_modules_reach_the_bound(source: str) -> None:
    """These were 1.038-1.069x the bound with the list schedules and the fill alone: the collective stream
    idled while the compute stream ran, which the forward schedule (keeping the stream fed) avoids. XLA's list
    schedule alone now reaches the bound on fsdp:4:2 too (kStartAtZeroDepth); the default is never worse."""
    _, pattern, layers, ratio = source.split(":")
    s = schedule_module(synthetic_module(int(layers), pattern, comm_ratio=float(ratio)), "xla-default", "h100",
                        "analytical", 1)
    assert s["makespan_us"] <= 1.001 * s["lower_bound_us"]
    alone = schedule_module(synthetic_module(int(layers), pattern, comm_ratio=float(ratio)), "xla-default+alone",
                            "h100", "analytical", 1)
    assert s["makespan_us"] <= alone["makespan_us"] + 1e-6  # (kStartAtZeroDepth brought fsdp:4:2 alone to 1.001)


def test_forward_scheduled_module_runs_with_the_same_numbers() -> None:
    from hlopt.scheduler.latency_hiding_scheduler import apply_order

    from hlopt import hlo, runtime

    module = synthetic_module(3, "mixed", hidden=64, batch=32, comm_ratio=2.0)
    text = module.to_text()
    run_pipeline(module, "async-collective-creator")
    comp = module.entry
    order = forward_schedule(ScheduleGraph(comp, estimator_for("analytical")), {"default": 2, "collective": 2})
    apply_order(comp, order)
    module.is_scheduled = True
    assert runtime.run_and_compare(hlo.parse(text), module, rtol=1e-5, atol=1e-5).ok
