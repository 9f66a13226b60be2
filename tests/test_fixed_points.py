"""What a rerun of a clean-up pass skips (passes/framework/fixed_points.py, `module_opcodes`, the scans' opcode
filters), and that what it skips could not have changed: structure checks, no jax."""

from __future__ import annotations

import pytest
from hlopt.hlo.ir import Instruction
from hlopt.hlo.shape import Shape
from hlopt.passes.algebraic_simplifier import AlgebraicSimplifier
from hlopt.passes.cse import CommonSubexpressionElimination
from hlopt.passes.dot_strength_reduction import DotStrengthReduction
from hlopt.passes.framework.base import module_opcodes, non_fusion_computations
from hlopt.passes.framework.pipeline import run_pipeline

from hlopt import hlo

TWO = """
HloModule two

%body (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %e = f32[4] exponential(%p)
  ROOT %t = f32[4] tanh(%e)
}

ENTRY %main (x: f32[4], y: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  %y = f32[4] parameter(1)
  %a = f32[4] add(%x, %y)
  %c = f32[4] call(%a), to_apply=%body
  ROOT %m = f32[4] multiply(%c, %a)
}
"""


def _visits(monkeypatch: pytest.MonkeyPatch, cls: type) -> list[str]:
    """The names of the computations `cls.run_on_computation` is called on from now on."""
    seen: list[str] = []
    original = cls.run_on_computation

    def counting(self, comp, *args, **kwargs):  # noqa: ANN001, ANN202
        seen.append(comp.name)
        return original(self, comp, *args, **kwargs)

    monkeypatch.setattr(cls, "run_on_computation", counting)
    return seen


def test_cse_rerun_visits_only_what_was_edited_and_its_callers(monkeypatch: pytest.MonkeyPatch) -> None:
    m = hlo.parse(TWO)
    cse = CommonSubexpressionElimination()
    seen = _visits(monkeypatch, CommonSubexpressionElimination)
    assert not cse.run(m)
    assert sorted(seen) == ["body", "main"]
    seen.clear()
    assert not cse.run(m)
    assert seen == []  # nothing edited: every computation is as the last run left it
    body = m.computation("body")
    e = body.instruction("e")
    twin = body.add(Instruction("exponential", e.shape, [body.parameter(0)]), before=body.root)
    body.root.replace_operands([twin])  # %t now reads a duplicate of %e
    assert cse.run(m)
    assert seen == ["body", "main"]  # the edited callee and its caller (which reads the callee's structure)
    assert [i.opcode for i in body.instructions].count("exponential") == 1
    seen.clear()
    assert not cse.run(m)
    assert seen == []


def test_cse_rerun_sees_a_shape_written_without_an_edit(monkeypatch: pytest.MonkeyPatch) -> None:
    m = hlo.parse(TWO)
    cse = CommonSubexpressionElimination()
    cse.run(m)
    seen = _visits(monkeypatch, CommonSubexpressionElimination)
    body = m.computation("body")
    e = body.instruction("e")
    e.shape = Shape("f16", (4,))  # written directly, no IR edit: seen by the shape comparison
    cse.run(m)
    assert seen == ["body", "main"]


def test_cse_options_and_partitions_keep_their_own_record(monkeypatch: pytest.MonkeyPatch) -> None:
    m = hlo.parse(TWO)
    CommonSubexpressionElimination().run(m)
    seen = _visits(monkeypatch, CommonSubexpressionElimination)
    CommonSubexpressionElimination(is_layout_sensitive=False).run(m)
    assert sorted(seen) == ["body", "main"]  # another configuration: its own record
    seen.clear()
    m.config["num_partitions"] = 2  # side effects read the partition count
    CommonSubexpressionElimination().run(m)
    assert sorted(seen) == ["body", "main"]


REDUCE = """
HloModule reduce

%mul (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] multiply(%a, %b)
}

ENTRY %main (x: f32[4,1]) -> f32[4] {
  %x = f32[4,1] parameter(0)
  %zero = f32[] constant(0)
  ROOT %s = f32[4] reduce(%x, %zero), dimensions={1}, to_apply=%mul
}
"""


def test_algebraic_simplifier_rerun_sees_an_edited_reducer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reduce over a size-1 dimension is a reshape only when its init is the reducer's identity: 0 is not
    multiply's. Once the reducer adds, the reduce's computation (unedited itself) must be visited again."""
    m = hlo.parse(REDUCE)
    simplifier = AlgebraicSimplifier()
    assert not simplifier.run(m)
    seen = _visits(monkeypatch, AlgebraicSimplifier)
    assert not simplifier.run(m)
    assert seen == ["mul", "main"]  # (visited, and passed over at once: both hold)
    reducer = m.computation("mul")
    add = reducer.add(Instruction("add", reducer.root.shape, list(reducer.root.operands)))
    old = reducer.root
    reducer.set_root(add)
    reducer.remove(old)
    assert simplifier.run(m)
    assert [i.opcode for i in m.entry.instructions] == ["parameter", "reshape"]


def test_algebraic_simplifier_pass_over_draws_the_ids_a_visit_would() -> None:
    """Instruction ids order sets of instructions (their hash): a computation passed over draws as many ids
    as visiting it would have."""
    m = hlo.parse(TWO)
    simplifier = AlgebraicSimplifier()
    simplifier.run(m)
    before = Instruction.id_watermark()
    simplifier.run(m)  # every computation passed over
    passed_over = Instruction.id_watermark() - before
    rules, effects = simplifier.rules(), None
    before = Instruction.id_watermark()
    for comp in non_fusion_computations(m):
        simplifier.run_on_computation(comp, rules, effects)  # visited (no record given)
    visited = Instruction.id_watermark() - before
    assert passed_over == visited


def test_algebraic_simplifier_rerun_after_an_edit_finds_the_new_match() -> None:
    m = hlo.parse(TWO)
    simplifier = AlgebraicSimplifier()
    simplifier.run(m)
    entry = m.entry
    a = entry.instruction("a")
    n1 = entry.add(Instruction("negate", a.shape, [a]), before=entry.root)
    n2 = entry.add(Instruction("negate", a.shape, [n1]), before=entry.root)
    entry.root.replace_operands([entry.root.operand(0), n2])  # multiply(%c, negate(negate(%a)))
    assert simplifier.run(m)
    assert entry.root.operand(1) is a


def test_a_pipeline_fix_group_leaves_the_same_module_as_passes_that_remember_nothing() -> None:
    """The fix group with the records against the same passes run on a fresh parse each time (no record)."""
    text = TWO.replace("ROOT %m = f32[4] multiply(%c, %a)",
                       "%d = f32[4] add(%y, %x)\n  ROOT %m = f32[4] multiply(%c, %d)")
    m = hlo.parse(text)
    run_pipeline(m, "fix(algebraic-simplifier,tuple-simplifier,cse,dce)")
    fresh = hlo.parse(text)
    for _ in range(3):
        fresh = hlo.parse(fresh.to_text())  # a new module each round: no pass remembers anything of it
        run_pipeline(fresh, "algebraic-simplifier,tuple-simplifier,cse,dce")
    assert m.to_text() == fresh.to_text()


def test_module_opcodes_follow_edits_and_scans_without_their_opcodes_return_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    m = hlo.parse(TWO)
    assert "dot" not in module_opcodes(m) and "call" in module_opcodes(m)
    asked: list[str] = []
    monkeypatch.setattr(DotStrengthReduction, "instruction_matches",
                        lambda self, inst: asked.append(inst.opcode) or False)
    assert not DotStrengthReduction().run(m)
    assert asked == []  # no dot in the module: nothing asked
    entry = m.entry
    a = entry.instruction("a")
    dot = entry.add(Instruction("dot", Shape("f32", ()), [a, a], lhs_contracting_dims=(0,),
                                rhs_contracting_dims=(0,)), before=entry.root)
    assert "dot" in module_opcodes(m)  # found again after the edit
    assert not DotStrengthReduction().run(m)
    assert asked == ["dot"]  # only the dot is asked
    entry.remove(dot)
    assert "dot" not in module_opcodes(m)


def test_what_passes_remember_of_a_module_goes_with_it() -> None:
    """The records (fixed points, module facts) keep no module alive."""
    import gc
    import weakref

    m = hlo.parse(TWO)
    run_pipeline(m, "simplify,dot-strength-reduction,fix(algebraic-simplifier,cse)")
    non_fusion_computations(m)
    gone = weakref.ref(m)
    del m
    gc.collect()
    assert gone() is None


def test_a_paranoid_pipeline_trusts_no_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paranoid runs also catch edits the IR does not stamp: the passes visit everything again."""
    from hlopt.passes.framework.pipeline import Pipeline

    m = hlo.parse(TWO)
    CommonSubexpressionElimination().run(m)
    seen = _visits(monkeypatch, CommonSubexpressionElimination)
    Pipeline.parse("cse").run(m)
    assert seen == []
    Pipeline.parse("cse", paranoid=True).run(m)
    assert sorted(seen) == ["body", "main"]
