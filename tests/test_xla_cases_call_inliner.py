"""call-inliner conformance: ../shared/xla_cases/call_inliner/*.hlo (from XLA's call_inliner_test.cc) give the
results INDEX.md records; modules XLA:CPU can run are also run before and after."""

from __future__ import annotations

from pathlib import Path

import pytest
from hlopt.passes.framework.pipeline import run_pipeline

from hlopt import hlo, runtime

CASES = Path(__file__).resolve().parents[2] / "shared" / "xla_cases" / "call_inliner"

pytestmark = pytest.mark.skipif(not CASES.is_dir(), reason="../shared/xla_cases/call_inliner is not present")

EXPECTED = {
    "InlineSingleUseCalleesOnly.hlo", "InlineCompositeCall.hlo", "DontInlineCallWithAttributeInlineableFalse.hlo",
    "ControlDepsPropagateToRootOfInlinedInstructions.hlo", "InliningMergesOpMetadataRecursively.hlo",
    "InlineScheduledModule.hlo",
}


def _case(name: str) -> hlo.Module:
    return hlo.parse_file(CASES / name)


def _opcodes(comp) -> list[str]:
    return [i.opcode for i in comp.instructions]


def _inline(module: hlo.Module, spec: str = "call-inliner") -> bool:
    changed = run_pipeline(module, spec).changed
    runtime.xla_canonical_text(module.to_text())  # XLA's own parser accepts the result
    return changed


def _same_results(before: hlo.Module, after: hlo.Module) -> None:
    result = runtime.run_and_compare(before, after, rtol=0, atol=0)
    assert result.ok, str(result)


def test_every_case_has_an_expectation():
    assert {p.name for p in CASES.glob("*.hlo")} <= EXPECTED


def test_inline_single_use_callees_only():
    m = _case("InlineSingleUseCalleesOnly.hlo")
    assert _inline(m, "call-inliner{single_call_site=true}")
    assert _opcodes(m.entry) == ["call", "call", "tuple", "tuple"]
    assert [c.name for c in m.computations] == ["a", "inline"]  # b was inlined and removed; a stays


def test_inline_composite_call_drops_composite_attributes():
    before = _case("InlineCompositeCall.hlo")
    m = before.clone()
    assert _inline(m, "call-inliner{single_call_site=true}")
    assert _opcodes(m.entry) == ["constant", "constant", "add"]
    assert m.entry.root.frontend_attributes == {}
    _same_results(before, m)


def test_preserve_composite_call():
    m = _case("InlineCompositeCall.hlo")
    assert not _inline(m, "call-inliner{single_call_site=true,composites_to_preserve=foo.bar}")
    assert _opcodes(m.entry) == ["constant", "call"]
    assert m.entry.root.frontend_attributes["composite.name"] == "foo.bar"


@pytest.mark.parametrize("spec", ["call-inliner", "call-inliner{use_shardy_partitioner=true}"])
def test_dont_inline_call_with_inlineable_false(spec):
    m = _case("DontInlineCallWithAttributeInlineableFalse.hlo")
    assert not _inline(m, spec)
    call = next(i for i in m.entry.instructions if i.opcode == "call")
    assert call.attrs["to_apply"].name == "test"


def test_control_deps_propagate_to_root_of_inlined_instructions():
    m = _case("ControlDepsPropagateToRootOfInlinedInstructions.hlo")
    assert _inline(m)
    e = m.entry
    inlined = [i for i in e.instructions if i.opcode in ("constant", "add", "subtract")]
    assert sorted(i.opcode for i in inlined) == ["add", "constant", "constant", "subtract"]
    assert all([p.name for p in i.control_predecessors] == ["call1"] for i in inlined)
    res = next(i for i in inlined if i.opcode == "subtract")
    assert e.instruction("call3").control_predecessors == (res,)
    assert e.root.operand(1) is res
    assert res.operand(0).opcode == "add" and res.operand(0).operand(0).name == "p1"


def test_inlining_merges_op_metadata_recursively():
    before = _case("InliningMergesOpMetadataRecursively.hlo")
    m = before.clone()
    assert _inline(m)
    root = m.entry.root
    assert root.opcode == "while" and root.metadata.op_name == "x/while"
    assert root.attrs["condition"].root.metadata.op_name == "x/while/cond"
    assert root.attrs["body"].root.metadata.op_name == "x/while/body"
    _same_results(before, m)


def test_inline_scheduled_module_splices_the_sequences():
    m = _case("InlineScheduledModule.hlo")
    assert _inline(m, "call-inliner{execution_threads=main}")
    assert m.is_scheduled
    assert _opcodes(m.entry) == [
        "parameter", "get-tuple-element", "call-start", "get-tuple-element", "constant", "add", "call-done",
        "tuple", "get-tuple-element", "call-start", "get-tuple-element", "constant", "add", "call-done", "tuple",
    ]
    seq = m.entry.instructions
    assert seq[8].operand(0) is seq[7] and seq[10].operand(0) is seq[7]  # the second copy reads the first's tuple
    assert seq[6].operand(0) is seq[2] and seq[13].operand(0) is seq[9]  # each done pairs with its own start
    assert m.entry.root is seq[-1]  # (XLA:CPU cannot compile this module's async call, so no run)
