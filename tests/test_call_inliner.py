"""call-inliner on our own modules (every behaviour of XLA's CallInliner): the module texts and the checks by
structure alone (no jax). Numerics on XLA CPU and the corpus: test_call_inliner_numerics.py."""

from __future__ import annotations

from hlopt.passes.call_inliner import CallInliner, InlinePolicy

from hlopt import hlo


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


