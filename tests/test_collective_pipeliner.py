"""collective-pipeliner structure tests on small modules (tests/pipeliner_cases.py): which collectives move,
the peeled prologue / epilogue, the new loop state and condition; modules it must leave alone. Numerics
(before and after on XLA:CPU) are in tests/test_collective_pipeliner_numerics.py."""

from __future__ import annotations

import pytest
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.passes.collectives.collective_pipeliner import CollectivePipeliner
from hlopt.passes.framework.pipeline import run_pipeline
from hlopt.passes.framework.registry import PassOptionError, create_pass, registered_passes
from pipeliner_cases import (
    BACKWARD_AG,
    BACKWARD_BARRIER,
    FORWARD_ANNOTATED,
    FORWARD_AR,
    FORWARD_JAX_INDEX,
    FORWARD_RS,
    FORWARD_RS_TRIP2,
    LEFT_ALONE,
    PIPELINED,
    SINK_AR,
    SINK_CHAIN,
    loop,
)

from hlopt import hlo


def _run(text: str, **options: object) -> tuple[Module, bool]:
    m = hlo.parse(text)
    changed = create_pass("collective-pipeliner", **options).run(m)
    hlo.verify(m)
    return m, changed


def _while(m: Module) -> Instruction:
    (w,) = [i for i in m.entry.instructions if i.opcode == "while"]
    return w


def _ops(comp: Computation, opcode: str) -> list[Instruction]:
    return [i for i in comp.instructions if i.opcode == opcode]


def _position(comp: Computation, inst: Instruction) -> int:
    return comp.instructions.index(inst)


def _slot_read(inst: Instruction, param: Instruction) -> int | None:
    if inst.opcode == "get-tuple-element" and inst.operand(0) is param:
        return inst.attrs["index"]
    return None


def test_registered_with_xla_options():
    cls = registered_passes()["collective-pipeliner"]
    assert cls is CollectivePipeliner
    p = create_pass("collective-pipeliner", direction="backward", op="all-gather", max_pipelining_per_loop="2")
    assert p.op == ("all-gather",) and p.max_pipelining_per_loop == 2
    assert create_pass("collective-pipeliner", op="all-reduce:reduce-scatter").op == ("all-reduce", "reduce-scatter")
    with pytest.raises(PassOptionError, match="not a list of collectives"):
        create_pass("collective-pipeliner", op="add")
    with pytest.raises(PassOptionError):
        create_pass("collective-pipeliner", direction="sideways")
    with pytest.raises(PassOptionError, match="unknown device"):
        create_pass("collective-pipeliner", cost_model="tpu9")


def test_forward_reduce_scatter():
    m, changed = _run(FORWARD_RS, direction="forward", op="reduce-scatter")
    assert changed
    w = _while(m)
    body, entry = w.attrs["body"], m.entry
    param = body.parameter(0)
    # the loop state: the old slots, the previous iteration's store index and its unreduced value
    assert [str(s) for s in w.shape.elements] == ["s32[]", "f32[4,8]", "f32[4,2]", "s32[]", "f32[8]"]
    # in the loop: the reduce-scatter reduces the carried value, the store uses the carried index
    (rs,) = _ops(body, "reduce-scatter")
    assert _slot_read(rs.operand(0), param) == 4
    (dus,) = _ops(body, "dynamic-update-slice")
    assert _slot_read(dus.operand(2), param) == 3 and _slot_read(dus.operand(0), param) == 2
    assert body.root.operand(2) is dus and body.root.operand(4).opcode == "multiply"
    # iteration 0 is peeled before the loop (its multiply, no collective); the last store follows the loop
    (mul,) = _ops(entry, "multiply")
    (last,) = _ops(entry, "reduce-scatter")
    assert _position(entry, mul) < _position(entry, w) < _position(entry, last)
    assert last.operand(0).opcode == "get-tuple-element" and last.operand(0).operand(0) is w
    init = w.operand(0)
    # the loop starts at iteration 1, a constant (as XLA analyses it, so that later runs know the trip count)
    assert init.operand(0).to_text().endswith("constant(1)") and init.operand(4) is mul
    assert m.entry.root.operand(2).opcode == "dynamic-update-slice"
    assert w.backend_config_json() == {"known_trip_count": {"n": "3"}}  # iteration 0 was peeled
    # copies of collectives get fresh channel ids only when they had one: none here
    assert "channel_id" not in rs.attrs and "channel_id" not in last.attrs


def test_forward_all_reduce_through_transpose_at_reversed_index():
    m, changed = _run(FORWARD_AR, direction="forward", op="all-reduce")
    assert changed
    w = _while(m)
    body = w.attrs["body"]
    (ar,) = _ops(body, "all-reduce")
    assert ar.users[0].opcode == "transpose"
    (dus,) = _ops(body, "dynamic-update-slice")
    assert _slot_read(dus.operand(2), body.parameter(0)) is not None  # N-1-i of the previous iteration
    assert w.operand(0).operand(w.operand(0).operand_count - 2).opcode == "subtract"  # peeled index 3 - 0
    assert len(_ops(m.entry, "all-reduce")) == 1 and len(_ops(m.entry, "transpose")) == 1


def test_backward_all_gather_prefetches_the_next_layer():
    m, changed = _run(BACKWARD_AG, direction="backward", op="all-gather")
    assert changed
    w = _while(m)
    body, entry, cond = w.attrs["body"], m.entry, w.attrs["condition"]
    param = body.parameter(0)
    assert [str(s) for s in w.shape.elements] == ["s32[]", "f32[4,2]", "f32[8]", "f32[8]"]
    # the first all-gather runs before the loop and feeds the new slot
    (first,) = _ops(entry, "all-gather")
    assert _position(entry, first) < _position(entry, w) and w.operand(0).operand(3) is first
    # in the loop: the multiply reads the carried all-gather; the next one slices at i + 1
    (mul,) = _ops(body, "multiply")
    assert _slot_read(mul.operand(1), param) == 3
    (ag,) = _ops(body, "all-gather")
    assert body.root.operand(3) is ag
    ds = ag.operand(0).operand(0)
    assert ds.opcode == "dynamic-slice" and ds.operand(1).opcode == "add"
    assert _slot_read(ds.operand(1).operand(0), param) == 0
    # the loop runs one iteration less: i < 3
    assert cond.root.opcode == "compare" and cond.root.operand(1).attrs["literal"].scalar() == 3
    assert w.backend_config_json() == {"known_trip_count": {"n": "3"}}
    # the last iteration is peeled after the loop, reading the loop's last all-gather
    (tail,) = _ops(entry, "tanh")
    assert _position(entry, tail) > _position(entry, w)
    (emul,) = _ops(entry, "multiply")
    assert emul.operand(1).opcode == "get-tuple-element" and emul.operand(1).operand(0) is w


def test_backward_through_an_optimization_barrier_keeps_the_barrier():
    m, changed = _run(BACKWARD_BARRIER, direction="backward", op="all-gather")
    assert changed
    w = _while(m)
    body = w.attrs["body"]
    for comp, state in ((body, body.parameter(0)), (m.entry, w)):
        (mul,) = _ops(comp, "multiply")
        gathered = mul.operand(1)
        barrier = gathered.operand(0)
        assert barrier.opcode == "opt-barrier", "the carried all-gather still passes the barrier"
        elements = barrier.operand(0)
        assert elements.operand_count == 3 and elements.operand(2).operand(0) is state
        assert gathered.attrs["index"] == 2 and mul.operand(0).operand(0) is barrier
    assert len(_ops(body, "all-gather")) == 1 and len(_ops(m.entry, "all-gather")) == 1


def test_forward_sink_moves_the_collective_out_of_the_loop():
    m, changed = _run(SINK_AR, direction="forward-sink", op="all-reduce")
    assert changed
    w = _while(m)
    assert not _ops(w.attrs["body"], "all-reduce")
    (ar,) = _ops(m.entry, "all-reduce")
    assert str(ar.shape) == "f32[4,8]" and _position(m.entry, ar) > _position(m.entry, w)
    assert [str(s) for s in w.shape.elements][-1] == "f32[4,8]"
    assert w.backend_config_json() == {"known_trip_count": {"n": "4"}}  # nothing peeled


def test_trip_count_two_is_pipelined():
    m, changed = _run(FORWARD_RS_TRIP2, direction="forward", op="reduce-scatter")
    assert changed and len(_ops(m.entry, "reduce-scatter")) == 1


def test_channel_ids_are_fresh_for_every_copy():
    text = BACKWARD_AG.replace("replica_groups={{0,1,2,3}}, dimensions={0}",
                               "channel_id=7, replica_groups={{0,1,2,3}}, use_global_device_ids=true, dimensions={0}")
    m, changed = _run(text, direction="backward", op="all-gather")
    assert changed
    ids = [i.attrs["channel_id"] for i in m.instructions() if i.opcode == "all-gather"]
    assert len(ids) == len(set(ids)) == 2 and 7 not in ids


@pytest.mark.parametrize("name,text,options", LEFT_ALONE, ids=[c[0] for c in LEFT_ALONE])
def test_left_alone(name, text, options):
    m = hlo.parse(text)
    printed = m.to_text()
    assert not create_pass("collective-pipeliner", **options).run(m)
    assert m.to_text() == printed


@pytest.mark.parametrize("name,text,options", PIPELINED, ids=[c[0] for c in PIPELINED])
def test_changed_is_honest(name, text, options):
    spec = "collective-pipeliner{" + ",".join(f"{k}={':'.join(v) if isinstance(v, tuple) else v}"
                                              for k, v in options.items()) + "}"
    m = hlo.parse(text)
    result = run_pipeline(m, spec, paranoid=True)
    assert result.changed
    again = run_pipeline(m, "cleanup", paranoid=True)  # the result is a valid module for later passes
    assert again is not None


#: an all-gather feeding a large matmul, 16 layers: nothing in its iteration can hide it
EXPOSED_AG = loop("exposed_ag", ["f32[16,256,1024]", "f32[4096,1024]"], """  %ds = f32[1,256,1024] dynamic-slice(%v1, %v0, %zero, %zero), dynamic_slice_sizes={1,256,1024}
  %r = f32[256,1024] reshape(%ds)
  %ag = f32[1024,1024] all-gather(%r), replica_groups={{0,1,2,3}}, dimensions={0}
  %y = f32[4096,1024] dot(%v2, %ag), lhs_contracting_dims={1}, rhs_contracting_dims={0}""", ["%v1", "%y"], trip=16)

#: the same all-gather beside a large matmul that does not depend on it (already hidden in its iteration)
HIDDEN_AG = loop("hidden_ag", ["f32[16,256,1024]", "f32[1024,1024]", "f32[4096,4096]"], """  %ds = f32[1,256,1024] dynamic-slice(%v1, %v0, %zero, %zero), dynamic_slice_sizes={1,256,1024}
  %r = f32[256,1024] reshape(%ds)
  %ag = f32[1024,1024] all-gather(%r), replica_groups={{0,1,2,3}}, dimensions={0}
  %y = f32[1024,1024] add(%v2, %ag)
  %big = f32[4096,4096] dot(%v3, %v3), lhs_contracting_dims={1}, rhs_contracting_dims={0}""", ["%v1", "%y", "%big"],
                 trip=16)

def test_cost_model_pipelines_only_where_it_pays():
    from hlopt.passes.collectives.collective_pipeliner import analyze_loop
    from hlopt.passes.collectives.collective_pipeliner_cost import _Times, loop_time_us

    m = hlo.parse(EXPOSED_AG)
    info = analyze_loop(_while(m))
    (ag,) = _ops(info.body, "all-gather")
    times = _Times("h100")
    assert loop_time_us(info, times, {ag}, forward=False) < loop_time_us(info, times, set(), forward=False)
    _, exposed = _run(EXPOSED_AG, direction="backward", op="all-gather", cost_model="h100")
    assert exposed, "the all-gather is exposed in its iteration and hides behind the previous matmul"
    _, hidden = _run(HIDDEN_AG, direction="backward", op="all-gather", cost_model="h100")
    assert not hidden, "a 4096x4096 matmul independent of the all-gather already hides it"
    _, forced = _run(HIDDEN_AG, direction="backward", op="all-gather")
    assert forced, "without the cost model the pass pipelines as XLA does"


TWO_RS = loop("two_rs", ["f32[4,8]", "f32[4,2]", "f32[4,2]"], """  %ds = f32[1,8] dynamic-slice(%v1, %v0, %zero), dynamic_slice_sizes={1,8}
  %r = f32[8] reshape(%ds)
  %rs = f32[2] reduce-scatter(%r), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%sum
  %rr = f32[1,2] reshape(%rs)
  %dus = f32[4,2] dynamic-update-slice(%v2, %rr, %v0, %zero)
  %g = f32[8] negate(%r)
  %rs2 = f32[2] reduce-scatter(%g), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%sum
  %rr2 = f32[1,2] reshape(%rs2)
  %dus2 = f32[4,2] dynamic-update-slice(%v3, %rr2, %v0, %zero)""", ["%v1", "%dus", "%dus2"])


def test_max_pipelining_per_loop():
    every, _ = _run(TWO_RS, direction="forward", op="reduce-scatter")
    one, _ = _run(TWO_RS, direction="forward", op="reduce-scatter", max_pipelining_per_loop=1)

    def split(m: Module) -> tuple[int, int]:
        at = _position(m.entry, _while(m))
        places = [_position(m.entry, rs) > at for rs in _ops(m.entry, "reduce-scatter")]
        return places.count(False), places.count(True)

    assert split(every) == (0, 2)  # both stores finished after the loop, neither collective peeled
    assert split(one) == (1, 1)  # the other reduce-scatter stays in the loop, so iteration 0 runs it
    assert len(_ops(_while(one).attrs["body"], "reduce-scatter")) == 2


def test_backward_counting_down_stops_one_iteration_early():
    from pipeliner_cases import PIPELINED as cases

    text = dict((n, t) for n, t, _ in cases)["backward_countdown"]
    m, changed = _run(text, direction="backward", op="all-gather")
    assert changed
    w = _while(m)
    root = w.attrs["condition"].root
    assert root.attrs["direction"] == "GT" and root.operand(1).attrs["literal"].scalar() == 0  # i from 3 down to 1
    (ag,) = _ops(w.attrs["body"], "all-gather")
    index = ag.operand(0).operand(0).operand(1)  # the copy of `%idx = add(i, 0)` for the next layer
    step = index.operand(0)  # i + (-1)
    assert step.opcode == "add" and step.operand(1).attrs["literal"].scalar() == -1


def test_forward_store_into_a_buffer_behind_an_optimization_barrier():
    from pipeliner_cases import FORWARD_BARRIER

    m, changed = _run(FORWARD_BARRIER, direction="forward", op="reduce-scatter")
    assert changed
    w = _while(m)
    body = w.attrs["body"]
    (dus,) = _ops(body, "dynamic-update-slice")
    buffer = dus.operand(0)
    assert buffer.opcode == "get-tuple-element" and buffer.operand(0).opcode == "opt-barrier", \
        "the delayed store still writes the buffer as the barrier passes it"
    assert _slot_read(buffer.operand(0).operand(0).operand(1), body.parameter(0)) == 2
    (last,) = [i for i in _ops(m.entry, "dynamic-update-slice")]
    assert last.operand(0).operand(0) is w


def test_trip_count_annotator():
    """XLA's WhileLoopTripCountAnnotator: known loops get `known_trip_count`, kept keys stay, reruns change
    nothing, unknown loops are left alone."""
    from pipeliner_cases import UNKNOWN_TRIP

    m = hlo.parse(FORWARD_RS)
    annotate = create_pass("while-loop-trip-count-annotator")
    assert annotate.run(m)
    assert _while(m).backend_config_json() == {"known_trip_count": {"n": "4"}}
    assert not annotate.run(m)
    unknown = hlo.parse(UNKNOWN_TRIP)
    assert not annotate.run(unknown) and "backend_config" not in _while(unknown).attrs
    pipelined, _ = _run(FORWARD_RS, direction="forward", op="reduce-scatter")
    assert not annotate.run(pipelined), "the pipeliner annotates the loops it makes"


def test_nested_loop_pipelined_inside_its_enclosing_body():
    from pipeliner_cases import NESTED

    m, changed = _run(NESTED, direction="forward", op="reduce-scatter")
    assert changed
    outer = _while(m)
    (inner,) = _ops(outer.attrs["body"], "while")
    assert inner.backend_config_json() == {"known_trip_count": {"n": "3"}}
    assert len(_ops(outer.attrs["body"], "reduce-scatter")) == 1  # the last store, after the inner loop
    called = {c for i in m.instructions() for c in i.called_computations}
    assert all(c in called or c is m.entry for c in m.computations), "no computation left behind"


def test_reuse_pipelined_op_buffer_keeps_the_unreduced_value_in_the_buffer():
    from pipeliner_cases import FORWARD_REUSE

    m, changed = _run(FORWARD_REUSE, direction="forward", op="all-reduce", pipeline_use_tree=True,
                      reuse_pipelined_op_buffer=True)
    assert changed
    w = _while(m)
    body = w.attrs["body"]
    param = body.parameter(0)
    assert [str(s) for s in w.shape.elements] == ["s32[]", "f32[4,8]", "f32[4,8]", "s32[]"]  # only the index
    (ar,) = _ops(body, "all-reduce")
    ds = ar.operand(0)
    assert ds.opcode == "dynamic-slice" and _slot_read(ds.operand(0), param) == 2  # read back from the buffer
    assert _slot_read(ds.operand(1), param) == 3  # at the previous iteration's index
    finished, stored = sorted(_ops(body, "dynamic-update-slice"), key=lambda d: _position(body, d))
    assert stored.operand(0) is finished and stored.operand(1).opcode == "exponential"  # unreduced, this iteration
    (peeled_store,) = [d for d in _ops(m.entry, "dynamic-update-slice") if _position(m.entry, d) < _position(m.entry, w)]
    assert peeled_store.operand(1).opcode == "exponential"
    off, _ = _run(FORWARD_REUSE, direction="forward", op="all-reduce", pipeline_use_tree=True)
    assert len(_while(off).shape.elements) == 5, "without the option the unreduced value is carried"


def test_forward_sink_reduce_scatter_over_the_stack():
    from pipeliner_cases import SINK_RS

    m, changed = _run(SINK_RS, direction="forward-sink", op="reduce-scatter")
    assert changed
    assert not _ops(_while(m).attrs["body"], "reduce-scatter")
    (rs,) = _ops(m.entry, "reduce-scatter")
    assert str(rs.shape) == "f32[4,2]" and rs.attrs["dimensions"] == (1,) and str(rs.operand(0).shape) == "f32[4,8]"


def test_forward_store_at_jax_wrapped_index():
    """jax's `select(i < 0, i + N, i)` (converted) is `i` in a loop from 0: the store is pipelined."""
    m, changed = _run(FORWARD_JAX_INDEX, direction="forward", op="reduce-scatter")
    assert changed
    w = _while(m)
    body = w.attrs["body"]
    param = body.parameter(0)
    (rs,) = _ops(body, "reduce-scatter")
    assert _slot_read(rs.operand(0), param) is not None  # the previous iteration's value, carried
    (dus,) = _ops(body, "dynamic-update-slice")
    assert _slot_read(dus.operand(2), param) is not None  # at the previous iteration's index
    assert str(w.shape.elements[3]) == "s64[]"


def test_forward_sink_of_a_formatting_chain():
    """The all-reduce, the broadcast of a loop-variant scalar, the multiply, the add of a loop-invariant row and
    the reduce leave the loop; the loop stacks the all-reduce's operand and the scalar, and carries the row."""
    m, changed = _run(SINK_CHAIN, direction="forward-sink", op="all-reduce", pipeline_use_tree="true")
    assert changed
    w = _while(m)
    body = w.attrs["body"]
    assert not _ops(body, "all-reduce") and not _ops(body, "reduce")
    assert [str(s) for s in w.shape.elements[4:]] == ["f32[4,8,4]", "f32[4]", "f32[8,4]"]
    (ar,) = _ops(m.entry, "all-reduce")
    assert str(ar.shape) == "f32[4,8,4]"
    (red,) = _ops(m.entry, "reduce")
    assert red.attrs["dimensions"] == (2,) and str(red.shape) == "f32[4,8]"
    (bc,) = [b for b in _ops(m.entry, "broadcast") if str(b.shape) == "f32[4,8,4]" and b.operand(0).shape.rank == 1]
    assert bc.attrs["dimensions"] == (0,)


def test_peeled_copies_get_new_scheduling_groups():
    """As XLA: the peeled iteration's multiply gets the next unused group id, the all-reduce finished after the
    loop loses its group, the loop's own copies keep theirs."""
    m, changed = _run(FORWARD_ANNOTATED, direction="forward", op="all-reduce")
    assert changed
    group = "_scheduling_group_id"
    (mul,) = _ops(m.entry, "multiply")
    assert mul.frontend_attributes[group] == "3"
    (ar,) = _ops(m.entry, "all-reduce")
    assert group not in ar.frontend_attributes
    body = _while(m).attrs["body"]
    assert [a.frontend_attributes.get(group) for a in _ops(body, "all-reduce")] == ["2"]
    assert [x.frontend_attributes.get(group) for x in _ops(body, "multiply")] == ["1"]
