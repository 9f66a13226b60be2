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
def test_release_tail_bound_is_valid(pattern: str) -> None:
    for heuristic in ("original-order", "xla-default", "critical-path", "start-delay+fill"):
        s = schedule_module(synthetic_module(4, pattern, comm_ratio=2.0), heuristic, "h100", "analytical", 1)
        for c in s["computations"].values():
            assert c["lower_bound_us"] <= c["release_tail_bound_us"] <= c["makespan_us"] + 1e-6
