"""call-inliner on our own modules (every behaviour of XLA's CallInliner), numerics on XLA CPU, corpus."""

from __future__ import annotations

import numpy as np
import pytest
from corpus import PROGRAMS, corpus_texts
from hlopt.passes.call_inliner import CallInliner, InlinePolicy
from hlopt.passes.pipeline import run_pipeline

from hlopt import hlo, runtime


def _inline(text: str, spec: str = "call-inliner", run: bool = True) -> tuple[hlo.Module, hlo.Module, bool]:
    """(before, after, changed); the result is verified, parsed by XLA, and run against `before`."""
    before = hlo.parse(text)
    after = before.clone()
    changed = run_pipeline(after, spec).changed
    runtime.xla_canonical_text(after.to_text())
    if run:
        result = runtime.run_and_compare(before, after, rtol=0, atol=0)
        assert result.ok, str(result)
    return before, after, changed


def _calls(m: hlo.Module) -> list[hlo.Instruction]:
    return [i for i in m.instructions() if i.opcode == "call"]


NESTED = """
HloModule nested

%leaf (a: f32[4]) -> f32[4] {
  %a = f32[4] parameter(0)
  %e = f32[4] exponential(%a), metadata={op_name="leaf_exp"}
  ROOT %n = f32[4] negate(%e)
}

%mid (x: f32[4], y: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  %y = f32[4] parameter(1)
  %c = f32[4] call(%x), to_apply=%leaf, metadata={op_name="mid/leaf"}
  ROOT %s = f32[4] add(%c, %y)
}

ENTRY %main (p: f32[4], q: f32[4]) -> (f32[4], f32[4]) {
  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  %c1 = f32[4] call(%p, %q), to_apply=%mid, metadata={op_name="top"}
  %c2 = f32[4] call(%q, %p), to_apply=%mid
  ROOT %t = (f32[4], f32[4]) tuple(%c1, %c2)
}
"""


def test_nested_calls_inline_callees_first_and_prefix_op_names():
    _, after, changed = _inline(NESTED)
    assert changed and not _calls(after)
    assert [c.name for c in after.computations] == ["main"]
    names = sorted(i.metadata.op_name for i in after.entry.instructions if i.metadata is not None)
    assert names == ["mid/leaf", "mid/leaf/leaf_exp", "top", "top/mid/leaf", "top/mid/leaf/leaf_exp"]


def test_single_call_site_inlines_only_unshared_callees():
    _, after, changed = _inline(NESTED, "call-inliner{single_call_site=true}")
    assert changed
    assert [i.opcode for i in after.entry.instructions].count("call") == 2  # %mid has two call sites
    assert not any(i.opcode == "call" for i in after.computation("mid").instructions)  # %leaf had one


def test_calls_with_backend_config_stay():
    text = NESTED.replace('to_apply=%leaf, metadata={op_name="mid/leaf"}', 'to_apply=%leaf, backend_config={"x":1}')
    _, after, _ = _inline(text)
    assert [c.attrs["to_apply"].name for c in _calls(after)] == ["leaf", "leaf"]  # inlined into both sites of mid


def test_override_policy_and_inlineable_attribute():
    text = NESTED.replace('%c2 = f32[4] call(%q, %p), to_apply=%mid',
                          '%c2 = f32[4] call(%q, %p), to_apply=%mid, frontend_attributes={inlineable="false"}')
    m = hlo.parse(text)
    assert CallInliner().run(m)
    assert [c.name for c in _calls(m)] == ["c2"]
    m = hlo.parse(text)
    ignore = CallInliner(override_policy=lambda call: InlinePolicy.IGNORE_FRONTEND_ATTRIBUTES)
    assert ignore.run(m) and not _calls(m)
    m = hlo.parse(text)
    only_leaf = CallInliner(override_policy=lambda call: call.attrs["to_apply"].name == "leaf")
    assert only_leaf.run(m)
    assert sorted(c.name for c in _calls(m)) == ["c1", "c2"]


CONTROL = """
HloModule control

%callee (a: s32[]) -> s32[] {
  %a = s32[] parameter(0)
  %one = s32[] constant(1)
  %two = s32[] constant(2), control-predecessors={%one}
  %x = s32[] add(%a, %one)
  ROOT %y = s32[] multiply(%x, %two)
}

%identity (b: s32[]) -> s32[] {
  ROOT %b = s32[] parameter(0)
}

ENTRY %main (p: s32[], q: s32[]) -> (s32[], s32[], s32[], s32[]) {
  %p = s32[] parameter(0)
  %q = s32[] parameter(1)
  %before = s32[] negate(%p)
  %c = s32[] call(%q), to_apply=%callee, control-predecessors={%before}
  %after = s32[] abs(%p), control-predecessors={%c}
  %i = s32[] call(%q), to_apply=%identity, control-predecessors={%before}
  %later = s32[] not(%p), control-predecessors={%i}
  ROOT %t = (s32[], s32[], s32[], s32[]) tuple(%before, %c, %after, %later)
}
"""


def test_control_dependencies_are_cloned_and_relayed():
    _, after, changed = _inline(CONTROL)
    assert changed
    e = after.entry
    two = next(i for i in e.instructions if i.opcode == "constant" and i.attrs["literal"].text == "2")
    assert any(p.opcode == "constant" and p.attrs["literal"].text == "1" for p in two.control_predecessors)
    inlined = [i for i in e.instructions if i.opcode in ("constant", "add", "multiply")]
    assert len(inlined) == 4 and all(e.instruction("before") in i.control_predecessors for i in inlined)
    mul = next(i for i in inlined if i.opcode == "multiply")
    assert e.instruction("after").control_predecessors == (mul,)
    # %identity's root is its parameter: the order before -> later is kept by a direct edge
    later = e.instruction("later")
    assert {p.name for p in later.control_predecessors} == {"before", "q"}


def test_op_name_is_not_pushed_into_embedded_computations():
    text = """
HloModule m

%reducer (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add = f32[] add(%x, %y)
}

%callee (input: f32[8,4]) -> f32[8] {
  %input = f32[8,4] parameter(0)
  %const = f32[] constant(0)
  ROOT %reduce = f32[8] reduce(%input, %const), dimensions={1}, to_apply=%reducer, metadata={op_name="reduce"}
}

ENTRY %main (input: f32[8,4]) -> f32[8] {
  %input = f32[8,4] parameter(0)
  ROOT %result = f32[8] call(%input), to_apply=%callee, metadata={op_name="x"}
}
"""
    _, after, _ = _inline(text)
    root = after.entry.root
    assert root.opcode == "reduce" and root.metadata.op_name == "x/reduce"
    assert root.attrs["to_apply"].root.metadata is None


def test_long_op_names_are_not_extended():
    long = "x" * 1024
    text = f"""
HloModule m

%callee (input: f32[4]) -> f32[4] {{
  %input = f32[4] parameter(0)
  ROOT %y = f32[4] negate(%input), metadata={{op_name="y"}}
}}

ENTRY %main (input: f32[4]) -> f32[4] {{
  %input = f32[4] parameter(0)
  ROOT %result = f32[4] call(%input), to_apply=%callee, metadata={{op_name="{long}"}}
}}
"""
    _, after, _ = _inline(text)
    assert after.entry.root.opcode == "negate" and after.entry.root.metadata.op_name == "y"
    _, after, _ = _inline(text.replace(long, "x" * 1020))
    assert after.entry.root.metadata.op_name == "x" * 1020 + "/y"  # 1020 + 1 < 1024: still prefixed


COMPOSITE = """
HloModule composite

%add (lhs: f32[4]) -> f32[4] {
  %lhs = f32[4] parameter(0)
  %two = f32[] constant(2)
  %twos = f32[4] broadcast(%two), dimensions={}
  ROOT %add = f32[4] add(%lhs, %twos)
}

%mul (lhs: f32[4]) -> f32[4] {
  %lhs = f32[4] parameter(0)
  ROOT %m = f32[4] multiply(%lhs, %lhs)
}

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %a = f32[4] call(%p), to_apply=%add, is_composite=true, frontend_attributes={composite.attributes={n = 1 : i32},composite.name="foo.add",composite.version="1"}
  ROOT %b = f32[4] call(%a), to_apply=%mul, is_composite=true, frontend_attributes={composite.attributes={},composite.name="foo.mul",composite.version="2",keep="me"}
}
"""


def test_composites_lose_their_attributes_unless_preserved():
    _, after, _ = _inline(COMPOSITE)
    assert not _calls(after)
    assert after.entry.root.frontend_attributes == {"keep": "me"}  # non-composite attributes stay
    assert all(not i.frontend_attributes for i in after.entry.instructions if i is not after.entry.root)
    _, after, _ = _inline(COMPOSITE, "call-inliner{composites_to_preserve=foo.add:foo.mul}")
    assert [c.frontend_attributes["composite.name"] for c in _calls(after)] == ["foo.add", "foo.mul"]
    assert CallInliner(composites_to_preserve=("foo.mul",)).describe() == "call-inliner{composites_to_preserve=foo.mul}"


SHMAP = """
HloModule jit_f, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["i"=1]>}}

%prefix_shmap_body_suffix.4 (a: f32[1,8]) -> f32[1,8] {
  %a = f32[1,8] parameter(0)
  ROOT %add = f32[1,8] add(%a, %a)
}

%my_model.fwd.xla.sdy.manual_computation_body_14.1234 (b: f32[1,8]) -> f32[1,8] {
  %b = f32[1,8] parameter(0)
  ROOT %neg = f32[1,8] negate(%b)
}

%plain (c: f32[1,8]) -> f32[1,8] {
  %c = f32[1,8] parameter(0)
  ROOT %abs = f32[1,8] abs(%c)
}

ENTRY %main (p: f32[1,8]) -> f32[1,8] {
  %p = f32[1,8] parameter(0)
  %x = f32[1,8] call(%p), to_apply=%prefix_shmap_body_suffix.4
  %y = f32[1,8] call(%x), to_apply=%my_model.fwd.xla.sdy.manual_computation_body_14.1234
  ROOT %z = f32[1,8] call(%y), to_apply=%plain
}
"""


def test_shard_map_bodies_stay_under_shardy():
    m = hlo.parse(SHMAP)
    assert CallInliner().run(m)
    assert [c.name for c in _calls(m)] == ["x", "y"]
    m = hlo.parse(SHMAP)
    assert CallInliner(use_shardy_partitioner=False).run(m) and not _calls(m)
    m = hlo.parse(SHMAP.replace(", frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<[\"i\"=1]>}}", ""))
    assert CallInliner().run(m) and not _calls(m)  # without Shardy, XLA inlines them too


ASYNC = """
HloModule async

%inner (x: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%x)
}

%wrapped (y: f32[4]) -> f32[4] {
  %y = f32[4] parameter(0)
  ROOT %c = f32[4] call(%y), to_apply=%inner
}

%twice (z: f32[4]) -> f32[4] {
  %z = f32[4] parameter(0)
  %s = ((f32[4]), f32[4], s32[]) async-start(%z), calls=%wrapped
  ROOT %d = f32[4] async-done(%s), calls=%wrapped
}

ENTRY %main (p: f32[4]) -> (f32[4], f32[4]) {
  %p = f32[4] parameter(0)
  %a = f32[4] call(%p), to_apply=%twice
  %b = f32[4] call(%a), to_apply=%twice
  ROOT %t = (f32[4], f32[4]) tuple(%a, %b)
}
"""


def test_calls_in_async_computations_stay_and_async_ops_get_their_own_copy():
    _, after, changed = _inline(ASYNC, run=False)
    assert changed
    starts = [i for i in after.entry.instructions if i.opcode == "async-start"]
    dones = [i for i in after.entry.instructions if i.opcode == "async-done"]
    assert len(starts) == 2 and len(dones) == 2
    wrapped = [s.attrs["calls"] for s in starts]
    assert wrapped[0] is not wrapped[1]
    assert [d.attrs["calls"] for d in dones] == wrapped
    assert all(w.root.opcode == "call" for w in wrapped)  # a call inside an async computation stays
    assert "twice" not in {c.name for c in after.computations}


FUSE_HINT = """
HloModule hint

%body (b: (s32[], f32[4])) -> (s32[], f32[4]) {
  %b = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%b), index=0
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %v = f32[4] get-tuple-element(%b), index=1
  ROOT %r = (s32[], f32[4]) tuple(%j, %v)
}

%cond (c: (s32[], f32[4])) -> pred[] {
  %c = (s32[], f32[4]) parameter(0)
  %k = s32[] get-tuple-element(%c), index=0
  %three = s32[] constant(3)
  ROOT %lt = pred[] compare(%k, %three), direction=LT
}

%callee (x: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]) tuple(%zero, %x)
  %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
  %v = f32[4] get-tuple-element(%w), index=1
  ROOT %e = f32[4] exponential(%v)
}

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  ROOT %c = f32[4] call(%p), to_apply=%callee, frontend_attributes={MUST_FUSE="group1",other="x"}, sharding={replicated}
}
"""


def test_fusion_hints_go_to_fusible_instructions_and_the_root_takes_the_calls_annotations():
    _, after, _ = _inline(FUSE_HINT)
    e = after.entry
    hinted = {i.opcode for i in e.instructions if "MUST_FUSE" in i.frontend_attributes}
    assert hinted == {"constant", "tuple", "get-tuple-element", "exponential"}  # not the while
    assert e.root.frontend_attributes == {"MUST_FUSE": "group1"}  # it had one, so the call's are not copied
    assert str(e.root.sharding) == "{replicated}"


CHANNELS = """
HloModule channels

%ag (input: f32[4,2]) -> f32[4,2] {
  %input = f32[4,2] parameter(0)
  ROOT %ag = f32[4,2] all-gather(%input), replica_groups={}, dimensions={1}, channel_id=1337
}

%ag2 (input: f32[4,2]) -> f32[4,2] {
  %input = f32[4,2] parameter(0)
  ROOT %ag = f32[4,2] all-gather(%input), replica_groups={}, dimensions={1}, channel_id=1337
}

ENTRY %main (input: f32[4,2]) -> (f32[4,2], f32[4,2]) {
  %input = f32[4,2] parameter(0)
  %ag = f32[4,2] call(%input), to_apply=%ag
  %ag2 = f32[4,2] call(%ag), to_apply=%ag2
  ROOT %result = (f32[4,2], f32[4,2]) tuple(%ag2, %ag)
}
"""


def test_uniquify_channel_ids():
    _, after, _ = _inline(CHANNELS, run=False)
    assert {i.attrs["channel_id"] for i in after.entry.instructions if i.opcode == "all-gather"} == {1337}
    _, after, _ = _inline(CHANNELS, "call-inliner{uniquify_channel_ids=true}", run=False)
    ids = [i.attrs["channel_id"] for i in after.entry.instructions if i.opcode == "all-gather"]
    assert len(set(ids)) == 2 and min(ids) > 1337


THREADS = """
HloModule inline_specified_threads_only

%secondary_inner () -> u32[] {
  ROOT %co.2 = u32[] constant(2)
}, execution_thread="secondary_thread"

%secondary_outer () -> u32[] {
  %co.1 = u32[] constant(1)
  %call.1 = u32[] call(), to_apply=%secondary_inner
  ROOT %add.1 = u32[] add(%co.1, %call.1)
}, execution_thread="secondary_thread"

%main_inner () -> u32[] {
  %co.0 = u32[] constant(0)
  %async-start = ((), u32[], u32[]) call-start(), async_execution_thread="secondary_thread", to_apply=%secondary_outer
  %async-done = u32[] call-done(%async-start)
  ROOT %add.2 = u32[] add(%co.0, %async-done)
}

ENTRY %main_outer (p0: u32[]) -> u32[] {
  %p.0 = u32[] parameter(0)
  %call.0 = u32[] call(), to_apply=%main_inner
  ROOT %add.3 = u32[] add(%p.0, %call.0)
}
"""


def test_execution_threads_filter():
    _, after, _ = _inline(THREADS, run=False)
    assert not _calls(after)
    _, after, _ = _inline(THREADS, "call-inliner{execution_threads=secondary_thread}", run=False)
    assert [c.name for c in _calls(after)] == ["call.0"]
    assert after.computation("secondary_outer").root.operand(1).opcode == "constant"


SCHEDULED = """
HloModule main, is_scheduled=true

%comp (arg.0: s32[]) -> s32[] {
  %arg.0 = s32[] parameter(0)
  ROOT %abs.0 = s32[] abs(%arg.0)
}

%outer (t: (s32[], s32[])) -> s32[] {
  %t = (s32[], s32[]) parameter(0)
  ROOT %call.0 = s32[] call(%t), to_apply=%inner
}

%inner (u: (s32[], s32[])) -> s32[] {
  %u = (s32[], s32[]) parameter(0)
  %gte.0 = s32[] get-tuple-element(%u), index=0
  %gte.1 = s32[] get-tuple-element(%u), index=1
  ROOT %add.0 = s32[] add(%gte.0, %gte.1)
}

ENTRY %main (x: s32[], y: s32[]) -> s32[] {
  %x = s32[] parameter(0)
  %y = s32[] parameter(1)
  %c0 = s32[] call(%x), to_apply=%comp
  %c1 = s32[] call(%c0), to_apply=%comp
  %pair = (s32[], s32[]) tuple(%c1, %y)
  ROOT %r = s32[] call(%pair), to_apply=%outer
}
"""


def test_scheduled_module_keeps_callee_sequences_in_place():
    _, after, _ = _inline(SCHEDULED)
    assert after.is_scheduled
    assert [i.opcode for i in after.entry.instructions] == [
        "parameter", "parameter", "abs", "abs", "tuple", "get-tuple-element", "get-tuple-element", "add"]


EDGE = """
HloModule edge

%empty (a: s32[]) -> s32[] {
  %a = s32[] parameter(0)
  ROOT %zero = s32[] constant(0)
}

%outfeeder () -> token[] {
  %v = f32[] constant(42)
  %tok = token[] after-all()
  ROOT %o = token[] outfeed(%v, %tok), outfeed_shape=f32[]
}

%false () -> pred[] {
  ROOT %f = pred[] constant(false)
}

%call_false (param: pred[]) -> pred[] {
  %param = pred[] parameter(0)
  ROOT %c = pred[] call(), to_apply=%false
}

ENTRY %main (p: s32[]) -> (s32[], pred[]) {
  %p = s32[] parameter(0)
  %c1 = s32[] call(%p), to_apply=%empty
  %c2 = s32[] call(%p), to_apply=%empty
  %c3 = s32[] call(%c2), to_apply=%empty
  %out = token[] call(), to_apply=%outfeeder
  %init = pred[] constant(false)
  %w = pred[] while(%init), condition=%call_false, body=%call_false
  ROOT %t = (s32[], pred[]) tuple(%c3, %w)
}
"""


def test_empty_computations_outfeed_and_while_bodies():
    m = hlo.parse(EDGE)
    assert CallInliner().run(m)
    e = m.entry
    assert not _calls(m)
    assert e.root.operand(0).opcode == "constant"
    assert any(i.opcode == "outfeed" for i in e.instructions)  # inlined, and kept by DCE
    w = e.root.operand(1)
    assert w.attrs["condition"].root.opcode == "constant" and w.attrs["body"].root.opcode == "constant"
    hlo.verify(m)
    runtime.xla_canonical_text(m.to_text())


_SAMPLE = ["custom_vjp", "reductions_mixed_dtypes", "shmap_grad_accumulation", "while_fori_cond"]
_ALL = [p.name + sfx for p in PROGRAMS for sfx in ("", ".opt")]


def _corpus_case(entry_id: str) -> None:
    entry = next(e for e in corpus_texts() if e.id == entry_id)
    before = hlo.parse(entry.text)
    after = before.clone()
    run_pipeline(after, "call-inliner")
    result = runtime.run_and_compare(before, after, rtol=0, atol=0)
    assert result.ok, str(result)


@pytest.mark.parametrize("entry_id", _SAMPLE)
def test_corpus_sample_inlines_and_matches(entry_id):
    _corpus_case(entry_id)


@pytest.mark.slow
@pytest.mark.parametrize("entry_id", _ALL)
def test_whole_corpus_inlines_and_matches(entry_id):
    _corpus_case(entry_id)


def test_inline_call_api_returns_the_mapping():
    from hlopt.passes.call_inliner import inline_call

    m = hlo.parse(NESTED)
    call = m.entry.instruction("c1")
    mid = m.computation("mid")
    mapping = inline_call(call)
    assert mapping[mid.parameter(0)].name == "p" and mapping[mid.root].opcode == "add"
    assert m.entry.root.operand(0) is mapping[mid.root]
    hlo.verify(m)
    assert np.isfinite(runtime.execute(m, runtime.random_inputs(m, 0))[0]).all()
