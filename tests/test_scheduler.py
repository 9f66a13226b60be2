"""Latency-hiding scheduler: XLA's expected placements, heuristics, limits, memory, simulation."""

from __future__ import annotations

from pathlib import Path

import pytest
from hlopt.passes.framework.pipeline import run_pipeline
from hlopt.scheduler.costs import ApproximateLatencyEstimator
from hlopt.scheduler.heuristics import HEURISTICS, Heuristic, get_heuristic, register_heuristic
from hlopt.scheduler.latency_hiding_scheduler import LatencyHidingScheduler
from hlopt.scheduler.simulator import simulate
from hlopt.scheduler.synthetic import PATTERNS, synthetic_module

from hlopt import hlo

CASES = Path(__file__).resolve().parents[2] / "shared" / "xla_cases" / "latency_hiding_scheduler"
#: XLA's scheduler tests run its generic AsyncTracker: one resource per collective type.
XLA_CONFIG = ("async-collective-creator,latency-hiding-scheduler{estimator=approximate,collective_permute_overlap_limit=5,"
              "stream_model=per-type}")


def _names(comp: hlo.Computation) -> list[str]:
    return [i.name for i in comp.instructions]


def _index_by_op_name(comp: hlo.Computation, opcode: str, op_name: str) -> int:
    for i, inst in enumerate(comp.instructions):
        if inst.opcode == opcode and inst.metadata is not None and inst.metadata.op_name == op_name:
            return i
    raise KeyError((opcode, op_name))


def _case(name: str) -> hlo.Module:
    path = CASES / name
    if not path.exists():
        pytest.skip("shared/xla_cases not present")
    module = hlo.parse_file(path)
    run_pipeline(module, XLA_CONFIG, verify_each=False)
    return module


def test_xla_all_gather_async_simple():
    m = _case("AllGatherAsyncSimple.hlo")
    seq = _names(m.entry)
    assert _index_by_op_name(m.entry, "all-gather-done", "ag0") == seq.index("a2") - 1


def test_xla_all_gather_async_balance():
    m = _case("AllGatherAsyncBalance.hlo")
    e = m.entry
    seq = _names(e)
    for ag, conv in (("ag0", "c0"), ("ag1", "c1")):
        start = _index_by_op_name(e, "all-gather-start", ag)
        done = _index_by_op_name(e, "all-gather-done", ag)
        assert start < seq.index(conv) < done, (ag, conv, seq)


def test_xla_two_collective_permute_types_overlap():
    m = _case("TwoCollectivePermuteTypesOverlap.hlo")
    before = hlo.parse_file(CASES / "TwoCollectivePermuteTypesOverlap.hlo").entry
    e = m.entry
    seq = _names(e)
    assert len(seq) == len(before.instructions) + 6
    for cps, conv in ((("cp0", "cp2", "cp4"), "c0"), (("cp1", "cp3", "cp5"), "c1")):
        for cp in cps:
            start = _index_by_op_name(e, "collective-permute-start", cp)
            done = _index_by_op_name(e, "collective-permute-done", cp)
            assert start < seq.index(conv) < done, (cp, conv, seq)


def test_xla_while_loop_aliasing_bug():
    m = _case("WhileLoopAliasingBug.hlo")
    body = m.computation("while_body")
    seq = _names(body)
    start = next(i for i, inst in enumerate(body.instructions)
                 if inst.opcode == "collective-permute-start" and inst.operand(0).opcode.endswith("done"))
    assert start > seq.index("add0")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_synthetic_schedules_reach_lower_bound_and_beat_original(pattern):
    base = synthetic_module(6, pattern, hidden=256, batch=256)
    run_pipeline(base, "async-collective-creator")
    est = ApproximateLatencyEstimator()
    original = simulate(base.entry, est)
    scheduled = base.clone()
    run_pipeline(scheduled, "latency-hiding-scheduler{estimator=approximate}")
    assert scheduled.is_scheduled
    result = simulate(scheduled.entry, est)
    assert result.makespan_us <= original.makespan_us
    assert result.makespan_us <= 1.05 * result.lower_bound_us
    hlo.verify(scheduled)


def test_original_order_heuristic_is_identity():
    m = synthetic_module(4, "mixed", hidden=128, batch=128)
    run_pipeline(m, "async-collective-creator")
    before = _names(m.entry)
    run_pipeline(m, "latency-hiding-scheduler{estimator=approximate,heuristic=original-order}")
    assert _names(m.entry) == before


def test_overlap_limit_is_respected():
    m = synthetic_module(6, "data-parallel", hidden=128, batch=128)
    run_pipeline(m, "async-collective-creator,latency-hiding-scheduler{estimator=approximate,overlap_limit=2}")
    in_flight = peak = 0
    for inst in m.entry.instructions:
        if inst.opcode == "all-reduce-start":
            in_flight += 1
            peak = max(peak, in_flight)
        elif inst.opcode == "all-reduce-done":
            in_flight -= 1
    assert peak == 2


def test_memory_limit_reduces_peak():
    m = synthetic_module(8, "fsdp", hidden=256, batch=256)
    run_pipeline(m, "async-collective-creator")
    est = ApproximateLatencyEstimator()
    free = m.clone()
    run_pipeline(free, "latency-hiding-scheduler{estimator=approximate,heuristic=start-delay,overlap_limit=4}")
    unconstrained = simulate(free.entry, est).peak_memory_bytes
    tight = m.clone()
    run_pipeline(tight, "latency-hiding-scheduler{estimator=approximate,heuristic=start-delay,overlap_limit=4,"
                        f"memory_limit={unconstrained // 2}}}")
    assert simulate(tight.entry, est).peak_memory_bytes <= unconstrained


def test_user_heuristic_plugs_in():
    @register_heuristic
    class Reverse(Heuristic):
        name = "test-latest-first"

        def priority(self, node, state):
            return (-node.index,)

    assert "test-latest-first" in HEURISTICS
    m = synthetic_module(2, "data-parallel", hidden=64, batch=64)
    run_pipeline(m, "async-collective-creator,latency-hiding-scheduler{estimator=approximate,heuristic=test-latest-first}")
    hlo.verify(m)
    with pytest.raises(ValueError, match="unknown scheduling heuristic"):
        get_heuristic("nope")


def test_scheduled_module_round_trips_through_xla_parser():
    xla = pytest.importorskip("jaxlib._hlo")
    m = synthetic_module(3, "mixed", hidden=64, batch=64)
    run_pipeline(m, "async-collective-creator,latency-hiding-scheduler{estimator=approximate,control_deps=true}")
    text = m.to_text()
    assert "is_scheduled=true" in text
    reparsed = xla.hlo_module_from_text(text)
    assert "is_scheduled=true" in reparsed.to_string()


def test_lhs_pass_options_in_spec():
    p = LatencyHidingScheduler(heuristic="start-delay", overlap_limit=3)
    assert p.describe() == "latency-hiding-scheduler{heuristic=start-delay,overlap_limit=3}"


@pytest.mark.parametrize("name", ["shmap_psum_in_scan", "shmap_all_gather", "shmap_psum_scatter", "shmap_ppermute",
                                  "shmap_all_to_all", "shmap_grad_accumulation", "transformer_train_step"])
def test_scheduled_corpus_modules_run_the_same(name):
    from hlopt.corpus.programs import corpus_texts

    from hlopt import runtime

    for entry in (e for e in corpus_texts() if e.id in (name, name + ".opt")):
        before = hlo.parse(entry.text)
        after = before.clone()
        run_pipeline(after, "async-collective-creator,latency-hiding-scheduler{heuristic=start-delay,overlap_limit=2}")
        assert after.is_scheduled
        result = runtime.run_and_compare(before, after, rtol=1e-5, atol=1e-5)
        assert result.ok, (entry.id, str(result))
