"""call-inliner, numerics: the tests that run modules on XLA (before and after, same inputs);
the structure checks without jax are in test_call_inliner.py."""

from __future__ import annotations

import numpy as np
import pytest
from hlopt.corpus.programs import PROGRAMS, corpus_texts
from hlopt.passes.call_inliner import CallInliner
from hlopt.passes.framework.pipeline import run_pipeline
from test_call_inliner import (  # the module texts and helpers the structure tests use
    ASYNC,
    CHANNELS,
    COMPOSITE,
    CONTROL,
    EDGE,
    FUSE_HINT,
    NESTED,
    SCHEDULED,
    THREADS,
    _calls,
)

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


def _corpus_case(entry_id: str) -> None:
    entry = next(e for e in corpus_texts() if e.id == entry_id)
    before = hlo.parse(entry.text)
    after = before.clone()
    run_pipeline(after, "call-inliner")
    result = runtime.run_and_compare(before, after, rtol=0, atol=0)
    assert result.ok, str(result)


_ALL = [p.name + sfx for p in PROGRAMS for sfx in ("", ".opt")]


_SAMPLE = ["custom_vjp", "reductions_mixed_dtypes", "shmap_grad_accumulation", "while_fori_cond"]


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


def test_composites_lose_their_attributes_unless_preserved():
    _, after, _ = _inline(COMPOSITE)
    assert not _calls(after)
    assert after.entry.root.frontend_attributes == {"keep": "me"}  # non-composite attributes stay
    assert all(not i.frontend_attributes for i in after.entry.instructions if i is not after.entry.root)
    _, after, _ = _inline(COMPOSITE, "call-inliner{composites_to_preserve=foo.add:foo.mul}")
    assert [c.frontend_attributes["composite.name"] for c in _calls(after)] == ["foo.add", "foo.mul"]
    assert CallInliner(composites_to_preserve=("foo.mul",)).describe() == "call-inliner{composites_to_preserve=foo.mul}"


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


def test_fusion_hints_go_to_fusible_instructions_and_the_root_takes_the_calls_annotations():
    _, after, _ = _inline(FUSE_HINT)
    e = after.entry
    hinted = {i.opcode for i in e.instructions if "MUST_FUSE" in i.frontend_attributes}
    assert hinted == {"constant", "tuple", "get-tuple-element", "exponential"}  # not the while
    assert e.root.frontend_attributes == {"MUST_FUSE": "group1"}  # it had one, so the call's are not copied
    assert str(e.root.sharding) == "{replicated}"


def test_uniquify_channel_ids():
    _, after, _ = _inline(CHANNELS, run=False)
    assert {i.attrs["channel_id"] for i in after.entry.instructions if i.opcode == "all-gather"} == {1337}
    _, after, _ = _inline(CHANNELS, "call-inliner{uniquify_channel_ids=true}", run=False)
    ids = [i.attrs["channel_id"] for i in after.entry.instructions if i.opcode == "all-gather"]
    assert len(set(ids)) == 2 and min(ids) > 1337


def test_execution_threads_filter():
    _, after, _ = _inline(THREADS, run=False)
    assert not _calls(after)
    _, after, _ = _inline(THREADS, "call-inliner{execution_threads=secondary_thread}", run=False)
    assert [c.name for c in _calls(after)] == ["call.0"]
    assert after.computation("secondary_outer").root.operand(1).opcode == "constant"


def test_scheduled_module_keeps_callee_sequences_in_place():
    _, after, _ = _inline(SCHEDULED)
    assert after.is_scheduled
    assert [i.opcode for i in after.entry.instructions] == [
        "parameter", "parameter", "abs", "abs", "tuple", "get-tuple-element", "get-tuple-element", "add"]


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
