"""One estimator interface and one two-stream machine (cost_model.estimator, cost_model.streams), shared by the
scheduler's simulator and the collective-pipeliner's gate."""

from __future__ import annotations

from hlopt.cost_model.estimator import (
    AnalyticalLatencyEstimator,
    ApproximateLatencyEstimator,
    LatencyEstimator,
    estimator_for,
)
from hlopt.cost_model.streams import StreamMachine, claim_slot
from hlopt.cost_model.xla_estimates import XlaEstimateTimes
from hlopt.passes.collectives.collective_pipeliner import analyze_loop
from hlopt.passes.collectives.collective_pipeliner_cost import _Times, iteration_time_us
from hlopt.scheduler import costs
from hlopt.scheduler.simulator import simulate
from pipeliner_cases import loop

from hlopt import hlo

#: a chain: slice, all-gather, matmul on the gathered weights (nothing to overlap: both machines agree)
CHAIN = loop("chain", ["f32[4,256,1024]", "f32[4096,1024]"], """  %ds = f32[1,256,1024] dynamic-slice(%v1, %v0, %zero, %zero), dynamic_slice_sizes={1,256,1024}
  %r = f32[256,1024] reshape(%ds)
  %ag = f32[1024,1024] all-gather(%r), replica_groups={{0,1,2,3}}, dimensions={0}
  %y = f32[4096,1024] dot(%v2, %ag), lhs_contracting_dims={1}, rhs_contracting_dims={0}""", ["%v1", "%y"])


def test_every_estimator_speaks_the_one_protocol():
    for est in (ApproximateLatencyEstimator(), AnalyticalLatencyEstimator("h100"), XlaEstimateTimes("h100", 1.0, 8),
                estimator_for("analytical", "h200")):
        assert isinstance(est, LatencyEstimator)
    assert costs.LatencyEstimator is LatencyEstimator, "the scheduler re-exports the interface, not a copy"
    assert costs.estimator_for is estimator_for


def test_claim_slot_runs_one_collective_at_a_time_per_slot():
    in_flight: dict[str, list[float]] = {}
    assert claim_slot(in_flight, "c", 0.0, 10.0, 1) == 0.0
    assert claim_slot(in_flight, "c", 2.0, 5.0, 1) == 10.0, "the second waits for the first"
    assert claim_slot(in_flight, "other", 2.0, 5.0, 1) == 2.0, "another stream is free"
    assert claim_slot(in_flight, "d", 0.0, 10.0, 2) == 0.0
    assert claim_slot(in_flight, "d", 1.0, 10.0, 2) == 1.0, "two slots: both run"


def test_machine_compute_waits_and_collectives():
    m = StreamMachine()
    assert m.compute(3.0, 2.0) == 5.0, "starts when the operands are ready"
    assert m.compute(0.0, 1.0) == 6.0, "then when the stream is free"
    assert m.collective(1.0, 10.0) == 1.0 and m.collective(2.0, 4.0) == 11.0
    assert m.stream_free() == 15.0 and m.end == 15.0
    assert m.wait(15.0) == 15.0 and m.compute_free == 15.0


def test_simulator_and_pipeliner_gate_time_a_chain_alike():
    """The same estimator on the same machine: the simulator runs the body in its order with the synchronous
    all-gather on the compute stream; the gate runs it on the collective stream and hides the loop counter's
    add behind it. Apart from that add, the two give the same time."""
    m = hlo.parse(CHAIN)
    info = analyze_loop(next(i for i in m.entry.instructions if i.opcode == "while"))
    est = AnalyticalLatencyEstimator("h100")
    gate = iteration_time_us(info.body, _Times(est), set(), forward=False)
    sim = simulate(info.body, est).makespan_us
    add = next(i for i in info.body.instructions if i.name == "next")
    assert est.node_cost(add) > 0
    assert gate > 0 and abs(gate + est.node_cost(add) - sim) < 1e-9 * gate


def test_measured_profile_estimator_reads_the_profile(tmp_path):
    from hlopt.cost_model.estimator import MeasuredLatencyEstimator

    m = hlo.parse(CHAIN)
    body = next(i for i in m.entry.instructions if i.opcode == "while").attrs["body"]
    dot = next(i for i in body.instructions if i.opcode == "dot")
    profile = tmp_path / "profile.json"
    profile.write_text('{"y": 123.5}')
    est = MeasuredLatencyEstimator(profile, base="h100")
    assert isinstance(est, LatencyEstimator)
    assert est.node_cost(dot) == 123.5, "the measured time"
    reshape = next(i for i in body.instructions if i.opcode == "reshape")
    assert est.node_cost(reshape) == AnalyticalLatencyEstimator("h100").node_cost(reshape), "the model elsewhere"
