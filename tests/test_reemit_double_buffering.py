"""hlopt compile's step 2 asks XLA to double-buffer the loops that hold a collective (runtime.xla_gpu_path.reemit
`loop_double_buffering_flags`); the compile itself is rated in benchmarks/pipeline_vs_xla.py."""

from __future__ import annotations

from hlopt.runtime.xla_gpu_path.reemit import (
    LOOP_DOUBLE_BUFFERING_FLAG,
    loop_double_buffering_flags,
    loops_with_collectives,
)
from pipeliner_cases import BACKWARD_AG, loop

from hlopt import hlo

#: a loop without a collective (a counter and an add)
PLAIN = loop("plain", ["f32[8]"], "  %y = f32[8] add(%v1, %v1)", ["%y"])


def test_a_loop_holding_a_collective_is_double_buffered():
    m = hlo.parse(BACKWARD_AG)
    assert [w.opcode for w in loops_with_collectives(m)] == ["while"]
    assert loop_double_buffering_flags(m) == LOOP_DOUBLE_BUFFERING_FLAG
    assert loop_double_buffering_flags(m, "--xla_gpu_x=1") == f"--xla_gpu_x=1 {LOOP_DOUBLE_BUFFERING_FLAG}"


def test_no_flag_without_a_collective_in_a_loop_or_where_the_caller_chose():
    assert loops_with_collectives(hlo.parse(PLAIN)) == []
    assert loop_double_buffering_flags(hlo.parse(PLAIN), "--a=1") == "--a=1"
    chosen = "--xla_gpu_enable_while_loop_double_buffering=false"
    assert loop_double_buffering_flags(hlo.parse(BACKWARD_AG), chosen) == chosen
    unrolling = "--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_NO_UNROLL"
    assert loop_double_buffering_flags(hlo.parse(BACKWARD_AG), unrolling) == unrolling
