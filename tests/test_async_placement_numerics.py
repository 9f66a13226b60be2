"""Numerics of the async placement rules (structure in test_async_placement.py): the scheduled modules compute what
the unscheduled ones do, on 8 CPU devices; a pipelined data-parallel scan keeps its gradient all-reduce's window
as wide as the loop body."""

from __future__ import annotations

import pytest
from hlopt.passes.framework.pipeline import run_pipeline
from test_async_placement import chained_all_reduces, one_all_reduce, two_all_reduces

from hlopt import hlo, runtime

SCHEDULE = "async-collective-creator,latency-hiding-scheduler"


@pytest.mark.parametrize("build", [one_all_reduce, two_all_reduces, chained_all_reduces])
def test_scheduled_modules_compute_the_same(build):
    before = hlo.parse(build(64))
    after = before.clone()
    run_pipeline(after, SCHEDULE)
    order = [i.name for i in after.entry.instructions]
    first_start = min(i for i, n in enumerate(order) if n.endswith("-start"))
    assert first_start < order.index("d1")
    result = runtime.run_and_compare(before, after, rtol=1e-5, atol=1e-5)
    assert result.ok, str(result)


def test_pipelined_dp_scan_starts_its_all_reduce_at_the_top_of_the_body():
    """A data-parallel scan (corpus/pipeline_programs.py, small sizes) with its gradient all-reduce
    pipelined across iterations: in the loop body the all-reduce needs only the loop's parameter, so it is
    issued before any compute and waited for only where its value is read or the next collective needs the
    stream (the gradients' all-reduces are not combined here: XLA's combiners run later); the program computes
    the same."""
    from hlopt.corpus.pipeline_programs import build
    from hlopt.scheduler.async_ops import is_async_done, is_async_start

    fn, args = build("dp_scan", layers=3, d=16, d_ff=32, batch=1, seq=4, heads=2)
    captured = runtime.capture(fn, *args)
    for n, inst in enumerate(i for i in captured.instructions() if "channel_id" in i.attrs):
        inst.attrs["channel_id"] = n + 1  # one id per collective (see test_collective_pipeliner_numerics)
    m = captured.clone()
    run_pipeline(m, "call-inliner,simplify,collective-pipeliner{direction=forward,op=all-reduce},simplify,"
                    + SCHEDULE)
    bodies = [w.attrs["body"] for w in m.instructions() if w.opcode == "while"]
    with_start = [b for b in bodies if any(is_async_start(i) for i in b.instructions)]
    assert with_start
    for body in with_start:
        order = list(body.instructions)
        asyncs = [p for p, i in enumerate(order) if is_async_start(i) or is_async_done(i)]
        heavy = [p for p, i in enumerate(order) if i.opcode in ("dot", "fusion", "convolution")]
        assert asyncs[0] < min(heavy), [i.name for i in order[:asyncs[0] + 1]]
        for p in asyncs:  # one collective stream: a done waits right before its first user or the next start
            if is_async_done(order[p]):
                users = [q for q, i in enumerate(order) if order[p] in i.operands]
                assert p == min([*users, *(q for q in asyncs if q > p)]) - 1, order[p].name
    result = runtime.run_and_compare(captured, m, rtol=1e-4, atol=1e-5)
    assert result.ok, str(result)
