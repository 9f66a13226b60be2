"""collective-pipeliner options beyond one forward/backward run, as XLA's pass has them: `last_run` (marker
custom-calls on what a run moved), `level_to_operate_on` (a later run pipelines marked stores one iteration
further), forward-sink of all-to-all and collective-permute (and SunkByPreviousStep markers), and the
send/recv validation of collective-permutes rewritten on peeled copies. Structure only; the numerics of the
same modules are in tests/test_collective_pipeliner_options_numerics.py. Each test names the XLA test
(xla/service/collective_pipeliner_test.cc) whose outcome it checks on hlopt's own module, where there is one."""

from __future__ import annotations

import pytest
from hlopt.cli.main import main as cli_main
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.passes.collectives.collective_pipeliner import (
    INSERTED_BY_PREVIOUS_STEP,
    SUNK_BY_PREVIOUS_STEP,
    marker_level,
)
from hlopt.passes.framework.pipeline import run_pipeline
from hlopt.passes.framework.registry import PassOptionError, create_pass
from pipeliner_cases import SINK_A2A, SINK_CP, TWO_STAGE, validated_permute

from hlopt import hlo

#: the first run of a two-level pipeline: the reduce-scatter (and its formatting) one iteration later, marked
FIRST = {"direction": "forward", "op": ("reduce-scatter",), "last_run": False}
#: the second run: the all-gather, now stored through a marked index, one iteration further; the last run
SECOND = {"direction": "forward", "op": ("all-gather",), "level_to_operate_on": 1}


def _run(m: Module, **options: object) -> bool:
    changed = create_pass("collective-pipeliner", **options).run(m)
    hlo.verify(m)
    return changed


def _whiles(m: Module) -> list[Instruction]:
    return [i for i in m.entry.instructions if i.opcode == "while"]


def _ops(comp: Computation, opcode: str) -> list[Instruction]:
    return [i for i in comp.instructions if i.opcode == opcode]


def _markers(m: Module, target: str) -> list[Instruction]:
    return [i for c in m.computations for i in c.instructions
            if i.opcode == "custom-call" and i.attrs.get("custom_call_target") == target]


def _reads_state(inst: Instruction, state: Instruction) -> bool:
    return inst.opcode == "get-tuple-element" and inst.operand(0) is state


def test_options_parse_and_are_listed(capsys):
    p = create_pass("collective-pipeliner", level_to_operate_on="1", last_run="false")
    assert p.level_to_operate_on == 1 and p.last_run is False
    assert create_pass("collective-pipeliner").last_run is True  # XLA's default
    with pytest.raises(PassOptionError):
        create_pass("collective-pipeliner", level_to_operate_on="-1")
    m = hlo.parse(TWO_STAGE)
    spec = "collective-pipeliner{direction=forward,op=reduce-scatter,level_to_operate_on=0,last_run=false}"
    assert run_pipeline(m, spec).changed
    assert _markers(m, INSERTED_BY_PREVIOUS_STEP)
    assert cli_main(["passes"]) in (0, None)
    listed = capsys.readouterr().out
    assert "level_to_operate_on=0" in listed and "last_run=True" in listed


def test_a_run_that_is_not_the_last_marks_the_collective_and_the_index():
    """XLA's TransformNegativeIndexIterationToZero (last_run=false): the epilogue's collective is wrapped
    in an InsertedByPreviousStep custom-call of level 1; in the loop the carried store index is too."""
    m = hlo.parse(TWO_STAGE)
    assert _run(m, **FIRST)
    (w,) = _whiles(m)
    body, param = w.attrs["body"], w.attrs["body"].parameter(0)
    # in the loop: ag(marker(rs(previous value))), stored at marker(previous index)
    (dus,) = _ops(body, "dynamic-update-slice")
    index = dus.operand(2)
    assert marker_level(index) == 1 and _reads_state(index.operand(0), param)
    (rs,) = _ops(body, "reduce-scatter")
    (mark,) = rs.users
    assert marker_level(mark) == 1 and mark.users[0].opcode == "all-gather"
    assert str(mark.operand(1).shape) == "s64[]"
    # after the loop: the collective marked, the index not
    (last,) = _ops(m.entry, "reduce-scatter")
    assert marker_level(last.users[0]) == 1 and _reads_state(last.operand(0), w)
    (store,) = _ops(m.entry, "dynamic-update-slice")
    assert _reads_state(store.operand(2), w)


def test_level_one_pipelines_the_marked_store_one_iteration_further():
    """XLA's PushAgOver: after a first run moved the reduce-scatter, a level-1 run moves the all-gather that
    follows it one more iteration; the last run leaves no marker."""
    m = hlo.parse(TWO_STAGE)
    assert _run(m, **FIRST)
    assert _run(m, **SECOND)
    assert not _markers(m, INSERTED_BY_PREVIOUS_STEP)
    (w,) = _whiles(m)
    body, param = w.attrs["body"], w.attrs["body"].parameter(0)
    assert w.backend_config_json()["known_trip_count"] == {"n": "2"}  # two iterations peeled off 4
    # in the loop both collectives work on carried values: the reduce-scatter on the previous iteration's
    # gradient, the all-gather on the reduce-scatter of the one before
    (rs,) = _ops(body, "reduce-scatter")
    (ag,) = _ops(body, "all-gather")
    assert _reads_state(rs.operand(0), param) and _reads_state(ag.operand(0), param)
    assert body.root.operand(_slot_of(body.root, rs)) is rs
    (dus,) = _ops(body, "dynamic-update-slice")
    assert _reads_state(dus.operand(2), param)
    # before the loop: iteration 0's reduce-scatter; after it: the last all-gather of each level
    assert len(_ops(m.entry, "reduce-scatter")) == 2 and len(_ops(m.entry, "all-gather")) == 2


def _slot_of(root: Instruction, value: Instruction) -> int:
    return next(k for k, op in enumerate(root.operands) if op is value)


def test_level_one_needs_a_marked_store():
    """A level above 0 pipelines only stores an earlier run marked: an unmarked module is left alone."""
    m = hlo.parse(TWO_STAGE)
    before = m.to_text()
    assert not _run(m, **SECOND)
    assert m.to_text() == before


def test_the_last_run_removes_markers_whatever_it_moves():
    """XLA's TransformWithAgInsertCustomCall: a level-1 last run over all-reduces (none here) changes the
    module by removing the first run's markers; the all-gather after the loop reads the loop's result."""
    m = hlo.parse(TWO_STAGE)
    assert _run(m, direction="forward", op=("all-gather",), last_run=False)
    assert _markers(m, INSERTED_BY_PREVIOUS_STEP)
    assert _run(m, direction="forward", op=("all-reduce",), level_to_operate_on=1)
    assert not _markers(m, INSERTED_BY_PREVIOUS_STEP)
    (w,) = _whiles(m)
    root = m.entry.root.operand(2)
    assert root.opcode == "dynamic-update-slice" and _reads_state(root.operand(2), w)
    (ag,) = _ops(m.entry, "all-gather")
    assert _reads_state(ag.operand(0), w)


def test_a_level_zero_run_does_not_move_a_marked_store_again():
    """The marked index is not the induction variable (XLA's CheckIndexIsMonotonic fails on it): a level-0
    run leaves the pipelined loop as it is, and, being the last run, only drops the markers."""
    m = hlo.parse(TWO_STAGE)
    _run(m, **FIRST)
    assert _run(m, direction="forward", op=("reduce-scatter", "all-gather"))
    (w,) = _whiles(m)
    assert w.backend_config_json()["known_trip_count"] == {"n": "3"}
    assert not _markers(m, INSERTED_BY_PREVIOUS_STEP)


def test_level_one_respects_process_different_sized_ops():
    """XLA's NoPushAgOverBecauseDifferentSize: the all-gather's operand is smaller than what is stored."""
    m = hlo.parse(TWO_STAGE)
    _run(m, **FIRST)
    before = m.to_text()
    assert not _run(m, **{**SECOND, "process_different_sized_ops": False, "last_run": False})
    assert m.to_text() == before


def test_forward_sink_of_a_collective_permute_then_its_all_reduce():
    """Forward-sink of a collective-permute (XLA clones it onto the stack unchanged); not being the last run,
    the stacked operand passes through a SunkByPreviousStep marker, which the next sink of the loop drops
    as it sinks the all-reduce feeding it."""
    m = hlo.parse(SINK_CP)
    assert _run(m, direction="forward-sink", op=("collective-permute",), last_run=False)
    (w,) = _whiles(m)
    body = w.attrs["body"]
    (mark,) = _markers(m, SUNK_BY_PREVIOUS_STEP)
    assert mark.parent is body and mark.users[0].opcode == "dynamic-update-slice"
    assert mark.operand(0).operand(0).opcode == "all-reduce"
    (cp,) = _ops(m.entry, "collective-permute")
    assert str(cp.shape) == "f32[4,8]" and _reads_state(cp.operand(0), w)
    assert cp.attrs["source_target_pairs"] == ((0, 1), (1, 2), (2, 3), (3, 0))
    assert _run(m, direction="forward-sink", op=("all-reduce",))
    assert not _markers(m, SUNK_BY_PREVIOUS_STEP)
    (w,) = _whiles(m)
    assert not [i for i in w.attrs["body"].instructions if i.opcode in ("all-reduce", "collective-permute")]
    (ar,) = _ops(m.entry, "all-reduce")
    assert str(ar.shape) == "f32[4,8]" and ar.users[0].opcode == "reshape"


def test_forward_sink_of_an_all_to_all_splits_one_dimension_further():
    m = hlo.parse(SINK_A2A)
    assert _run(m, direction="forward-sink", op=("all-to-all",))
    (w,) = _whiles(m)
    assert not _ops(w.attrs["body"], "all-to-all")
    (a2a,) = _ops(m.entry, "all-to-all")
    assert str(a2a.shape) == "f32[4,4,2]" and a2a.attrs["dimensions"] == (1,)
    # the loop stored slice N-1-i: the stack is filled at the same index, so no reverse is needed after it
    (stack_dus,) = [d for d in _ops(w.attrs["body"], "dynamic-update-slice") if d.operand(1).opcode == "reshape"]
    assert stack_dus.operand(2).opcode != "get-tuple-element" and not _ops(m.entry, "reverse")


def test_forward_sink_leaves_a_permute_limited_to_some_iterations():
    """A collective-permute with `_xla_send_recv_validation` runs its pairs only in some iterations: one
    permute over the stack cannot say which slices to send."""
    text = SINK_CP.replace("{3,0}}", '{3,0}}, frontend_attributes={_xla_send_recv_validation="{{0,3},{0,3},{0,3},{0,3}}"}')
    m = hlo.parse(text)
    assert not _run(m, direction="forward-sink", op=("collective-permute",))


def _validation(inst: Instruction) -> str:
    return inst.frontend_attributes["_xla_send_recv_validation"]


def test_forward_peeling_rewrites_send_recv_validation():
    """XLA's TransformIncrementIndexByOneCollectivePermute: the permute peeled into iteration 0 keeps the
    pairs valid in iteration 0 ({0,0}, else {1,0}); the loop's copy sees every iteration one earlier."""
    m = hlo.parse(validated_permute("fwd_cp", "{{0,3},{1,4},{2,5},{3,6}}", "forward"))
    assert _run(m, direction="forward", op=("reduce-scatter",))
    (w,) = _whiles(m)
    (peeled,) = _ops(m.entry, "collective-permute")
    (inner,) = _ops(w.attrs["body"], "collective-permute")
    assert _validation(peeled) == "{{0,0},{1,0},{1,0},{1,0}}"
    assert _validation(inner) == "{{0,2},{0,3},{1,4},{2,5}}"


def test_backward_peeling_rewrites_send_recv_validation():
    """XLA's UpdateSendRecvValidation, backward case: the permute peeled after the loop keeps the pairs valid
    in the last iteration N-1 ({0,0}, else {1,0}); the loop's copy stops before it ({a,min(N-2,b)})."""
    m = hlo.parse(validated_permute("bwd_cp", "{{0,7},{1,6},{2,7},{0,3}}", "backward"))
    assert _run(m, direction="backward", op=("all-gather",))
    (w,) = _whiles(m)
    (peeled,) = _ops(m.entry, "collective-permute")
    (inner,) = _ops(w.attrs["body"], "collective-permute")
    assert _validation(peeled) == "{{0,0},{1,0},{0,0},{1,0}}"
    assert _validation(inner) == "{{0,6},{1,6},{2,6},{0,3}}"


def test_an_unreadable_validation_leaves_the_loop_alone():
    m = hlo.parse(validated_permute("bad_cp", "{{0,7},{1}}", "forward"))
    assert not _run(m, direction="forward", op=("reduce-scatter",))
