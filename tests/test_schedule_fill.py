"""fill_exposed_windows / keep_input_if_faster: options of latency-hiding-scheduler beside XLA's rules."""

from __future__ import annotations

import pytest

from scheduler.cli import schedule_module
from scheduler.synthetic import synthetic_module


def _valid(module) -> bool:
    for comp in module.computations:
        seen = set()
        for inst in comp.instructions:
            if any(op in comp.instructions and op not in seen for op in inst.operands):
                return False
            seen.add(inst)
    return True


@pytest.mark.parametrize("source", [("fsdp", 4.0), ("mixed", 1.0)])
def test_fill_closes_prologue_window(source: tuple[str, float]) -> None:
    pattern, ratio = source
    plain = schedule_module(synthetic_module(8, pattern, comm_ratio=ratio), "start-delay", "h100", "analytical", 1)
    module = synthetic_module(8, pattern, comm_ratio=ratio)
    filled = schedule_module(module, "start-delay+fill", "h100", "analytical", 1)
    assert _valid(module)
    assert filled["makespan_us"] <= plain["makespan_us"]
    assert filled["makespan_us"] <= 1.05 * filled["lower_bound_us"]
    assert filled["lower_bound_us"] == pytest.approx(plain["lower_bound_us"])


def test_keep_never_slower_than_input() -> None:
    module = synthetic_module(4, "fsdp", comm_ratio=2.0)
    first = schedule_module(module, "start-delay+fill", "h100", "analytical", 1)
    plain = schedule_module(synthetic_module(4, "fsdp", comm_ratio=2.0), "critical-path", "h100", "analytical", 1)
    kept = schedule_module(module, "critical-path+keep", "h100", "analytical", 1, make_async=False)
    assert first["makespan_us"] < plain["makespan_us"]  # critical-path alone would be slower here
    assert kept["makespan_us"] <= first["makespan_us"] + 1e-6


@pytest.mark.parametrize("pattern", ["fsdp", "mixed", "data-parallel", "pipeline"])
def test_lower_bound_is_valid(pattern: str) -> None:
    for heuristic in ("original-order", "xla-default", "critical-path", "start-delay+fill"):
        s = schedule_module(synthetic_module(4, pattern, comm_ratio=2.0), heuristic, "h100", "analytical", 1)
        for c in s["computations"].values():
            assert c["basic_lower_bound_us"] <= c["lower_bound_us"] <= c["makespan_us"] + 1e-6
            assert c["release_tail_bound_us"] == c["lower_bound_us"]


@pytest.mark.parametrize("factor", [1.0, 1.5, 2.0])
def test_fill_respects_memory_limit(factor: float) -> None:
    """Unlimited, fill raises fsdp:8:4's peak well above 2x; under a limit it stays within it."""
    plain = schedule_module(synthetic_module(8, "fsdp", comm_ratio=4.0), "start-delay", "h100", "analytical", 1)
    free = schedule_module(synthetic_module(8, "fsdp", comm_ratio=4.0), "start-delay+fill", "h100", "analytical", 1)
    assert free["peak_memory_bytes"] > 2.0 * plain["peak_memory_bytes"]
    limit = int(factor * plain["peak_memory_bytes"])
    unfilled = schedule_module(synthetic_module(8, "fsdp", comm_ratio=4.0), "start-delay", "h100", "analytical", 1,
                               limit)
    module = synthetic_module(8, "fsdp", comm_ratio=4.0)
    filled = schedule_module(module, "start-delay+fill", "h100", "analytical", 1, limit)
    assert _valid(module)
    assert filled["peak_memory_bytes"] <= max(limit, unfilled["peak_memory_bytes"])
    assert filled["makespan_us"] < unfilled["makespan_us"]


def test_timeline_matches_simulator() -> None:
    from passes.pipeline import run_pipeline
    from scheduler.costs import estimator_for
    from scheduler.fill import Timeline
    from scheduler.simulator import simulate

    module = synthetic_module(4, "mixed", comm_ratio=2.0)
    run_pipeline(module, "async-collective-creator")
    est = estimator_for("analytical")
    for limits in ({"default": 1}, {"default": 2}):
        order = list(module.entry.instructions)
        assert Timeline(module.entry, est, limits).makespan(order) == pytest.approx(
            simulate(module.entry, est, order, limits).makespan_us)
        filled = schedule_module(synthetic_module(4, "mixed", comm_ratio=2.0), "xla-default+fill", "h100",
                                 "analytical", limits["default"])
        assert filled["makespan_us"] >= filled["lower_bound_us"] - 1e-6


@pytest.mark.parametrize("name", ["shmap_grad_accumulation", "transformer_train_step"])
def test_filled_corpus_modules_run_the_same(name: str) -> None:
    """fill and keep only reorder: the scheduled modules compute the same numbers on XLA CPU."""
    from corpus import corpus_texts

    import hlo
    import runtime
    from passes.pipeline import run_pipeline

    entries = [e for e in corpus_texts() if e.id in (name, name + ".opt")]
    assert entries
    for entry in entries:
        before = hlo.parse(entry.text)
        after = before.clone()
        run_pipeline(after, "async-collective-creator,latency-hiding-scheduler{heuristic=start-delay,"
                            "overlap_limit=2,fill_windows=true,keep_input_if_faster=true}")
        assert after.is_scheduled and _valid(after)
        result = runtime.run_and_compare(before, after, rtol=1e-5, atol=1e-5)
        assert result.ok, (entry.id, str(result))
