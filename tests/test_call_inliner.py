"""call-inliner: XLA's test cases (../shared/xla_cases), our own modules, numerics on XLA CPU."""

from __future__ import annotations

import pytest

import hlo
import runtime
from passes.pipeline import run_pipeline

pytestmark = []


def _case(shared_dir, name):
    return hlo.parse_file(shared_dir / "xla_cases" / "call_inliner" / name)


def _ops(comp):
    return [i.opcode for i in comp.instructions]


def test_xla_inline_single_use_callees_only(shared_dir):
    m = _case(shared_dir, "InlineSingleUseCalleesOnly.hlo")
    assert run_pipeline(m, "call-inliner{single_call_site=true}").changed
    assert _ops(m.entry) == ["call", "call", "tuple", "tuple"]


def test_xla_inline_composite_call(shared_dir):
    m = _case(shared_dir, "InlineCompositeCall.hlo")
    assert run_pipeline(m, "call-inliner{single_call_site=true}").changed
    assert _ops(m.entry) == ["constant", "constant", "add"]
    assert m.entry.root.frontend_attributes == {}
    preserved = _case(shared_dir, "InlineCompositeCall.hlo")
    assert not run_pipeline(preserved, "call-inliner{composites_to_preserve=foo.bar}").changed
    assert preserved.entry.root.opcode == "call"
    assert preserved.entry.root.frontend_attributes["composite.name"] == "foo.bar"


def test_xla_dont_inline_inlineable_false(shared_dir):
    m = _case(shared_dir, "DontInlineCallWithAttributeInlineableFalse.hlo")
    assert not run_pipeline(m, "call-inliner").changed
    assert "call" in _ops(m.entry)


def test_xla_control_deps_propagate_to_root(shared_dir):
    m = _case(shared_dir, "ControlDepsPropagateToRootOfInlinedInstructions.hlo")
    assert run_pipeline(m, "call-inliner").changed
    e = m.entry
    inlined = [i for i in e.instructions if i.opcode in ("constant", "add", "subtract")]
    assert len(inlined) == 4
    assert all([p.name for p in i.control_predecessors] == ["call1"] for i in inlined)
    call3 = e.instruction("call3")
    assert [p.opcode for p in call3.control_predecessors] == ["subtract"]


def test_xla_op_name_metadata_recursion(shared_dir):
    m = _case(shared_dir, "InliningMergesOpMetadataRecursively.hlo")
    assert run_pipeline(m, "call-inliner").changed
    root = m.entry.root
    assert root.opcode == "while" and root.metadata.op_name == "x/while"
    assert root.attrs["condition"].root.metadata.op_name == "x/while/cond"
    assert root.attrs["body"].root.metadata.op_name == "x/while/body"


def test_xla_inline_scheduled_module(shared_dir):
    m = _case(shared_dir, "InlineScheduledModule.hlo")
    assert run_pipeline(m, "call-inliner").changed
    assert m.is_scheduled
    names = [i.opcode for i in m.entry.instructions]
    assert names == ["parameter", "get-tuple-element", "call-start", "get-tuple-element", "constant", "add",
                     "call-done", "tuple", "get-tuple-element", "call-start", "get-tuple-element", "constant",
                     "add", "call-done", "tuple"]
    runtime.xla_canonical_text(m.to_text())  # XLA accepts the spliced schedule


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


def test_nested_calls_inline_fully_and_numerics_match():
    before = hlo.parse(NESTED)
    after = before.clone()
    assert run_pipeline(after, "call-inliner").changed
    assert not any(i.opcode == "call" for i in after.instructions())
    assert [c.name for c in after.computations] == ["main"]
    op_names = {i.metadata.op_name for i in after.entry.instructions if i.metadata is not None}
    assert "top/mid/leaf/leaf_exp" in op_names
    assert runtime.run_and_compare(before, after).ok


def test_single_call_site_keeps_shared_callee():
    m = hlo.parse(NESTED)
    assert run_pipeline(m, "call-inliner{single_call_site=true}").changed
    assert sum(i.opcode == "call" for i in m.entry.instructions) == 2  # %mid has two sites
    assert all(i.opcode != "call" for i in m.computation("mid").instructions)


def test_backend_config_call_is_left_alone():
    text = NESTED.replace('to_apply=%leaf, metadata={op_name="mid/leaf"}',
                          'to_apply=%leaf, backend_config={"x":1}')
    m = hlo.parse(text)
    run_pipeline(m, "call-inliner")
    assert any(i.opcode == "call" for i in m.instructions())


def test_op_name_cap():
    long = "x" * 1020
    m = hlo.parse(NESTED.replace('op_name="top"', f'op_name="{long}"'))
    run_pipeline(m, "call-inliner")
    assert all(len((i.metadata or {}).get("op_name", "")) < 1024 + 20 for i in m.instructions())


@pytest.mark.parametrize("name", ["transformer_train_step", "while_fori_cond", "shmap_grad_accumulation",
                                  "custom_vjp", "linalg"])
def test_corpus_programs_inline_and_match(name):
    from corpus import corpus_texts

    entry = next(e for e in corpus_texts() if e.id == name)
    before = hlo.parse(entry.text)
    after = before.clone()
    run_pipeline(after, "call-inliner")
    result = runtime.run_and_compare(before, after)
    assert result.ok, str(result)
