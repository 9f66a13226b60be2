"""collective-pipeliner numerics: every rewrite runs before and after on XLA:CPU with the same inputs.

Small modules of every form (tests/pipeliner_cases.py, 4 replicas), and shard_map training steps on 8 devices
written as users write them (corpus/pipeline_programs.py): FSDP over a scanned layer stack (all-gathered
weights in the forward scan, reduce-scattered gradients in the backward scan, through jax.grad), data-parallel
scans with all-reduced gradients, both under jax.checkpoint (optimization barriers in the loop bodies), and
gradient accumulation. Programs are captured, inlined and simplified (`call-inliner,simplify`, what XLA's
pipeliner sees) and pipelined in each direction."""

from __future__ import annotations

import pytest
from hlopt.hlo.ir import Module
from hlopt.passes.framework.pipeline import run_pipeline
from hlopt.passes.framework.registry import create_pass
from pipeliner_cases import PIPELINED

from hlopt import hlo, runtime

#: small sizes: the loops and collectives of the benchmark programs at a fraction of the compile time
SIZES = {"layers": 3, "d": 16, "d_ff": 32, "batch": 1, "seq": 4, "heads": 2}
FORWARD = "collective-pipeliner{direction=forward,op=all-reduce:reduce-scatter}"
BACKWARD = "collective-pipeliner{direction=backward,op=all-gather}"
SINK = "collective-pipeliner{direction=forward-sink,op=all-reduce}"


@pytest.mark.parametrize("name,text,options", PIPELINED, ids=[c[0] for c in PIPELINED])
def test_small_modules_match(name, text, options):
    before = hlo.parse(text)
    after = before.clone()
    assert create_pass("collective-pipeliner", **options).run(after)
    hlo.verify(after)
    result = runtime.run_and_compare(before, after, rtol=1e-5, atol=1e-5)
    assert result.ok, str(result)


def _distinct_channel_ids(m: Module) -> None:
    """jax gives every collective of a shard_map channel_id=1; hlopt's verifier (XLA's VerifyChannels as of
    the version it follows) refuses one id on different collective kinds, so the captured module gets one
    id per collective before any pass runs (ids only pair collectives across programs; one SPMD program)."""
    n = 0
    for inst in m.instructions():
        if isinstance(inst.attrs.get("channel_id"), int):
            n += 1
            inst.attrs["channel_id"] = n


def _captured(program: str) -> Module:
    from hlopt.corpus.pipeline_programs import build

    sizes = dict(SIZES)
    if program == "grad_accum":
        sizes.pop("layers")
        sizes["microbatches"] = 3
    fn, args = build(program, **sizes)
    m = runtime.capture(fn, *args)
    _distinct_channel_ids(m)
    return m


def _collectives_in_loops(m: Module, opcode: str) -> int:
    bodies = {i.attrs["body"] for i in m.instructions() if i.opcode == "while"}
    return sum(1 for b in bodies for i in b.instructions if i.opcode == opcode)


def _pipelined(program: str, specs: list[str], expect: dict[str, bool]) -> None:
    """Pipeline `program` with each spec in turn (`expect[spec]`: whether it must change the module), then
    compare the result with the captured module on XLA:CPU."""
    captured = _captured(program)
    m = captured.clone()
    run_pipeline(m, "call-inliner,simplify")
    for spec in specs:
        result = run_pipeline(m, spec, paranoid=True)
        assert result.changed == expect[spec], f"{program}: {spec} changed={result.changed}"
    comparison = runtime.run_and_compare(captured, m, rtol=1e-4, atol=1e-5)
    assert comparison.ok, str(comparison)


def test_fsdp_scan_both_directions():
    """All-gathers prefetched in the forward scan, reduce-scatters delayed in the backward scan."""
    _pipelined("fsdp_scan", [BACKWARD, FORWARD], {BACKWARD: True, FORWARD: True})


def test_dp_scan_remat_all_reduce():
    """Gradient all-reduces of a rematerialized data-parallel scan (barriers in the backward body)."""
    _pipelined("dp_scan_remat", [FORWARD], {FORWARD: True})


def test_grad_accum_is_left_to_code_motion():
    """Accumulated (not stored) all-reduces are not the pipeliner's: XLA leaves them too."""
    m = _captured("grad_accum")
    run_pipeline(m, "call-inliner,simplify")
    before = m.to_text()
    for spec in (FORWARD, BACKWARD, SINK):
        assert not run_pipeline(m, spec).changed
    assert m.to_text() == before


@pytest.mark.slow
@pytest.mark.parametrize("program,spec,changes", [
    ("fsdp_scan", FORWARD, True),
    ("fsdp_scan", BACKWARD, True),
    ("fsdp_scan_remat", BACKWARD, True),
    ("fsdp_scan_remat", FORWARD, True),
    ("dp_scan", FORWARD, True),
    ("dp_scan", SINK, True),
    ("dp_scan_remat", SINK, True),
])
def test_programs_each_direction(program, spec, changes):
    _pipelined(program, [spec], {spec: changes})


@pytest.mark.slow
def test_fsdp_scan_remat_moves_collectives_out_of_the_loop_bodies():
    """Structure on a real program: after both directions, the loops hold one copy of each collective and
    the first all-gathers and last reduce-scatters run outside them."""
    captured = _captured("fsdp_scan_remat")
    m = captured.clone()
    run_pipeline(m, "call-inliner,simplify")
    ag_before = _collectives_in_loops(m, "all-gather")
    run_pipeline(m, f"{BACKWARD},{FORWARD}")
    outside = [i for c in m.computations for i in c.instructions
               if i.opcode in ("all-gather", "reduce-scatter")
               and not any(w.attrs["body"] is c for w in m.instructions() if w.opcode == "while")]
    assert _collectives_in_loops(m, "all-gather") == ag_before
    assert {i.opcode for i in outside} == {"all-gather", "reduce-scatter"}
    comparison = runtime.run_and_compare(captured, m, rtol=1e-4, atol=1e-5)
    assert comparison.ok, str(comparison)


def test_fsdp_scan_remat_through_the_whole_default_pipeline():
    """Every move the pipeliner would make (cost model off), then fusion and the scheduler, still computes
    what the captured program computes."""
    from hlopt.passes.framework.pipeline import NAMED_PIPELINES

    captured = _captured("fsdp_scan_remat")
    m = captured.clone()
    result = run_pipeline(m, NAMED_PIPELINES["default"].replace(",cost_model=h100", ""))
    assert sum(r.changed for r in result.records if r.name.startswith("collective-pipeliner")) == 2
    comparison = runtime.run_and_compare(captured, m, rtol=1e-4, atol=1e-5)
    assert comparison.ok, str(comparison)
