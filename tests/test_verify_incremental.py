"""Incremental verification (`hlo.verifier.verify_changes`, the pipeline's verify_each): what changed since
the last verification is checked again, whether the edit went through the IR's methods, an `attrs` write or
a direct `shape` write; what did not change is not checked again; the pipeline's record says what was."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from hlopt.hlo import verifier as verifier_module
from hlopt.hlo.shape import Shape
from hlopt.hlo.verifier import HloVerifyError, verify_changes
from hlopt.passes import ModulePass, register
from hlopt.passes.framework.pipeline import PassFailure, Pipeline

from hlopt import hlo

ADD_F32 = """
add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""

MODULE = "HloModule m\n" + ADD_F32 + """
ENTRY main {
  p = f32[4,8] parameter(0)
  q = f32[4,8] parameter(1)
  n = f32[4,8] negate(p)
  m = f32[4,8] multiply(n, q)
  zero = f32[] constant(0)
  ROOT r = f32[4] reduce(m, zero), dimensions={1}, to_apply=add_f32
}
"""


def _checked_by(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Record (computation, instruction) of every per-instruction check from now on."""
    seen: list[tuple[str, str]] = []
    checker = vars(verifier_module)["_Checker"]  # the verifier's internal walker: spied on, not used
    real = checker.check_instruction

    def spy(self, comp, inst, pos):
        seen.append((comp.name, inst.name))
        return real(self, comp, inst, pos)

    monkeypatch.setattr(checker, "check_instruction", spy)
    return seen


def test_first_verification_is_full_and_an_untouched_module_rechecks_nothing(monkeypatch):
    module = hlo.parse(MODULE)
    checkpoint, scope = verify_changes(module)
    assert scope.full and scope.instructions_checked == module.instruction_count()
    seen = _checked_by(monkeypatch)
    _, scope = verify_changes(module, checkpoint)
    assert not scope.full and scope.computations_checked == 0 and seen == []


def test_an_edit_in_one_computation_leaves_the_other_unchecked(monkeypatch):
    module = hlo.parse(MODULE)
    checkpoint, _ = verify_changes(module)
    entry = module.entry
    n = entry.instruction("n")
    abs_ = entry.add(hlo.Instruction("abs", n.shape, [entry.instruction("p")]), before=n)
    n.set_operand(0, abs_)
    seen = _checked_by(monkeypatch)
    _, scope = verify_changes(module, checkpoint)
    assert scope.computations_checked == 1 and {c for c, _ in seen} == {"main"}
    assert {"abs", "n", "p"} <= {i for _, i in seen} and "q" not in {i for _, i in seen}  # edits and neighbours


def test_a_broken_ir_edit_in_a_changed_computation_is_caught():
    module = hlo.parse(MODULE)
    checkpoint, _ = verify_changes(module)
    entry = module.entry
    entry.instruction("m").set_operand(0, entry.instruction("zero"))  # f32[] into an f32[4,8] multiply
    with pytest.raises(HloVerifyError, match="%m in %main"):
        verify_changes(module, checkpoint)


def test_an_attribute_only_edit_is_caught():
    module = hlo.parse(MODULE)
    checkpoint, _ = verify_changes(module)
    mutations = module.mutations
    module.entry.root.attrs["dimensions"] = (0,)  # reduces the 4, leaves f32[8], not the f32[4] it says
    assert module.mutations > mutations  # an attrs write is an IR edit
    with pytest.raises(HloVerifyError, match=r"%r in %main: shape f32\[4\] does not match the inferred f32\[8\]"):
        verify_changes(module, checkpoint)


def test_equal_attribute_writes_are_no_edit():
    module = hlo.parse(MODULE)
    mutations = module.mutations
    root = module.entry.root
    root.attrs["dimensions"] = (1,)
    root.attrs.setdefault("dimensions", (0,))
    assert module.mutations == mutations
    root.attrs.update(dimensions=(1,))
    assert module.mutations == mutations
    root.attrs.pop("dimensions")
    assert module.mutations == mutations + 1
    groups = [1, 2]
    root.attrs["dimensions"] = [1, 2]
    root.attrs["dimensions"] = groups  # equal: no edit, but the attribute is the object written
    assert root.attrs["dimensions"] is groups and module.mutations == mutations + 2


def test_a_direct_shape_write_is_caught_and_reaches_the_callers():
    module = hlo.parse(MODULE)
    checkpoint, _ = verify_changes(module)
    module.entry.instruction("n").shape = Shape("f32", (4, 9))  # no IR edit: found by comparing shapes
    with pytest.raises(HloVerifyError, match="%n in %main"):
        verify_changes(module, checkpoint)
    module = hlo.parse(MODULE)
    checkpoint, _ = verify_changes(module)
    reducer = module.computation("add_f32")
    reducer.parameters[0].shape = Shape("s32", ())  # the callee's signature, not the caller, changed
    with pytest.raises(HloVerifyError) as info:
        verify_changes(module, checkpoint)
    assert any(p.computation == "main" and p.instruction == "r" for p in info.value.problems)


def test_a_reorder_is_checked_in_full():
    module = hlo.parse(MODULE)
    checkpoint, _ = verify_changes(module)
    entry = module.entry
    order = list(entry.instructions)
    n, m = entry.instruction("n"), entry.instruction("m")
    i, j = order.index(n), order.index(m)
    order[i], order[j] = m, n  # m before its operand n: no instruction stamped
    entry.instructions = order
    assert entry.instructions.index(m) < entry.instructions.index(n)
    with pytest.raises(HloVerifyError, match="defined after its use"):
        verify_changes(module, checkpoint)


@register
@dataclass(frozen=True)
class _AttrBreaker(ModulePass):
    """Breaks the module by an attribute write alone (and says so)."""

    name: ClassVar[str] = "test-attr-breaker"

    def run(self, module: hlo.Module) -> bool:
        module.entry.root.attrs["dimensions"] = (0,)
        return True


@register
@dataclass(frozen=True)
class _Negator(ModulePass):
    """Wraps the entry's `n` in one more negate: an honest edit of the entry only."""

    name: ClassVar[str] = "test-negator"

    def run(self, module: hlo.Module) -> bool:
        entry = module.entry
        n = entry.instruction("n")
        twice = entry.add(hlo.Instruction("negate", n.shape, [n]), after=n)
        entry.instruction("m").set_operand(0, twice)
        return True


def test_pipeline_verifies_incrementally_and_records_it(monkeypatch):
    result = Pipeline.parse("test-negator").run(hlo.parse(MODULE))
    assert result.records[0].verified.startswith("incremental: 1/2 computations")
    paranoid = Pipeline.parse("test-negator", paranoid=True).run(hlo.parse(MODULE))
    assert paranoid.records[0].verified == "full (paranoid)"
    with pytest.raises(PassFailure, match="test-attr-breaker.*no longer verifies"):
        Pipeline.parse("test-negator,test-attr-breaker").run(hlo.parse(MODULE))


CHANNELS = "HloModule c\n" + ADD_F32 + """
ENTRY main {
  p = f32[8] parameter(0)
  tok = token[] after-all()
  s = (f32[8], u32[], token[]) send(p, tok), channel_id=2
  sd = token[] send-done(s), channel_id=2
  ar = f32[8] all-reduce(p), channel_id=1, replica_groups={}, to_apply=add_f32
  ROOT r = f32[8] negate(ar)
}
"""


def test_channels_and_callers_are_checked_after_edits_across_checkpoints():
    """What the verifier lists per computation (channel instructions, callers) is carried from checkpoint
    to checkpoint and listed again where an edit happened: a channel clash made two verifications after
    the first is still caught, and so is a callee whose signature changed under an unedited caller."""
    module = hlo.parse(CHANNELS)
    checkpoint, _ = verify_changes(module)
    entry = module.entry
    entry.add(hlo.Instruction("negate", entry.root.shape, [entry.root]), after=entry.root)
    checkpoint, _ = verify_changes(module, checkpoint)  # an unrelated edit: still clean
    entry.instruction("ar").attrs["channel_id"] = 2  # the send's channel: send/recv channels are theirs alone
    with pytest.raises(HloVerifyError, match="channel 2 is used by different kinds"):
        verify_changes(module, checkpoint)
    entry.instruction("ar").attrs["channel_id"] = 1
    checkpoint, _ = verify_changes(module, checkpoint)
    reducer = module.computation("add_f32")
    reducer.root.set_operand(1, reducer.root.operand(0))
    reducer.parameters[1].shape = Shape("s32", ())  # the all-reduce in the unedited entry no longer fits
    with pytest.raises(HloVerifyError, match="add_f32"):
        verify_changes(module, checkpoint)


def test_a_callee_leaving_the_module_is_caught_in_an_unedited_caller():
    """The callers are found by each computation's remembered calling instructions (`Computation._calling`,
    kept until its next edit): a callee removed from the module is reported at its caller, which no edit
    touched, whether or not an earlier verification walked that caller's calls already."""
    module = hlo.parse(MODULE)
    checkpoint, _ = verify_changes(module)
    module.remove_computation(module.computation("add_f32"))
    with pytest.raises(HloVerifyError, match=r"%r in %main: calls computation %add_f32, which is not in the module"):
        verify_changes(module, checkpoint)
    module = hlo.parse(MODULE)
    checkpoint, _ = verify_changes(module)
    reducer = module.computation("add_f32")
    reducer.root.set_operand(1, reducer.root.operand(0))  # a root edit: its callers are checked (and listed)
    checkpoint, _ = verify_changes(module, checkpoint)
    module.remove_computation(reducer)
    with pytest.raises(HloVerifyError, match="which is not in the module"):
        verify_changes(module, checkpoint)


def test_a_direct_name_write_in_an_unedited_computation_is_caught():
    module = hlo.parse(MODULE)
    checkpoint, _ = verify_changes(module)
    reducer = module.computation("add_f32")
    reducer.parameters[1].name = reducer.parameters[0].name  # no IR edit: found by comparing names
    with pytest.raises(HloVerifyError, match="name %a is used twice in the computation"):
        verify_changes(module, checkpoint)


def test_a_reorder_that_puts_a_control_predecessor_after_its_successor_is_caught():
    module = hlo.parse(MODULE)
    entry = module.entry
    n, zero = entry.instruction("n"), entry.instruction("zero")
    zero.add_control_predecessor(n)  # zero runs after n
    checkpoint, _ = verify_changes(module)
    order = [i for i in entry.instructions if i is not zero]
    order.insert(0, zero)  # zero first: its operands are fine (none), its control predecessor is not
    entry.instructions = order
    with pytest.raises(HloVerifyError, match="control predecessor %n does not come before it"):
        verify_changes(module, checkpoint)


def test_a_private_rewiring_found_by_a_reorder_is_reported_as_before():
    """After a reorder the whole order is judged (in bulk first); an operand slot written privately to an
    instruction of another computation is reported as the walk one by one reports it."""
    module = hlo.parse(MODULE)
    checkpoint, _ = verify_changes(module)
    entry = module.entry
    stray = module.computation("add_f32").parameters[0]
    entry.instruction("m")._operands[1] = stray  # noqa: SLF001 (a private write: no stamp, no user entry)
    order = list(entry.instructions)
    order.remove(entry.instruction("zero"))
    order.insert(0, entry.instruction("zero"))  # an honest reorder (structure edit)
    entry.instructions = order
    with pytest.raises(HloVerifyError, match="operand %a is not in this computation"):
        verify_changes(module, checkpoint)


def test_a_channel_clash_inside_a_new_computation_is_caught():
    """A new computation's channel instructions are found (a scan of its opcodes) and grouped with the rest:
    a send on the all-reduce's channel, in a computation added before the entry, is reported."""
    module = hlo.parse(CHANNELS)
    checkpoint, _ = verify_changes(module)
    entry = module.entry
    p = entry.instruction("p")
    side = hlo.parse("""HloModule s
ENTRY side {
  x = f32[8] parameter(0)
  tok = token[] after-all()
  s = (f32[8], u32[], token[]) send(x, tok), channel_id=1
  ROOT sd = token[] send-done(s), channel_id=1
}
""").entry
    side.module = None
    module.add_computation(side)
    entry.add(hlo.Instruction("call", side.root.shape, [p], to_apply=side), after=p)
    with pytest.raises(HloVerifyError, match="channel 1 is used by different kinds"):
        verify_changes(module, checkpoint)


FUSIBLE = "HloModule f\n" + """
ENTRY main {
  p = f32[4,8] parameter(0)
  n = f32[4,8] negate(p)
  ROOT t = f32[8,4] transpose(n), dimensions={1,0}
}
"""


def _fused_clones() -> tuple[hlo.Module, object, hlo.Computation]:
    """A verified module, its checkpoint, then the negate fused into the transpose: a new fused computation
    of clones of instructions the checkpoint's verification checked."""
    from hlopt.passes.fusion.fusion_building import fuse_into_new_fusion

    module = hlo.parse(FUSIBLE)
    checkpoint, _ = verify_changes(module)
    entry = module.entry
    fusion = fuse_into_new_fusion(entry.instruction("n"), entry.instruction("t"), last_use=True)
    fused = fusion.attrs["calls"]
    verify_changes(module, checkpoint)  # clean as built
    return module, checkpoint, fused


def _clone(fused: hlo.Computation, opcode: str) -> hlo.Instruction:
    return next(i for i in fused.instructions if i.opcode == opcode)


def test_a_wrong_shape_in_a_fused_clone_is_caught():
    """A clone inherits nothing from the instruction it copies: its shape, written wrong, is checked."""
    module, checkpoint, fused = _fused_clones()
    neg = _clone(fused, "negate")
    neg.shape = Shape("f32", (4, 9))
    with pytest.raises(HloVerifyError, match=f"%{neg.name} in %{fused.name}"):
        verify_changes(module, checkpoint)


def test_a_bad_attribute_in_a_fused_clone_is_caught_even_unstamped():
    """A clone's attribute made wrong, through `attrs` and behind the IR's back (no edit stamp), is checked:
    a new computation is checked in full."""
    for write in (lambda a, k, v: a.__setitem__(k, v), lambda a, k, v: dict.__setitem__(a, k, v)):
        module, checkpoint, fused = _fused_clones()
        tr = _clone(fused, "transpose")
        dims = tr.attrs["dimensions"]
        write(tr.attrs, "dimensions", type(dims)([0, 1]))
        with pytest.raises(HloVerifyError, match=f"%{tr.name} in %{fused.name}"):
            verify_changes(module, checkpoint)


def test_a_broken_link_in_a_fused_clone_is_caught():
    """A clone's use-def links are its own: an operand that no longer lists it as a user is reported."""
    module, checkpoint, fused = _fused_clones()
    tr = _clone(fused, "transpose")
    op = tr.operands[0]
    del op._users[tr]  # noqa: SLF001 (a private write, as a broken builder would leave it)
    with pytest.raises(HloVerifyError, match="lists this instruction 0 time"):
        verify_changes(module, checkpoint)


def test_a_stray_user_in_a_fused_clone_is_caught():
    """A users entry written into a clone behind the IR's back, naming an instruction that does not use it
    (every operand list still right), is reported: a new computation's users lists are checked too."""
    module, checkpoint, fused = _fused_clones()
    tr = _clone(fused, "transpose")
    param = next(i for i in fused.instructions if i.opcode == "parameter")
    param._users[tr] = 1  # noqa: SLF001 (a private write, as a broken builder would leave it)
    with pytest.raises(HloVerifyError, match="uses it 0 time"):
        verify_changes(module, checkpoint)


def test_a_mostly_edited_computation_is_checked_in_full():
    """The entry after a fusion is mostly new or edited instructions: it is checked in full (its users lists
    counted at once), and a stray users entry written behind the IR's back on an instruction no edit
    touched is still reported."""
    from hlopt.passes.fusion.fusion_building import fuse_into_new_fusion

    module = hlo.parse("HloModule g\n" + """
ENTRY main {
  p = f32[4,8] parameter(0)
  q = f32[4,8] parameter(1)
  n = f32[4,8] negate(p)
  e = f32[4,8] exponential(n)
  ROOT t = f32[8,4] transpose(e), dimensions={1,0}
}
""")
    checkpoint, _ = verify_changes(module)
    entry = module.entry
    fusion = fuse_into_new_fusion(entry.instruction("e"), entry.instruction("t"), last_use=True)
    fuse_into_new_fusion(entry.instruction("n"), fusion, last_use=True)
    _, scope = verify_changes(module, checkpoint)
    assert scope.instructions_checked == sum(len(c) for c in module.computations)  # all of it, entry included
    q = entry.instruction("q")
    assert q.edit_stamp <= checkpoint.stamp  # untouched by the fusion
    q._users[entry.root] = 1  # noqa: SLF001 (a private write, as a broken builder would leave it)
    with pytest.raises(HloVerifyError, match="uses it 0 time"):
        verify_changes(module, checkpoint)
