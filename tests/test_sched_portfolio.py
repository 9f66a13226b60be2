"""The pass's defaults beyond XLA's rules: alternative list schedules and the fill are never slower than the
heuristic's list schedule alone (`+alone`); they stay within XLA's scheduler memory limit for the device,
and with `+samepeak` within the list schedule's own peak."""

from __future__ import annotations

import pytest
from hlopt.cli.schedule import schedule_module
from hlopt.scheduler.latency_hiding_scheduler import ScheduleOptions, scheduler_memory_limit
from hlopt.scheduler.synthetic import synthetic_module


@pytest.mark.parametrize("pattern,ratio", [("fsdp", 4.0), ("fsdp", 1.0), ("mixed", 1.0), ("data-parallel", 1.0),
                                           ("pipeline", 1.0)])
@pytest.mark.parametrize("heuristic", ["xla-default", "start-delay"])
def test_defaults_never_slower_nor_bigger(pattern: str, ratio: float, heuristic: str) -> None:
    alone = schedule_module(synthetic_module(8, pattern, comm_ratio=ratio), heuristic + "+alone", "h100",
                            "analytical", 1)
    module = synthetic_module(8, pattern, comm_ratio=ratio)
    default = schedule_module(module, heuristic, "h100", "analytical", 1)
    same_peak = schedule_module(synthetic_module(8, pattern, comm_ratio=ratio), heuristic + "+samepeak", "h100",
                                "analytical", 1)
    for result in (default, same_peak):
        assert result["makespan_us"] <= alone["makespan_us"] + 1e-6
        assert result["makespan_us"] >= result["lower_bound_us"] - 1e-6
    assert default["makespan_us"] <= same_peak["makespan_us"] + 1e-6
    assert same_peak["peak_memory_bytes"] <= alone["peak_memory_bytes"]
    assert default["peak_memory_bytes"] <= scheduler_memory_limit(module, "h100")


def test_defaults_help_where_the_list_schedule_leaves_windows() -> None:
    alone = schedule_module(synthetic_module(8, "mixed"), "xla-default+alone", "h100", "analytical", 1)
    default = schedule_module(synthetic_module(8, "mixed"), "xla-default", "h100", "analytical", 1)
    assert default["makespan_us"] < 0.98 * alone["makespan_us"]
    assert default["makespan_us"] <= 1.03 * default["lower_bound_us"]
    assert alone["makespan_us"] > 1.04 * alone["lower_bound_us"]


def test_option_suffixes() -> None:
    base, options = ScheduleOptions.parse("start-delay+fill+keep+keepsync")
    assert base == "start-delay" and options.fill_windows and options.keep_input_if_faster
    assert not options.redecide_sync and options.alternatives == ("critical-path",)
    _, alone = ScheduleOptions.parse("xla-default+alone")
    assert alone.alternatives == () and not alone.fill_within_memory
    assert ScheduleOptions.parse("critical-path")[1].alternatives == ()
    with pytest.raises(ValueError, match="unknown heuristic option"):
        ScheduleOptions.parse("xla-default+nope")
