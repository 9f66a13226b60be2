"""Collectives XLA:GPU marked `is_sync`: they block the compute stream in the simulator and are ordinary
(non-async) nodes for the scheduler, as in XLA's GPU latency-hiding scheduler."""

from __future__ import annotations

import pytest
from hlopt.scheduler.async_ops import is_sync_collective, stream_model
from hlopt.scheduler.costs import ApproximateLatencyEstimator, stream_cost
from hlopt.scheduler.graph import ScheduleGraph
from hlopt.scheduler.heuristics import get_heuristic
from hlopt.scheduler.latency_hiding_scheduler import schedule_computation
from hlopt.scheduler.simulator import release_tail_bound, simulate

from hlopt import hlo

SYNC = '{"operation_queue_id":"0","collective_backend_config":{"is_sync":true,"is_pipelined":false}}'
ASYNC = '{"operation_queue_id":"0","collective_backend_config":{"is_sync":false,"is_pipelined":false}}'


def _module(config: str | None, conv_between: bool = True) -> hlo.Module:
    """An all-reduce start/done pair with an independent convolution between (or after) them."""
    backend = f", backend_config={config}" if config else ""
    conv = "  %c = f32[1024]{0} convolution(f32[1024]{0} %p1, f32[1024]{0} %p1), dim_labels=b_io->b\n"
    start = ("  %ars = f32[1024]{0} all-reduce-start(f32[1024]{0} %p0), replica_groups={{0,1,2,3}}, "
             f"to_apply=%sum{backend}\n")
    done = "  %ard = f32[1024]{0} all-reduce-done(f32[1024]{0} %ars)\n"
    body = start + conv + done if conv_between else start + done + conv
    return hlo.parse(
        "HloModule m, is_scheduled=true\n\n%sum (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n"
        "  %b = f32[] parameter(1)\n  ROOT %s = f32[] add(f32[] %a, f32[] %b)\n}\n\n"
        "ENTRY %main (p0: f32[1024], p1: f32[1024]) -> (f32[1024], f32[1024]) {\n"
        "  %p0 = f32[1024]{0} parameter(0)\n  %p1 = f32[1024]{0} parameter(1)\n" + body +
        "  ROOT %t = (f32[1024]{0}, f32[1024]{0}) tuple(f32[1024]{0} %ard, f32[1024]{0} %c)\n}\n")


def test_is_sync_read_from_backend_config() -> None:
    sync, plain, unset = _module(SYNC), _module(ASYNC), _module(None)
    assert is_sync_collective(sync.entry.instruction("ars"))
    assert is_sync_collective(sync.entry.instruction("ard"))
    assert not is_sync_collective(sync.entry.instruction("c"))
    assert not is_sync_collective(plain.entry.instruction("ars"))
    assert not is_sync_collective(unset.entry.instruction("ard"))


@pytest.mark.parametrize("between", [True, False])
def test_sync_collective_blocks_compute_stream(between: bool) -> None:
    est = ApproximateLatencyEstimator()
    sync = simulate(_module(SYNC, between).entry, est)
    overlapped = simulate(_module(ASYNC, between).entry, est)
    latency, conv = est.HIGH_LATENCY, est.HIGH_COST
    assert sync.makespan_us == pytest.approx(latency + conv + 3 * est.LOW_COST)  # parameters and tuple cost 1 each
    assert sync.exposed_comm_us == pytest.approx(latency)
    assert sync.overlap_fraction == 0.0
    if between:  # the same order without the flag hides the convolution under the collective
        assert overlapped.makespan_us == pytest.approx(latency + 3 * est.LOW_COST)
    assert sync.lower_bound_us == pytest.approx(sync.makespan_us)  # the compute stream carries both
    assert sync.release_tail_bound_us <= sync.makespan_us + 1e-9


def test_sync_start_costs_its_latency_on_the_stream() -> None:
    est = ApproximateLatencyEstimator()
    m = _module(SYNC)
    assert stream_cost(est, m.entry.instruction("ars")) == est.HIGH_LATENCY
    assert stream_cost(est, m.entry.instruction("ard")) == 0.0
    assert stream_cost(est, _module(ASYNC).entry.instruction("ars")) == 0.0
    assert release_tail_bound(m.entry, est) == pytest.approx(est.HIGH_LATENCY + est.HIGH_COST + 3 * est.LOW_COST)


def test_scheduler_opens_no_window_for_a_sync_pair() -> None:
    est = ApproximateLatencyEstimator()
    m = _module(SYNC, conv_between=False)
    graph = ScheduleGraph(m.entry, est)
    nodes = {n.inst.name: n for n in graph.nodes}
    assert not nodes["ars"].is_start and not nodes["ard"].is_done and nodes["ard"].kind is None
    assert nodes["ars"].kind is None  # XLA:GPU: it runs on the compute stream and holds no async stream
    with stream_model("per-type"):  # XLA's generic AsyncTracker: it still holds a slot of its kind
        assert {n.inst.name: n for n in ScheduleGraph(m.entry, est).nodes}["ars"].kind == "all-reduce"
    assert all(lat == 0.0 for _, lat in nodes["ard"].preds)
    result = schedule_computation(m.entry, est, get_heuristic("xla-default"), {"default": 1}, graph=graph)
    assert simulate(m.entry, est, [n.inst for n in result.order]).makespan_us == pytest.approx(
        est.HIGH_LATENCY + est.HIGH_COST + 3 * est.LOW_COST)
    plain = _module(ASYNC, conv_between=False)  # without the flag the scheduler overlaps the pair
    order = schedule_computation(plain.entry, est, get_heuristic("xla-default"), {"default": 1}).order
    names = [n.inst.name for n in order]
    assert names.index("ars") < names.index("c") < names.index("ard")


def test_redecide_sync_overlaps_and_remarks() -> None:
    from hlopt.scheduler.latency_hiding_scheduler import LatencyHidingScheduler
    from hlopt.scheduler.sync_marks import clear_sync_marks, mark_sync_pairs

    est = ApproximateLatencyEstimator()
    kept = _module(SYNC, conv_between=False)
    LatencyHidingScheduler(estimator="approximate", redecide_sync=False).run(kept)
    assert is_sync_collective(kept.entry.instruction("ars"))
    redecided = _module(SYNC, conv_between=False)
    LatencyHidingScheduler(estimator="approximate").run(redecided)  # re-deciding is the default
    names = [i.name for i in redecided.entry.instructions]
    assert names.index("ars") < names.index("c") < names.index("ard")
    assert not is_sync_collective(redecided.entry.instruction("ars"))  # compute between: stays async
    assert simulate(redecided.entry, est).makespan_us < simulate(kept.entry, est).makespan_us
    adjacent = _module(ASYNC, conv_between=False)
    assert [i.name for i in mark_sync_pairs(adjacent.entry)] == ["ars"]
    assert is_sync_collective(adjacent.entry.instruction("ard"))
    assert [i.name for i in clear_sync_marks(adjacent.entry)] == ["ars"]
    assert not is_sync_collective(adjacent.entry.instruction("ars"))
    between = _module(ASYNC, conv_between=True)
    assert mark_sync_pairs(between.entry) == []
