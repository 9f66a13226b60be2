"""while-loop-all-reduce-code-motion: XLA's cases, our own modules, numerics on several CPU devices."""

from __future__ import annotations

import pytest
from corpus import corpus_texts

import hlo
import runtime
from passes.pipeline import run_pipeline

PASS = "while-loop-all-reduce-code-motion"


def _count(comp, opcode="all-reduce"):
    return sum(1 for i in comp.instructions if i.opcode == opcode)


def _bodies(m):
    return [i.attrs["body"] for i in m.instructions() if i.opcode == "while"]


def _in_loops(m):
    """All-reduces inside while bodies, including what the bodies call."""
    work = _bodies(m)
    seen = set(work)
    while work:
        for callee in work.pop().called_computations():
            if callee not in seen:
                seen.add(callee)
                work.append(callee)
    return sum(_count(c) for c in seen)


def _case(shared_dir, name):
    return hlo.parse_file(shared_dir / "xla_cases" / "while_loop_all_reduce_code_motion" / name)


def _run_replicated(before, after, replicas=4):
    for m in (before, after):
        m.config["replica_count"] = replicas
    result = runtime.run_and_compare(before, after, rtol=1e-4, atol=1e-4)
    assert result.ok, str(result)


def test_xla_all_reduce_accumulate(shared_dir):
    m = _case(shared_dir, "AllReduceAccumulate.hlo")
    before = m.clone()
    assert run_pipeline(m, PASS).changed
    assert all(_count(b) == 0 for b in _bodies(m))
    (ar,) = [i for i in m.entry.instructions if i.opcode == "all-reduce"]
    assert ar.operand(0).opcode == "get-tuple-element" and ar.operand(0).attrs["index"] == 3
    assert ar.attrs["replica_groups"].groups() == [[0, 1, 2, 3]] and ar.attrs["channel_id"] == 1
    assert ar.attrs["use_global_device_ids"] is True
    (add,) = ar.users
    assert add.opcode == "add"
    loop = next(i for i in m.entry.instructions if i.opcode == "while")
    init3 = loop.operand(0).operand(3)
    assert init3.opcode == "broadcast" and init3.operand(0).attrs["literal"].scalar() == 0
    assert before.entry.root.shape.compatible(m.entry.root.shape)


def test_xla_type_cast_accumulate(shared_dir):
    m = _case(shared_dir, "TypeCastAllReduceAccumulate.hlo")
    assert run_pipeline(m, PASS).changed
    (ar,) = [i for i in m.entry.instructions if i.opcode == "all-reduce"]
    assert ar.shape.dtype == "bf16" and ar.operand(0).opcode == "convert"
    assert ar.operand(0).operand(0).opcode == "get-tuple-element"
    assert [u.opcode for u in ar.users] == ["convert"] and ar.users[0].shape.dtype == "f32"


def test_xla_outside_called_computation(shared_dir):
    m = _case(shared_dir, "AllReduceOutsideCalledComputationHoisted.hlo")
    before = m.clone()
    assert run_pipeline(m, PASS).changed
    (ar,) = [i for i in m.entry.instructions if i.opcode == "all-reduce"]
    assert ar.attrs["channel_id"] == 1  # XLA gives the hoisted all-reduce a channel id
    body = _bodies(m)[0]
    assert _count(body) == 0 and _count(body, "call") == 1
    _run_replicated(before, m)


@pytest.mark.parametrize("name", ["RepeatedlyAccumulatedAllReduce.hlo", "ReduceScatterAccumulate.hlo"])
def test_xla_refusals(shared_dir, name):
    m = _case(shared_dir, name)
    text = m.to_text()
    assert not run_pipeline(m, PASS).changed
    assert m.to_text() == text


LOOP = """HloModule loop, replica_count=4

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] maximum(%a, %b)
}

%cond (p: (s32[], f32[8], f32[8], f32[8], f32[8])) -> pred[] {
  %p = (s32[], f32[8], f32[8], f32[8], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[8], f32[8], f32[8], f32[8])) -> (s32[], f32[8], f32[8], f32[8], f32[8]) {
  %p = (s32[], f32[8], f32[8], f32[8], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8] get-tuple-element(%p), index=1
  %acc1 = f32[8] get-tuple-element(%p), index=2
  %acc2 = f32[8] get-tuple-element(%p), index=3
  %acc3 = f32[8] get-tuple-element(%p), index=4
  %fi = f32[] convert(%i)
  %bi = f32[8] broadcast(%fi), dimensions={}
  %g = f32[8] multiply(%x, %bi)
  %ar1 = f32[8] all-reduce(%g), replica_groups={{0,1,2,3}}, to_apply=%sum
  %new1 = f32[8] add(%ar1, %acc1)
  %ar2 = f32[8] all-reduce(%x), replica_groups={{0,1},{2,3}}, channel_id=7, to_apply=%sum
  %new2 = f32[8] add(%acc2, %ar2)
  %ar3 = f32[8] all-reduce(%g), replica_groups={{0,1,2,3}}, to_apply=%max
  %new3 = f32[8] add(%ar3, %acc3)
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8], f32[8], f32[8], f32[8]) tuple(%next, %x, %new1, %new2, %new3)
}

ENTRY %main (x: f32[8], a: f32[8]) -> (s32[], f32[8], f32[8], f32[8], f32[8]) {
  %x = f32[8] parameter(0)
  %a = f32[8] parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8], f32[8], f32[8], f32[8]) tuple(%zero, %x, %a, %a, %a)
  ROOT %w = (s32[], f32[8], f32[8], f32[8], f32[8]) while(%init), condition=%cond, body=%body
}
"""


def test_several_accumulators_mixed_with_non_movable():
    before = hlo.parse(LOOP)
    after = before.clone()
    assert run_pipeline(after, PASS).changed
    body = after.computation("body")
    remaining = [i for i in body.instructions if i.opcode == "all-reduce"]
    assert [r.attrs["to_apply"].name for r in remaining] == ["max"]  # MAX accumulation stays
    moved = [i for i in after.entry.instructions if i.opcode == "all-reduce"]
    assert sorted(m.attrs.get("channel_id") for m in moved) == [7, 8]  # kept, and a fresh one
    assert any(m.attrs["replica_groups"].groups() == [[0, 1], [2, 3]] for m in moved)
    _run_replicated(before, after)


def test_condition_reading_the_accumulator_is_refused():
    text = LOOP.replace("%i = s32[] get-tuple-element(%p), index=0\n  %n = s32[] constant(5)",
                        "%i = s32[] get-tuple-element(%p), index=0\n  %unused = f32[8] get-tuple-element(%p), "
                        "index=2\n  %n = s32[] constant(5)")
    m = hlo.parse(text)
    run_pipeline(m, PASS)
    remaining = {i.attrs["to_apply"].name for i in m.computation("body").instructions if i.opcode == "all-reduce"}
    assert "sum" in remaining  # slot 2 is read by the condition: its all-reduce stays


def test_constrain_layout_is_refused():
    m = hlo.parse(LOOP.replace("channel_id=7, to_apply=%sum", "channel_id=7, constrain_layout=true, to_apply=%sum"))
    run_pipeline(m, PASS)
    body = m.computation("body")
    assert any(i.opcode == "all-reduce" and i.attrs.get("channel_id") == 7 for i in body.instructions)


@pytest.mark.parametrize("name", ["shmap_grad_accumulation", "shmap_psum_in_scan"])
def test_real_shard_map_loops(name):
    entry = next(e for e in corpus_texts() if e.id == name)
    before = hlo.parse(entry.text)
    after = before.clone()
    run_pipeline(after, "call-inliner,fix(algebraic-simplifier,tuple-simplifier,dce)," + PASS)
    loops_before, loops_after = _in_loops(before), _in_loops(after)
    assert loops_before >= 1 and loops_after < loops_before
    result = runtime.run_and_compare(before, after, rtol=1e-4, atol=1e-5)
    assert result.ok, str(result)


def test_demo_program_moves_gradient_all_reduces():
    from cli.demo_program import make_train_step

    step, args = make_train_step(microbatches=2, batch=8, seq=4, d_model=16, d_ff=32)
    before = runtime.capture(step, *args)
    after = before.clone()
    run_pipeline(after, "call-inliner,simplify," + PASS + ",simplify")
    moved = [i for i in after.instructions() if i.opcode == "all-reduce" and i.parent.name.startswith("xla.sdy")]
    assert len(moved) >= 7  # one per parameter gradient
    result = runtime.run_and_compare(before, after, rtol=2e-4, atol=1e-5)
    assert result.ok, str(result)


FORWARD = """HloModule fwd, replica_count=4

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%sumh (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %s = bf16[] add(%a, %b)
}

%cond (p: (s32[], f32[4,8], f32[8,4], f32[2,8])) -> pred[] {
  %p = (s32[], f32[4,8], f32[8,4], f32[2,8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[4,8], f32[8,4], f32[2,8])) -> (s32[], f32[4,8], f32[8,4], f32[2,8]) {
  %p = (s32[], f32[4,8], f32[8,4], f32[2,8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4,8] get-tuple-element(%p), index=1
  %acc = f32[8,4] get-tuple-element(%p), index=2
  %acc2 = f32[2,8] get-tuple-element(%p), index=3
  %fi = f32[] convert(%i)
  %bf = f32[4,8] broadcast(%fi), dimensions={}
  %g = f32[4,8] multiply(%x, %bf)
  %h = bf16[4,8] convert(%g)
  %ar = bf16[4,8] all-reduce(%h), replica_groups={{0,1,2,3}}, to_apply=%sumh
  %cv = f32[4,8] convert(%ar)
  %tr = f32[8,4] transpose(%cv), dimensions={1,0}
  %new = f32[8,4] add(%tr, %acc)
  %ar2 = f32[4,8] all-reduce(%g), replica_groups={{0,1,2,3}}, channel_id=3, to_apply=%sum
  %sl = f32[2,8] slice(%ar2), slice={[1:3], [0:8]}
  %new2 = f32[2,8] add(%acc2, %sl)
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[4,8], f32[8,4], f32[2,8]) tuple(%next, %x, %new, %new2)
}

ENTRY %main (x: f32[4,8], a: f32[8,4], b: f32[2,8]) -> (s32[], f32[4,8], f32[8,4], f32[2,8]) {
  %x = f32[4,8] parameter(0)
  %a = f32[8,4] parameter(1)
  %b = f32[2,8] parameter(2)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4,8], f32[8,4], f32[2,8]) tuple(%zero, %x, %a, %b)
  ROOT %w = (s32[], f32[4,8], f32[8,4], f32[2,8]) while(%init), condition=%cond, body=%body
}
"""


def test_forwarding_through_convert_transpose_and_slice():
    before = hlo.parse(FORWARD)
    after = before.clone()
    assert run_pipeline(after, PASS).changed
    assert _count(after.computation("body")) == 0
    moved = [i for i in after.entry.instructions if i.opcode == "all-reduce"]
    assert sorted(m.shape.to_text(layout=False) for m in moved) == ["bf16[8,4]", "f32[2,8]"]
    for m in (before, after):
        m.config["replica_count"] = 4
    result = runtime.run_and_compare(before, after, rtol=2e-2, atol=2e-2)  # bf16 all-reduce
    assert result.ok, str(result)


def test_xla_scalar_all_reduce_used_as_scaling_factor_stays(shared_dir):
    m = _case(shared_dir, "ScalarAllReduceStaysInBodyWhenUsedAsScalingFactor.hlo")
    before = m.clone()
    assert run_pipeline(m, PASS).changed
    body = m.computation("while_body")
    assert [i.shape.dtype for i in body.instructions if i.opcode == "all-reduce"] == ["s32"]
    assert [i.shape.dtype for i in m.entry.instructions if i.opcode == "all-reduce"] == ["f32"]
    assert any(i.opcode == "multiply" and any(o.opcode == "broadcast" for o in i.operands) for i in body.instructions)
    import numpy as np

    for mod in (before, m):
        mod.config["replica_count"] = 4
    # the trip count is an input: every replica must run the same number of iterations (or collectives hang)
    inputs = [np.array(5, np.int32), np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)]
    result = runtime.run_and_compare(before, m, rtol=1e-4, atol=1e-3, inputs=inputs)
    assert result.ok, str(result)
