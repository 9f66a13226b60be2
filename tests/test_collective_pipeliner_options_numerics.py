"""collective-pipeliner options, numerics: the modules of tests/test_collective_pipeliner_options.py before
and after (every run sequence ending in a last run, as a module must before a backend sees it) on XLA:CPU
with the same inputs, and multi-level pipelining of an 8-device FSDP training step."""

from __future__ import annotations

import pytest
from hlopt.hlo.ir import Module
from hlopt.passes.framework.registry import create_pass
from pipeliner_cases import SINK_A2A, SINK_CP, TWO_STAGE, TWO_STAGE_8, validated_permute

from hlopt import hlo, runtime

FIRST = {"direction": "forward", "op": ("reduce-scatter",), "last_run": False}
SECOND = {"direction": "forward", "op": ("all-gather",), "level_to_operate_on": 1}

RUNS = [
    ("two_levels", TWO_STAGE, [FIRST, SECOND]),
    ("two_levels_8_devices", TWO_STAGE_8, [FIRST, SECOND]),
    ("markers_dropped_by_a_later_last_run", TWO_STAGE,
     [{"direction": "forward", "op": ("all-gather",), "last_run": False},
      {"direction": "forward", "op": ("all-reduce",), "level_to_operate_on": 1}]),
    ("sink_permute_then_all_reduce", SINK_CP,
     [{"direction": "forward-sink", "op": ("collective-permute",), "last_run": False},
      {"direction": "forward-sink", "op": ("all-reduce",)}]),
    ("sink_all_to_all", SINK_A2A, [{"direction": "forward-sink", "op": ("all-to-all",)}]),
    ("forward_peel_with_validated_permute", validated_permute("fwd_cp", "{{0,3},{1,4},{2,5},{3,6}}", "forward"),
     [{"direction": "forward", "op": ("reduce-scatter",)}]),
    ("backward_peel_with_validated_permute", validated_permute("bwd_cp", "{{0,7},{1,6},{2,7},{0,3}}", "backward"),
     [{"direction": "backward", "op": ("all-gather",)}]),
]


def _pipelined(text: str, runs: list[dict]) -> tuple[Module, Module]:
    before = hlo.parse(text)
    after = before.clone()
    for options in runs:
        assert create_pass("collective-pipeliner", **options).run(after), options
        hlo.verify(after)
    return before, after


@pytest.mark.parametrize("name,text,runs", RUNS, ids=[r[0] for r in RUNS])
def test_runs_match(name, text, runs):
    before, after = _pipelined(text, runs)
    assert "InsertedByPreviousStep" not in after.to_text() and "SunkByPreviousStep" not in after.to_text()
    result = runtime.run_and_compare(before, after, rtol=1e-5, atol=1e-5)
    assert result.ok, str(result)


@pytest.mark.slow
def test_fsdp_scan_gradients_reduce_scattered_two_iterations_later():
    """An 8-device FSDP step (tests/test_collective_pipeliner_numerics.py): the backward scan's
    reduce-scatters pipelined at level 0 (marked, not the last run), then the marked ones once more at
    level 1: each gradient is reduce-scattered two layers after it is computed."""
    from hlopt.passes.framework.pipeline import run_pipeline
    from test_collective_pipeliner_numerics import _captured

    captured = _captured("fsdp_scan")
    m = captured.clone()
    run_pipeline(m, "call-inliner,simplify")
    first = "collective-pipeliner{direction=forward,op=reduce-scatter,last_run=false}"
    second = "collective-pipeliner{direction=forward,op=reduce-scatter,level_to_operate_on=1}"
    assert run_pipeline(m, first, paranoid=True).changed
    assert "InsertedByPreviousStep" in m.to_text()
    peeled_once = _reduce_scatters_outside_loops(m)
    assert run_pipeline(m, second, paranoid=True).changed
    assert "InsertedByPreviousStep" not in m.to_text()
    assert _reduce_scatters_outside_loops(m) > peeled_once  # the second level peeled more copies
    comparison = runtime.run_and_compare(captured, m, rtol=1e-4, atol=1e-5)
    assert comparison.ok, str(comparison)


def _reduce_scatters_outside_loops(m: Module) -> int:
    bodies = {i.attrs["body"] for i in m.instructions() if i.opcode == "while"}
    return sum(1 for c in m.computations if c not in bodies for i in c.instructions if i.opcode == "reduce-scatter")
