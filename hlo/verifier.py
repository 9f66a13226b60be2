"""The verifier: structural and shape invariants every module must keep between passes.

`verify(module)` raises `HloVerifyError` listing every error found, each naming the instruction and
computation and showing its neighbourhood as HLO text; `verify_report(module)` returns all problems
(errors and warnings) instead.

Checked: the entry and every callee present in the module; unique computation names; per computation a
root inside it, unique instruction names (module-wide duplicates are warnings), parameters numbered
0..n-1; use-def consistency (operands and users mirror each other with multiplicity, same computation,
parent links) and control edges; topological order of `computation.instructions` (operands and control
predecessors first; a scheduled module's order is its schedule) and no cycles; callee signatures (while,
conditional, call, fusion, async, reducers, sort/select/scatter comparators, map); replica groups and
source-target pairs of collectives (ids in range, each used once; replica groups required in
flattened-id mode); all-gather / reduce-scatter shard counts and all-to-all operand counts against the group
size; layout-constrained custom-calls (one constraint with a layout per operand, compatible shapes); the
module's entry_computation_layout against the entry's parameters and result; one kind of instruction per
channel_id; computations named only by instructions that call them; async start/done pairing;
and every result shape against shape inference (`hlo.shape_inference.check_shape`, layouts ignored).
These follow XLA's HloVerifier (openxla/xla xla/service/hlo_verifier.cc).

`verify_changes(module, checkpoint)` verifies incrementally: from the checkpoint a previous verification
left, it re-checks only what changed since (the IR's edit stamps, `hlo.ir.edit_stamp`, plus a comparison
of every instruction's shape and name, which passes may write directly), and says what it checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain, compress, repeat
from operator import attrgetter, is_not, lt

from hlopt.hlo.attributes import Raw
from hlopt.hlo.ir import Computation, Instruction, Module, edit_stamp
from hlopt.hlo.literal import Literal
from hlopt.hlo.opcodes import ASYNC_PAIRS, COLLECTIVES, async_base, is_known_opcode
from hlopt.hlo.shape import DTYPES, AnyShape, Shape, layout_problem, parse_shape, parse_shape_at
from hlopt.hlo.shape_inference import check_shape, conditional_branches, shapes_compatible
from hlopt.hlo.sharding_syntax import tuple_sharding_size

__all__ = ["verify", "verify_report", "verify_changes", "checkpoint_of", "HloVerifyError", "VerifyProblem",
           "VerifyCheckpoint", "VerifyScope"]

_SHOWN = 20
_RADIUS = 2


@dataclass
class VerifyProblem:
    """One broken invariant: where (computation, instruction), what, and the HLO around it."""

    computation: str
    instruction: str | None
    message: str
    context: str = ""
    severity: str = "error"  # "error" | "warning"

    def __str__(self) -> str:
        where = f"%{self.instruction} in %{self.computation}" if self.instruction else f"%{self.computation}"
        kind = "" if self.severity == "error" else f"{self.severity}: "
        return f"{kind}{where}: {self.message}" + (f"\n{self.context}" if self.context else "")


class HloVerifyError(ValueError):
    """The module breaks invariants; `.problems` lists the errors (warnings are left out)."""

    def __init__(self, problems: list[VerifyProblem], module_name: str = ""):
        self.problems = problems
        shown = "\n".join(str(p) for p in problems[:_SHOWN])
        more = f"\n... and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        where = f" in module {module_name}" if module_name else ""
        super().__init__(f"{len(problems)} verifier error(s){where}:\n{shown}{more}")


def verify_report(module: Module, unique_channel_ids: bool = False) -> list[VerifyProblem]:
    """Every problem found, errors and warnings (empty if the module is clean). `unique_channel_ids` adds
    XLA's optional check that collectives sharing a channel_id have one opcode (HloVerifierOpts'
    verify_unique_channel_ids, off by default: jax gives every collective of a shard_map channel 1)."""
    return _Checker(module, unique_channel_ids).run()


def verify(module: Module, unique_channel_ids: bool = False) -> None:
    """Raise HloVerifyError if the module breaks any invariant (warnings do not raise)."""
    errors = [p for p in verify_report(module, unique_channel_ids) if p.severity == "error"]
    if errors:
        raise HloVerifyError(errors, module.name)


@dataclass
class VerifyScope:
    """What one verification checked: every instruction (`full`) or the changed part of the module."""

    full: bool
    computations_checked: int
    computations: int
    instructions_checked: int
    instructions: int

    def __str__(self) -> str:
        if self.full:
            return f"full: {self.computations} computations, {self.instructions} instructions"
        return (f"incremental: {self.computations_checked}/{self.computations} computations, "
                f"{self.instructions_checked}/{self.instructions} instructions re-checked; module-wide checks")


#: A computation as a verification saw it: its instructions in order, their shapes, their names.
_Seen = tuple[tuple[Instruction, ...], list[AnyShape | None], list[str]]
_SHAPE_OF = attrgetter("shape")
_NAME_OF = attrgetter("name")
_OPCODE_OF = attrgetter("opcode")
#: a computation's or instruction's last IR edit (`edit_stamp`), and a computation's instruction count
_EDIT_OF = attrgetter("_edit")
_OPERANDS_OF = attrgetter("_operands")
_USERS_OF = attrgetter("_users")
_CONTROL_PREDS_OF = attrgetter("_control_preds")
_COUNT_OF = attrgetter("_count")
_INSTRUCTIONS_OF = attrgetter("instructions")


@dataclass
class VerifyCheckpoint:
    """What a clean verification saw, for `verify_changes` to start from: the edit clock's tick taken just
    before it, the entry, the module configuration, each computation's instructions, shapes and names, and
    the shape checks' results by what they read (valid while the configuration is the same)."""

    stamp: int
    entry: Computation | None
    config: dict  # the configuration the checks read (`_CHECKED_CONFIG`)
    seen: dict[Computation, _Seen]
    shape_memo: dict[tuple, str | None] = field(default_factory=dict)
    #: each computation's channel instructions, with its edit stamp then (`_Checker.check_channels`)
    channel_memo: dict[Computation, tuple[int, tuple[Instruction, ...]]] = field(default_factory=dict)


def verify_changes(module: Module, checkpoint: VerifyCheckpoint | None = None,
                   unique_channel_ids: bool = False) -> tuple[VerifyCheckpoint, VerifyScope]:
    """Verify `module` again after edits, re-checking only what changed since `checkpoint` (a full
    verification when it is None, or when the entry or the module configuration changed); raise
    HloVerifyError on errors, else return the new checkpoint and what was checked.

    Re-checked in full: computations added since, and those whose order changed with three quarters or more of
    their instructions stamped since (checking all costs less there). In another computation with edits: every
    instruction stamped after the checkpoint (`Instruction.edit_stamp`: operands, users, control edges, `attrs`
    writes, moves) or whose shape or name object changed, with their operands and users (all per-instruction
    checks: use-def, order, callees, collectives, shape inference); the computation's root, count, names and
    parameters; and, after a reorder, the order of all its instructions. Callers of computations whose root,
    parameters or their shapes changed have their callee checks run again (the entry has none: a call of it is
    an error the verification that made the checkpoint would have reported); every caller is checked for callees
    that left the module. Module-wide always: the entry, computation names and module links,
    entry_computation_layout, channels. Unchanged computations are not re-checked, and the warnings about names
    shared between computations come only from full verification. Not seen: changes made inside an attribute's
    value in place (a list or dict changed without writing `attrs[key]`), a non-caller opcode given a
    computation without an edit, and private-field writes (among them an instruction's `attrs` replaced whole:
    the callers of a changed callee are found by each computation's calling instructions as its last IR edit
    left them, `Computation._calling`); `verify` checks everything."""
    stamp = edit_stamp()
    checker = _Checker(module, unique_channel_ids)
    scope = checker.run_changes(checkpoint)
    errors = [p for p in checker.problems if p.severity == "error"]
    if errors:
        raise HloVerifyError(errors, module.name)
    return checker.checkpoint(stamp, checkpoint), scope


def checkpoint_of(module: Module) -> VerifyCheckpoint:
    """A checkpoint of `module` as it is now, checking nothing: for a caller that has just verified it
    (`verify`) and goes on with `verify_changes`."""
    return _Checker(module).checkpoint(edit_stamp(), None)


# ----------------------------------------------------------------------------- helpers


def _parameters_ok(comp: Computation, params: list[Instruction]) -> bool:
    """Whether `params` are numbered 0..n-1, each number once, and are the computation's parameter index:
    the common case of `_Checker.check_parameters`, which otherwise finds and reports what is wrong."""
    index = comp._params
    n = len(params)
    if len(index) != n:
        return False
    seen: set[int] = set()
    for p in params:
        k = p.attrs.get("parameter_number")
        if type(k) is not int or not 0 <= k < n or k in seen or index.get(k) is not p:
            return False
        seen.add(k)
    return True


def _line(inst: Instruction) -> str:
    try:
        text = inst.to_text()
    except Exception:  # noqa: BLE001 - a broken instruction must not break the report
        text = repr(inst)
    return text if len(text) <= 240 else text[:237] + "..."


#: Attribute value types a shape-check result may be remembered by (`_Checker.checked_shape`).
_PLAIN_VALUES = frozenset({int, str, bool, float, tuple, type(None), Raw})
#: The most shape-check results a checkpoint carries on.
_MEMO_LIMIT = 1 << 16
#: Attributes shape inference never reads.
_NOT_SHAPE_ATTRS = frozenset({"metadata", "frontend_attributes", "sharding", "statistics_viz", "backend_config"})


def _shape_key(inst: Instruction, operand_shapes: tuple[AnyShape, ...]) -> tuple | None:
    """What `check_shape(inst)` depends on, as a hashable key; None when an attribute value is not plain.
    A called computation counts by its root's and its parameters' shapes: all that shape inference reads
    of a callee is its root shape (`hlo.shape_inference._root`, `_scalar_result_types`)."""
    items = []
    for k, v in inst.attrs.items():
        if k in _NOT_SHAPE_ATTRS:
            continue
        t = type(v)
        if t not in _PLAIN_VALUES:
            if t is Computation:
                v = _callee_key(v)
            elif t is Literal:
                v = _LITERAL, v.text  # (a str caches its hash: a clone shares the text)
            elif t is list and k in _CALL_LIST_KEYS and all(type(c) is Computation for c in v):
                v = tuple(map(_callee_key, v))
            else:
                return None
        items.append((k, v))
    return inst.opcode, inst.shape, operand_shapes, tuple(items)


def _callee_key(comp: Computation) -> tuple:
    """What a shape-check key records of a called computation: its root's shape and its parameters' shapes."""
    root = comp.root
    return _CALLEE, None if root is None else root.shape, tuple(p.shape for p in comp.parameters)


#: Marks a called computation's part of a shape-check key (no attribute value is this object).
_CALLEE = object()
#: Marks a constant's literal in a shape-check key.
_LITERAL = object()
#: Attributes whose value is a list of computations.
_CALL_LIST_KEYS = frozenset({"branch_computations", "called_computations"})


def _same_ignoring_fp(a: str, b: str) -> bool:
    return a == b or (DTYPES[a].kind == "float" and DTYPES[b].kind == "float")


def _is_scalar(s: AnyShape | None) -> bool:
    return s is not None and not s.is_tuple and s.is_array and s.rank == 0


def _leaf_count(s: AnyShape) -> int:
    return sum(_leaf_count(e) for e in s.elements) if s.is_tuple else 1


def _leaves_of(s: AnyShape) -> list[AnyShape]:
    return list(s.elements) if s.is_tuple else [s]


_DEDICATED_DONE = {done: start for start, done in ASYNC_PAIRS.items() if start != "async-start"}


def _is_generic_async(opcode: str, suffixes: tuple[str, ...]) -> bool:
    base = async_base(opcode)
    return opcode in tuple("async" + s for s in suffixes) or (base is not None and opcode.endswith(suffixes))


@lru_cache(maxsize=1024)
def _may_be_async_follower(opcode: str) -> bool:
    """Whether `opcode` is an async -update/-done whose operand must be its start (`_async_operand_ok`)."""
    return opcode in _DEDICATED_DONE or _is_generic_async(opcode, ("-update", "-done"))


@lru_cache(maxsize=1024)
def _async_operand_ok(opcode: str, producer: str) -> bool | None:
    """Whether `producer` may feed the async -update/-done `opcode` (None if `opcode` is not one)."""
    if opcode in _DEDICATED_DONE:
        return producer == _DEDICATED_DONE[opcode]
    if _is_generic_async(opcode, ("-update", "-done")):
        return _is_generic_async(producer, ("-start", "-update"))
    return None


class _Checker:
    def __init__(self, module: Module, unique_channel_ids: bool = False):
        self.module = module
        self.unique_channel_ids = unique_channel_ids
        self.problems: list[VerifyProblem] = []
        #: each checked computation's positions, by `id` of the instruction (an int key hashes in C, where
        #: `Instruction.__hash__` is a Python call; the instructions are alive while checked, so ids are unique)
        self.positions: dict[Computation, dict[int, int]] = {}
        self.members: set[Computation] = set(module.computations)
        self.shape_memo: dict[tuple, str | None] = {}
        self.channel_memo: dict[Computation, tuple[int, tuple[Instruction, ...]]] = {}
        self.seen: dict[Computation, _Seen] = {}  # what `check_shell` saw of each computation it checked
        self.channel_ops: list[Instruction] = []  # those `check_instruction` saw (`_CHANNEL_OPS`)
        self.repeated = 0  # operand slots repeating an operand of the same instruction (`check_operands`)

    # ----------------------------------------------------------------- reporting
    def report(self, comp: Computation, inst: Instruction | None, message: str, severity: str = "error") -> None:
        context = self._context(comp, inst) if inst is not None else ""
        name = inst.name if inst is not None else None
        self.problems.append(VerifyProblem(comp.name, name, message, context, severity))

    def _context(self, comp: Computation, inst: Instruction) -> str:
        pos = self.positions.get(comp, {})
        i = pos.get(id(inst))
        if i is None:
            return "  >> " + _line(inst)
        order = comp.instructions
        lines = []
        for j in range(max(0, i - _RADIUS), min(len(order), i + _RADIUS + 1)):
            mark = ">>" if j == i else "  "
            root = "ROOT " if order[j] is comp.root else ""
            lines.append(f"  {mark} {root}{_line(order[j])}")
        return "\n".join(lines)

    # ----------------------------------------------------------------- incremental
    def run_changes(self, checkpoint: VerifyCheckpoint | None) -> VerifyScope:
        """Check what changed since `checkpoint` (everything without one); returns what was checked."""
        m = self.module
        total = sum(map(_COUNT_OF, m.computations))
        if checkpoint is None or checkpoint.entry is not m.entry or checkpoint.config != _checked_config(m):
            self.run()
            return VerifyScope(True, len(m.computations), len(m.computations), total, total)
        self.check_module_links()
        since = checkpoint.stamp
        self.shape_memo = checkpoint.shape_memo  # same module configuration: the results still hold
        self.channel_memo = checkpoint.channel_memo
        self.changed_shapes: dict[Computation, set[Instruction]] = {}
        signature_changed: set[Computation] = set()
        checked: set[Instruction] = set()  # the instructions re-checked in edited computations
        new: set[Computation] = set()  # computations checked in full
        new_instructions = 0
        comps_checked = 0
        comps = m.computations
        seens = list(map(checkpoint.seen.get, comps))
        edits = list(map(_EDIT_OF, comps))
        for comp, seen, edit in zip(comps, seens, edits, strict=True):
            if edit <= since and seen is not None:  # no IR edit: the same instructions; a direct write?
                order, shapes, names = seen
                if list(map(_SHAPE_OF, order)) == shapes and list(map(_NAME_OF, order)) == names:
                    continue
            if seen is None:  # new: its callers are new or edited (they name it), so checked already
                self.check_computation(comp)
                new.add(comp)
                new_instructions += len(comp)
                comps_checked += 1
                continue
            structure = comp.structure_stamp > since
            if structure and self.mostly_edited(comp, since):  # checked in full, like a new computation
                self.check_computation(comp)
                new.add(comp)
                new_instructions += len(comp)
                comps_checked += 1
                if comp is not m.entry:
                    signature_changed.add(comp)
                continue
            dirty, reshaped = self.changed_instructions(comp, seen, since)
            if not dirty and not structure:
                continue
            comps_checked += 1
            if comp is not m.entry and (structure or comp.root in dirty or any(p in dirty for p in comp.parameters)):
                signature_changed.add(comp)  # (the entry has no callers: one would have been reported already)
            checked |= self.check_computation_changes(comp, dirty, reshaped, structure)
        if signature_changed or not self.members.issuperset(checkpoint.seen):
            self.check_callers(signature_changed, checked, new)
        self.check_entry_layout()
        self.check_channels()
        return VerifyScope(False, comps_checked, len(m.computations), len(checked) + new_instructions, total)

    @staticmethod
    def mostly_edited(comp: Computation, since: int) -> bool:
        """Whether three quarters or more of the instructions of `comp` have IR edits after `since` (one
        C-level count): then checking all of them (`check_computation`, every check) costs less than finding
        what changed (the entry after fusion: most of it is new fusion instructions and their neighbours)."""
        order = comp.instructions
        return 4 * sum(map(since.__lt__, map(_EDIT_OF, order))) >= 3 * len(order)

    def changed_instructions(self, comp: Computation, seen: _Seen,
                             since: int) -> tuple[set[Instruction], set[Instruction]]:
        """(changed, reshaped): the instructions of `comp` stamped after `since`, new since the checkpoint,
        or whose shape or name is not the one the checkpoint saw; those of them whose shape is not."""
        order, shapes, names = seen
        if comp.edit_stamp <= since:  # no IR edit: the same instructions; only direct shape/name writes
            if list(map(_SHAPE_OF, order)) == shapes and list(map(_NAME_OF, order)) == names:
                return set(), set()
        # (by id: the checkpoint holds the old instructions, so an id here is the same object's)
        old = dict(zip(map(id, order), zip(shapes, names, strict=True), strict=True)).get
        dirty: set[Instruction] = set()
        reshaped: set[Instruction] = set()
        for inst in comp.instructions:
            was = old(id(inst))
            if was is None:
                dirty.add(inst)
            elif was[0] is not inst.shape and was[0] != inst.shape:
                dirty.add(inst)
                reshaped.add(inst)
            elif inst._edit > since or was[1] != inst.name:
                dirty.add(inst)
        return dirty, reshaped

    def check_computation_changes(self, comp: Computation, dirty: set[Instruction], reshaped: set[Instruction],
                                  structure: bool) -> set[Instruction]:
        """The checks of `check_computation` for the `dirty` instructions of `comp` and the users of the
        `reshaped` ones (their shape inference reads the new shape); the whole order when its structure
        changed. Returns the instructions checked.

        Operands and users whose use-def links an edit changed are stamped by the IR, so dirty already;
        an instruction added or moved is dirty and its position is checked by the order scan."""
        order = comp.instructions
        if not order:
            self.report(comp, None, "computation has no instructions")
            return set()
        pos = dict(zip(map(id, order), range(len(order)), strict=True))
        self.positions[comp] = pos
        self.check_shell(comp, order, pos)
        near: set[Instruction] = set(dirty)
        for inst in reshaped:
            near.update(inst._users)
        at = list(map(pos.get, map(id, near)))  # (None: not in this computation)
        recheck = list(map(order.__getitem__, sorted(compress(at, map(is_not, at, repeat(None))))))
        late = False
        for inst in recheck:
            late |= self.check_instruction(comp, inst, pos)
        if structure:
            late |= self.order_is_broken(order, pos, near)
            self.check_parameters(comp, order)
        if late:
            self.check_cycles(comp, pos)
        return set(recheck)

    def order_is_broken(self, order: tuple[Instruction, ...], pos: dict[int, int],
                        checked: set[Instruction]) -> bool:
        """Whether some operand or control predecessor comes after its user; the first such instruction
        outside `checked` (which `check_instruction` covered) is reported. When every operand is in the
        computation and before its user and there are no control edges (judged in one C-level pass), there
        is nothing to report."""
        operand_lists = list(map(_OPERANDS_OF, order))
        at = list(map(pos.get, map(id, chain.from_iterable(operand_lists))))
        if None not in at and all(map(lt, at, chain.from_iterable(map(repeat, range(len(order)), map(len, operand_lists))))) \
                and not any(map(_CONTROL_PREDS_OF, order)):
            return False
        for i, inst in enumerate(order):
            if inst in checked:
                continue
            for op in inst._operands:
                at = pos.get(id(op))
                if at is None:
                    self.report(inst.parent, inst, f"operand %{op.name} is not in this computation")
                elif at >= i:
                    self.report(inst.parent, inst, f"operand %{op.name} is defined after its use "
                                                   "(instructions are not in topological order)")
                    return True
            for pred in inst._control_preds:
                if pos.get(id(pred), -1) >= i:
                    self.report(inst.parent, inst, f"control predecessor %{pred.name} does not come before it")
                    return True
        return False

    def check_callers(self, signature_changed: set[Computation], checked: set[Instruction],
                      new: set[Computation]) -> None:
        """Run the callee checks again on every instruction that calls a computation in `signature_changed`
        or one that is not in the module (those of the `new` computations and the `checked` instructions
        had them already)."""
        members = self.members
        facts = _OPCODE_FACTS
        for comp in self.module.computations:
            if comp in new:
                continue
            for inst, callees in comp._calling():  # (remembered until the computation's next edit)
                if (signature_changed.isdisjoint(callees) and members.issuperset(callees)) or inst in checked \
                        or not (facts.get(inst.opcode) or _opcode_facts(inst.opcode))[1]:
                    continue
                self.check_calls(comp, inst)

    def checkpoint(self, stamp: int, previous: VerifyCheckpoint | None) -> VerifyCheckpoint:
        """The checkpoint of this (clean) verification: unchanged computations keep what was seen before."""
        seen: dict[Computation, _Seen] = {}
        old = previous.seen if previous is not None else {}
        now = self.seen
        for comp in self.module.computations:
            kept = now.get(comp)
            if kept is not None:
                seen[comp] = kept
                continue
            kept = old.get(comp)
            if kept is not None and comp not in self.positions and comp._edit < stamp:
                seen[comp] = kept
            else:
                order = comp.instructions
                seen[comp] = (order, list(map(_SHAPE_OF, order)), list(map(_NAME_OF, order)))
        memo = self.shape_memo if len(self.shape_memo) <= _MEMO_LIMIT else {}
        channels = {c: self.channel_memo[c] for c in self.module.computations if c in self.channel_memo}
        return VerifyCheckpoint(stamp, self.module.entry, _checked_config(self.module), seen, memo, channels)

    # ----------------------------------------------------------------- module
    def check_module_links(self) -> None:
        """The entry is in the module, computation names are unique, and each links back to the module."""
        m = self.module
        if m.entry is None or m.entry not in self.members:
            self.problems.append(VerifyProblem(m.name, None, "the module has no entry computation in it"))
        if len({c.name for c in m.computations}) != len(m.computations):
            for name, n in Counter(c.name for c in m.computations).items():
                if n > 1:
                    self.problems.append(VerifyProblem(name, None, f"computation name %{name} is used {n} times"))
        for comp in m.computations:
            if comp.module is not m:
                self.report(comp, None, "computation's module link does not point to this module")

    def run(self) -> list[VerifyProblem]:
        self.check_module_links()
        for comp in self.module.computations:
            self.check_computation(comp)
        self.check_module_names()
        self.check_entry_layout()
        self.check_channels()
        return self.problems

    def check_channels(self) -> None:
        """XLA's VerifyChannels: a channel whose first instruction is a send/recv serves only sends and
        receives; collectives may share a channel (jax gives them all channel 1) unless
        `unique_channel_ids` asks that they have one opcode."""
        by_channel: dict[int, list[tuple[Computation, Instruction]]] = {}
        memo = self.channel_memo
        for comp in self.module.computations:
            known = memo.get(comp)
            stamp = comp.edit_stamp  # (instructions come and go, and attributes change, by stamped edits only)
            if known is None or known[0] != stamp:
                order = comp.instructions
                known = memo[comp] = (stamp, () if _CHANNEL_OPS.isdisjoint(map(_OPCODE_OF, order)) else
                                      tuple(i for i in order if i.opcode in _CHANNEL_OPS))
            for inst in known[1]:
                channel = inst.attrs.get("channel_id")
                if isinstance(channel, int) and not isinstance(channel, bool):
                    by_channel.setdefault(channel, []).append((comp, inst))
        for channel, users in sorted(by_channel.items()):
            first = users[0][1].opcode
            if first in _SEND_RECV:
                strays = [(c, i) for c, i in users if i.opcode not in _SEND_RECV]
            elif self.unique_channel_ids:
                strays = [(c, i) for c, i in users if i.opcode != first]
            else:
                continue
            if strays:
                comp, inst = strays[0]
                kinds = {"send/recv" if i.opcode in _SEND_RECV else i.opcode for _, i in users}
                self.report(comp, inst, f"channel {channel} is used by different kinds of channel instructions "
                                        f"({', '.join(sorted(kinds))})")

    def check_entry_layout(self) -> None:
        """entry_computation_layout names as many parameters as the entry has, each with the parameter's
        shape, and the root's shape as the result (layouts aside), as XLA's HloVerifier checks."""
        text = self.module.config.get("entry_computation_layout")
        entry = self.module.entry
        if text is None or entry is None or entry.root is None or entry.root.shape is None:
            return
        try:
            params, result = _program_shape(str(text))
        except ValueError as e:
            self.problems.append(VerifyProblem(entry.name, None, f"entry_computation_layout: {e}"))
            return
        for what, shape in [*((f"parameter {i}", s) for i, s in enumerate(params)), ("result", result)]:
            problem = _layout_problem(shape)
            if problem:
                self.report(entry, None, f"entry_computation_layout's {what}: {problem}")
        ours = entry.parameters
        if len(params) != len(ours):
            self.report(entry, None, f"entry_computation_layout has {len(params)} parameter(s), the entry "
                                     f"computation {len(ours)}")
            return
        for i, (declared, p) in enumerate(zip(params, ours, strict=True)):
            if p.shape is not None and not shapes_compatible(declared, p.shape):
                self.report(entry, p, f"parameter {i} is {p.shape.to_text(layout=False)} but "
                                      f"entry_computation_layout says {declared.to_text(layout=False)}")
        if not shapes_compatible(result, entry.root.shape):
            self.report(entry, entry.root, f"the entry's result is {entry.root.shape.to_text(layout=False)} but "
                                           f"entry_computation_layout says {result.to_text(layout=False)}")

    def check_layout_constraints(self, comp: Computation, inst: Instruction) -> None:
        """A layout-constrained custom-call: one constraint per operand, each with a layout and the operand's
        shape (what XLA's parser checks)."""
        try:
            shapes = _shape_list(str(inst.attrs["operand_layout_constraints"]))
        except ValueError as e:
            self.report(comp, inst, f"operand_layout_constraints: {e}")
            return
        if len(shapes) != inst.operand_count:
            self.report(comp, inst, f"operand_layout_constraints lists {len(shapes)} shape(s) for "
                                    f"{inst.operand_count} operand(s)")
            return
        for i, (shape, op) in enumerate(zip(shapes, inst.operands, strict=True)):
            if any(leaf.layout is None and leaf.rank for leaf in shape.leaves()):  # XLA prints scalars bare
                self.report(comp, inst, f"operand_layout_constraints shape {i} has no layout")
            elif op.shape is not None and not shapes_compatible(shape, op.shape):
                self.report(comp, inst, f"operand_layout_constraints shape {i} is {shape.to_text(layout=False)} "
                                        f"but operand {i} is {op.shape.to_text(layout=False)}")

    def check_module_names(self) -> None:
        """Warn about instruction names used in more than one computation (none when every name in the
        module is distinct: one C-level pass decides that)."""
        comps = self.module.computations
        names = list(map(_NAME_OF, chain.from_iterable(map(_INSTRUCTIONS_OF, comps))))
        if len(set(names)) == len(names):
            return
        seen: dict[str, Computation] = {}
        for comp in self.module.computations:
            reported: set[int] = set()  # (an instruction listed twice, which check_shell reports, warns once)
            for inst in comp.instructions:
                first = seen.setdefault(inst.name, comp)
                if first is not comp and id(inst) not in reported:
                    reported.add(id(inst))
                    self.report(comp, inst, f"name %{inst.name} is also used in %{first.name} (XLA "
                                            "renames such duplicates when it parses the module)", severity="warning")

    # ----------------------------------------------------------------- computation
    def check_computation(self, comp: Computation) -> None:
        order = comp.instructions
        if not order:
            self.report(comp, None, "computation has no instructions")
            return
        pos = dict(zip(map(id, order), range(len(order)), strict=True))
        self.positions[comp] = pos
        mark = len(self.problems)
        self.repeated = 0
        self.channel_ops = []
        self.check_shell(comp, order, pos)
        out_of_order = False
        for inst in order:
            out_of_order |= self.check_instruction(comp, inst, pos, False)
        if len(self.problems) != mark or not self.users_mirror_operands(order):
            del self.problems[mark:]  # something is wrong: again, with each instruction's users checked too
            self.channel_ops = []
            self.check_shell(comp, order, pos)
            out_of_order = False
            for inst in order:
                out_of_order |= self.check_instruction(comp, inst, pos)
        # its channel instructions, in order, for `check_channels` (as that would find them: by opcode)
        self.channel_memo[comp] = (comp.edit_stamp, tuple(self.channel_ops))
        self.check_parameters(comp, order)
        if out_of_order:
            self.check_cycles(comp, pos)

    def users_mirror_operands(self, order: tuple[Instruction, ...]) -> bool:
        """Whether the computation's users lists hold nothing but the mirror of its operand lists, given that
        every instruction's operands passed `check_instruction` (each distinct operand is here and lists the
        user as often as it is used) and `self.repeated` counts the operand slots that repeat an operand
        of the same instruction: then those (operand, user) pairs are all users entries, and there are no
        others exactly when the entries number as many as the pairs (one C-level count of each)."""
        pairs = sum(map(len, map(_OPERANDS_OF, order))) - self.repeated
        return sum(map(len, map(_USERS_OF, order))) == pairs

    def check_shell(self, comp: Computation, order: tuple[Instruction, ...], pos: dict[int, int]) -> None:
        """The computation's list against its count, its root, and its instruction names; what it saw (order,
        shapes, names) is kept for the checkpoint (`self.seen`: verification changes nothing)."""
        names = list(map(_NAME_OF, order))
        self.seen[comp] = (order, list(map(_SHAPE_OF, order)), names)
        if len(pos) != len(order):
            self.report(comp, None, "an instruction appears twice in the instruction list")
        if len(comp) != len(order):
            self.report(comp, None, f"instruction count {len(comp)} does not match the list ({len(order)})")
        if comp.root is None:
            self.report(comp, None, "computation has no root")
        elif id(comp.root) not in pos or comp.root.parent is not comp:
            self.report(comp, comp.root, f"root %{comp.root.name} is not an instruction of this computation")
        if len(set(names)) != len(order):
            taken: set[str] = set()
            for inst in order:
                if inst.name in taken:
                    self.report(comp, inst, f"name %{inst.name} is used twice in the computation")
                taken.add(inst.name)

    def check_instruction(self, comp: Computation, inst: Instruction, pos: dict[int, int],
                          users: bool = True) -> bool:
        """All per-instruction checks; returns whether an operand or predecessor comes after it. Without
        `users` the users list is left to the caller (`users_mirror_operands` over the whole computation).

        The common case runs inline (what each opcode needs checked comes from one table look-up,
        `_opcode_facts`; an operand whose links are right costs a few comparisons); anything that looks
        wrong goes through the helpers that report it."""
        if inst.parent is not comp:
            self.report(comp, inst, "parent link does not point to this computation")
        opcode = inst.opcode
        facts = _OPCODE_FACTS.get(opcode) or _opcode_facts(opcode)
        known = facts[0]
        if not known:
            self.report(comp, inst, f"unknown opcode {opcode!r}")
        late = False
        ops = inst._operands
        if ops:
            n_ops = len(ops)
            if n_ops == 1 or (n_ops == 2 and ops[0] is not ops[1]):
                here = pos[id(inst)]
                for op in ops:  # distinct operands: each must list `inst` once, come before it, be here
                    at = pos.get(id(op))
                    if at is None or at >= here or op.parent is not comp or op._users.get(inst) != 1:
                        late = self.check_operands(comp, inst, pos)
                        break
            else:
                late = self.check_operands(comp, inst, pos)
        if users and inst._users:
            for user, n in inst._users.items():  # each must be here and use `inst` as often as listed
                if n != 1 or user.parent is not comp or id(user) not in pos or user._operands.count(inst) != 1:
                    self.check_users(comp, inst, pos)
                    break
        if inst._control_preds or inst._control_succs:
            late |= self.check_control(comp, inst, pos)
        attrs = inst.attrs
        if facts[1] or not attrs.keys().isdisjoint(_CALL_KEYS):
            self.check_calls(comp, inst)
        if "sharding" in attrs:
            self.check_sharding_leaves(comp, inst)
        if facts[2]:
            self.check_async_pairing(comp, inst)
        if facts[3]:
            self.check_collective(comp, inst)
        if facts[5]:
            self.channel_ops.append(inst)
        if facts[4] and "operand_layout_constraints" in attrs:
            self.check_layout_constraints(comp, inst)
        shape = inst.shape
        if shape is not None and _layout_problem(shape):
            self.report(comp, inst, _layout_problem(shape))
        if known:
            shapes = tuple(map(_SHAPE_OF, ops))
            if None not in shapes:
                message = self.checked_shape(inst, shapes)
                if message:
                    self.report(comp, inst, message)
        return late

    def checked_shape(self, inst: Instruction, operand_shapes: tuple[AnyShape, ...]) -> str | None:
        """`check_shape(inst)`, remembered (for this verification and the incremental ones after it, while
        the module configuration is the same) by what shape inference reads: opcode, shapes, plain
        attribute values, and of a called computation its root and parameter shapes (`_shape_key`). The
        layers of a model repeat the same instructions, and fusion clones instructions already checked.
        Instructions with other attribute values (literals, lists of other things) are checked each time."""
        key = _shape_key(inst, operand_shapes)
        if key is None:
            return check_shape(inst)
        memo = self.shape_memo
        try:
            return memo[key]
        except KeyError:
            message = memo[key] = check_shape(inst)
            return message
        except TypeError:  # a tuple attribute holding something unhashable
            return check_shape(inst)

    # ----------------------------------------------------------------- use-def
    def check_operands(self, comp: Computation, inst: Instruction, pos: dict[int, int]) -> bool:
        late = False
        ops = inst._operands
        if not ops:
            return False
        n_ops = len(ops)
        distinct = n_ops == 1 or (n_ops == 2 and ops[0] is not ops[1]) or (n_ops > 2 and len(set(ops)) == n_ops)
        if distinct:
            counts = zip(ops, (1,) * n_ops, strict=True)
        else:
            counts = Counter(ops).items()
            self.repeated += n_ops - len(counts)  # (read by `users_mirror_operands`)
        here = pos[id(inst)]
        for op, n in counts:
            at = pos.get(id(op))
            if op.parent is not comp or at is None:
                where = "it was removed" if op.parent is None else f"it is in %{op.parent.name}"
                self.report(comp, inst, f"operand %{op.name} is not in this computation ({where})")
                continue
            listed = op._users.get(inst, 0)
            if listed != n:
                self.report(comp, inst, f"operand %{op.name} lists this instruction {listed} time(s) among its "
                                        f"users, but it is used {n} time(s)")
            if at >= here:
                late = True
                self.report(comp, inst, f"operand %{op.name} is defined after its use "
                                        "(instructions are not in topological order)")
        return late

    def check_users(self, comp: Computation, inst: Instruction, pos: dict[int, int]) -> None:
        for user, n in inst._users.items():
            if user.parent is not comp or id(user) not in pos:
                self.report(comp, inst, f"user %{user.name} is not in this computation")
                continue
            uses = user._operands.count(inst)  # identity: Instruction keeps object's equality
            if uses != n:
                self.report(comp, inst, f"lists %{user.name} as a user {n} time(s), but %{user.name} uses it "
                                        f"{uses} time(s)")

    def check_control(self, comp: Computation, inst: Instruction, pos: dict[int, int]) -> bool:
        late = False
        for pred in inst._control_preds:
            if inst not in pred._control_succs:
                self.report(comp, inst, f"control predecessor %{pred.name} does not list it as a successor")
            if pred.parent is not comp or id(pred) not in pos:
                self.report(comp, inst, f"control predecessor %{pred.name} is not in this computation")
            elif pos[id(pred)] >= pos[id(inst)]:
                late = True
                self.report(comp, inst, f"control predecessor %{pred.name} does not come before it")
        for succ in inst._control_succs:
            if inst not in succ._control_preds:
                self.report(comp, inst, f"control successor %{succ.name} does not list it as a predecessor")
            if succ.parent is not comp or id(succ) not in pos:
                self.report(comp, inst, f"control successor %{succ.name} is not in this computation")
        return late

    def check_cycles(self, comp: Computation, pos: dict[int, int]) -> None:
        """Report one dependency cycle, if there is one (Kahn's algorithm, then a walk in what is left)."""
        deps = {i: [d for d in list(i._operands) + list(i._control_preds) if id(d) in pos] for i in comp.instructions}
        waiting = {i: len(set(d)) for i, d in deps.items()}
        users: dict[Instruction, set[Instruction]] = {i: set() for i in deps}
        for i, ds in deps.items():
            for d in ds:
                users[d].add(i)
        ready = [i for i, n in waiting.items() if n == 0]
        while ready:
            for u in users[ready.pop()]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    ready.append(u)
        stuck = {i for i, n in waiting.items() if n > 0}
        if not stuck:
            return
        path: list[Instruction] = []
        node = min(stuck, key=lambda i: pos[id(i)])
        while node not in path:
            path.append(node)
            node = next(d for d in deps[node] if d in stuck)
        cycle = path[path.index(node):] + [node]
        self.report(comp, node, "instructions form a cycle: " + " -> ".join("%" + i.name for i in reversed(cycle)))

    # ----------------------------------------------------------------- parameters
    def check_parameters(self, comp: Computation, order: tuple[Instruction, ...]) -> None:
        params = [i for i in order if i.opcode == "parameter"]
        if _parameters_ok(comp, params):
            return
        numbers: dict[int, Instruction] = {}
        for p in params:
            n = p.attrs.get("parameter_number")
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                self.report(comp, p, f"parameter number {n!r} is not a non-negative integer")
            elif n in numbers:
                self.report(comp, p, f"parameter number {n} is also used by %{numbers[n].name}")
            else:
                numbers[n] = p
        missing = sorted(set(range(len(numbers))) - set(numbers))
        if missing:
            self.report(comp, None, f"parameter numbers {sorted(numbers)} are not 0..{len(numbers) - 1} "
                                    f"(missing {missing})")
        elif len(numbers) == len(params) and (len(comp._params) != len(numbers) or any(
                comp._params.get(n) is not p for n, p in numbers.items())):  # (two entries swapped, too)
            self.report(comp, None, "the computation's parameter index does not match its parameter instructions")

    # ----------------------------------------------------------------- called computations
    def check_sharding_leaves(self, comp: Computation, inst: Instruction) -> None:
        """A tuple sharding lists one sharding per leaf of the instruction's shape (HloSharding::Validate;
        XLA's parser keeps a mismatch, its compiler rejects it)."""
        text = inst.attrs.get("sharding")
        if text is None or inst.shape is None:
            return
        try:
            listed = tuple_sharding_size(str(text))
        except ValueError:
            return  # the parser reports bad syntax
        if listed is None:
            return
        if not inst.shape.is_tuple:
            self.report(comp, inst, f"a tuple sharding ({listed} entries) on the non-tuple shape {inst.shape}")
            return
        leaves = max(1, _leaf_count(inst.shape))  # an empty tuple still takes one entry (RequiredLeaves)
        if listed != leaves:
            self.report(comp, inst, f"the sharding lists {listed} leaf shardings but the shape has {leaves} leaves")

    def check_calls(self, comp: Computation, inst: Instruction) -> None:
        if not _may_call(inst.opcode) and inst.attrs.keys().isdisjoint(_CALL_KEYS):
            return  # calls nothing and needs no callee
        ok = True
        if inst.called_computations and not _may_call(inst.opcode):
            self.report(comp, inst, f"{inst.opcode} does not call computations, but names "
                                    f"%{inst.called_computations[0].name}")
        for key in _REQUIRED_CALLEES.get(inst.opcode, ()):
            if not isinstance(inst.attrs.get(key), Computation):
                self.report(comp, inst, f"{inst.opcode} needs a {key} computation")
                ok = False
        if inst.opcode == "conditional" and not conditional_branches(inst):
            self.report(comp, inst, "conditional needs its branch computations")
            ok = False
        for callee in inst.called_computations:
            if callee not in self.members or callee.module is not self.module:
                self.report(comp, inst, f"calls computation %{callee.name}, which is not in the module")
                ok = False
            elif callee is comp:
                self.report(comp, inst, "calls the computation it is in")
                ok = False
            elif callee is self.module.entry:
                self.report(comp, inst, f"calls the entry computation %{callee.name}")
                ok = False
            elif callee.root is None or callee.root.shape is None:
                ok = False
        check = _SIGNATURES.get(inst.opcode)
        if ok and check is not None:
            try:
                check(self, comp, inst)
            except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
                self.report(comp, inst, f"malformed {inst.opcode}: {type(e).__name__}: {e}")

    def param_shapes(self, comp: Computation, inst: Instruction, callee: Computation, role: str,
                     count: int | None) -> list[AnyShape] | None:
        params = callee.parameters
        if count is not None and len(params) != count:
            self.report(comp, inst, f"{role} %{callee.name} takes {len(params)} parameter(s), expected {count}")
            return None
        return [p.shape for p in params]

    def expect_shape(self, comp: Computation, inst: Instruction, what: str, actual: AnyShape,
                     expected: AnyShape) -> None:
        if not shapes_compatible(actual, expected):
            self.report(comp, inst, f"{what} is {actual.to_text(layout=False)}, expected "
                                    f"{expected.to_text(layout=False)}")

    def check_operands_as_params(self, comp: Computation, inst: Instruction, callee: Computation, role: str,
                                 exact: bool) -> None:
        """The callee's parameter k must match operand k (and take all operands when `exact`)."""
        params = callee.parameters
        if len(params) > inst.operand_count or (exact and len(params) != inst.operand_count):
            self.report(comp, inst, f"{role} %{callee.name} takes {len(params)} parameter(s), but the "
                                    f"instruction has {inst.operand_count} operand(s)")
            return
        operands = inst.operands
        for p in params:
            n = p.attrs["parameter_number"]
            if not shapes_compatible(p.shape, operands[n].shape):  # (the message only for a mismatch)
                self.expect_shape(comp, inst, f"parameter {n} of {role} %{callee.name}", p.shape, operands[n].shape)

    def check_scalar_function(self, comp: Computation, inst: Instruction, key: str, param_types: list[str],
                              result_types: list[str] | None) -> None:
        """`key` takes scalars of `param_types` and returns scalars of `result_types` (pred[] if None)."""
        callee = inst.attrs[key]
        shapes = self.param_shapes(comp, inst, callee, key, len(param_types))
        if shapes is None:
            return
        same = _same_ignoring_fp  # like XLA's reducer checks: floating types may differ in precision
        for i, (s, t) in enumerate(zip(shapes, param_types, strict=True)):
            if not _is_scalar(s) or not same(s.dtype, t):
                self.report(comp, inst, f"parameter {i} of {key} %{callee.name} is {s.to_text(layout=False)}, "
                                        f"expected {t}[]")
        root = callee.root.shape
        wanted = result_types if result_types is not None else ["pred"]
        leaves = _leaves_of(root) if len(wanted) > 1 else [root]
        if len(leaves) != len(wanted) or not all(_is_scalar(x) and same(x.dtype, t)
                                                 for x, t in zip(leaves, wanted, strict=False)):
            expected = ", ".join(f"{t}[]" for t in wanted)
            self.report(comp, inst, f"{key} %{callee.name} returns {root.to_text(layout=False)}, expected "
                                    f"{expected if len(wanted) == 1 else '(' + expected + ')'}")

    # ----------------------------------------------------------------- async and collectives
    def check_async_pairing(self, comp: Computation, inst: Instruction) -> None:
        if not inst.operand_count:
            return
        producer = inst.operand(0).opcode
        if _async_operand_ok(inst.opcode, producer) is False:
            self.report(comp, inst, f"operand %{inst.operand(0).name} is a {producer}, which cannot start "
                                    f"this {inst.opcode}")

    def check_collective(self, comp: Computation, inst: Instruction) -> None:
        mode = _group_mode(inst)
        if mode is None:
            self.report(comp, inst, "use_global_device_ids=true needs a channel_id")
        groups = inst.attrs.get("replica_groups")
        explicit = getattr(groups, "explicit", None)
        if explicit:
            self.check_replica_groups(comp, inst, [list(g) for g in explicit], mode)
        elif mode == "flattened-id" and (groups is None or explicit == ()):
            self.report(comp, inst, "replica_groups must be given in flattened-id mode (use_global_device_ids=true)")
        pairs = inst.attrs.get("source_target_pairs")
        if isinstance(pairs, tuple):
            self.check_source_target_pairs(comp, inst, pairs, mode)
        if mode is not None:
            self.check_shard_count(comp, inst, mode)

    def check_source_target_pairs(self, comp: Computation, inst: Instruction, pairs: tuple, mode: str) -> None:
        """Ids in range (below the replica or partition count) and, unless in-place, each used once per side."""
        limit = _config_count(self.module, "replica_count" if mode == "cross-replica" else "num_partitions")
        for side, values in (("source", [p[0] for p in pairs]), ("target", [p[1] for p in pairs])):
            bad = sorted({v for v in values if v < 0 or (limit != 1 and v >= limit)})
            if bad:
                self.report(comp, inst, f"{side} ids {bad} in source_target_pairs are not in 0..{limit - 1}")
            repeated = sorted(v for v, n in Counter(values).items() if n > 1)
            if repeated and inst.operand_count != 4:
                self.report(comp, inst, f"{side} {repeated} appears more than once in source_target_pairs")

    def check_shard_count(self, comp: Computation, inst: Instruction, mode: str) -> None:
        """all-gather / reduce-scatter grow / shrink their dimension by the group size; all-to-all without a
        split dimension takes one operand per group member (XLA's HloVerifier)."""
        size = self.subgroup_size(inst, mode)
        if size == 1:
            return
        base = inst.opcode.removesuffix("-start")
        if base in ("all-gather", "reduce-scatter"):
            dim = inst.attrs.get("dimensions")
            if not (isinstance(dim, tuple) and len(dim) == 1) or not inst.operand_count:
                return
            d = dim[0]
            out = inst.shape
            if inst.opcode == "all-gather-start" and out.is_tuple and len(out.elements) > 1:
                out = out.elements[1]
            out = out.elements[0] if out.is_tuple and out.elements else out
            src = inst.operand(0).shape
            if out.is_tuple or src.is_tuple or not (0 <= d < min(src.rank, out.rank)):
                return
            big, small = (out.dims[d], src.dims[d]) if base == "all-gather" else (src.dims[d], out.dims[d])
            shards = -(-big // small) if small else 0
            if shards != size:
                self.report(comp, inst, f"{base} over groups of {size} should change dimension {d} by a factor "
                                        f"of {size}, but {small} -> {big} is a factor of {shards}")
        elif inst.opcode == "all-to-all" and inst.attrs.get("dimensions") is None and inst.operand_count != size:
            self.report(comp, inst, f"all-to-all without a split dimension takes one operand per group member "
                                    f"({size}), got {inst.operand_count}")

    def subgroup_size(self, inst: Instruction, mode: str) -> int:
        """How many devices take part in each group of a collective (XLA's GetSubgroupSize)."""
        groups = inst.attrs.get("replica_groups")
        try:
            listed = groups.groups() if groups is not None and not groups.is_empty else []
        except (AttributeError, ValueError):
            return 1
        first = len(listed[0]) if listed else 0
        replicas, partitions = (_config_count(self.module, k) for k in ("replica_count", "num_partitions"))
        if mode in ("cross-replica", "cross-replica-and-partition"):
            size = first or replicas
            return size * partitions if mode == "cross-replica-and-partition" else size
        if mode == "flattened-id":
            return first or 1
        return first or partitions

    def check_replica_groups(self, comp: Computation, inst: Instruction, groups: list[list[int]],
                             mode: str | None) -> None:
        ids = [i for g in groups for i in g]
        if any(not g for g in groups):
            self.report(comp, inst, "replica_groups has an empty group")
        repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
        if repeated:
            self.report(comp, inst, f"replica ids {repeated} appear in more than one place in replica_groups")
        missing = sorted(set(range(len(set(ids)))) - set(ids))
        if missing:
            self.report(comp, inst, f"replica_groups do not name ids {missing} (ids must be 0..n-1)")
        expected = self.participants(mode)
        if expected != 1 and len(set(ids)) != expected:
            self.report(comp, inst, f"replica_groups name {len(set(ids))} ids, but in {mode} mode the module has "
                                    f"{expected}")
        uniform = inst.opcode in ("all-reduce", "all-reduce-start")
        if not uniform and len({len(g) for g in groups}) > 1:
            self.report(comp, inst, "replica_groups must all have the same size")

    def participants(self, mode: str | None) -> int:
        """How many ids the replica groups must name in this group mode (1: unknown, not checked)."""
        replicas, partitions = (_config_count(self.module, k) for k in ("replica_count", "num_partitions"))
        return {"cross-replica": replicas, "cross-replica-and-partition": replicas, "cross-partition": partitions,
                "flattened-id": replicas * partitions}.get(mode or "", 1)


_SEND_RECV = frozenset({"send", "recv", "send-done", "recv-done"})
#: Opcodes that may call computations (XLA's HloInstruction::MightHaveCalledComputations).
_CALLERS = frozenset(
    {"while", "conditional", "call", "fusion", "map", "reduce", "reduce-window", "reduce-scatter", "all-reduce",
     "all-reduce-start", "scatter", "select-and-scatter", "sort", "custom-call", "async-start", "async-update",
     "async-done"}
)


#: Attributes that name computations (an instruction with one is checked as a caller).
_CALL_KEYS = frozenset({"to_apply", "calls", "body", "condition", "true_computation", "false_computation", "select",
                        "scatter", "branch_computations", "called_computations"})


#: id(shape) -> (shape, layout_problem(shape)): shapes are interned, so each is checked once.
_LAYOUT_CHECKED: dict[int, tuple[AnyShape, str | None]] = {}


def _layout_problem(shape: AnyShape) -> str | None:
    """`layout_problem(shape)`, remembered by the shape's identity."""
    hit = _LAYOUT_CHECKED.get(id(shape))
    if hit is not None and hit[0] is shape:
        return hit[1]
    problem = layout_problem(shape)
    if len(_LAYOUT_CHECKED) < 100_000:
        _LAYOUT_CHECKED[id(shape)] = (shape, problem)
    return problem


@lru_cache(maxsize=1024)
def _may_call(opcode: str) -> bool:
    return opcode in _CALLERS or async_base(opcode) is not None


#: What `_Checker.check_instruction` needs to know of an opcode: (known, may call computations, an async
#: -update/-done checked against its start, a collective, a custom-call, a channel instruction (`_CHANNEL_OPS`)),
#: by opcode (`_opcode_facts`).
_OPCODE_FACTS: dict[str, tuple[bool, bool, bool, bool, bool, bool]] = {}


def _opcode_facts(opcode: str) -> tuple[bool, bool, bool, bool, bool, bool]:
    """The `_OPCODE_FACTS` entry of `opcode`, computed and remembered (the table is emptied should bad input
    bring thousands of unknown opcodes)."""
    if len(_OPCODE_FACTS) >= 4096:
        _OPCODE_FACTS.clear()
    facts = (is_known_opcode(opcode), _may_call(opcode), _may_be_async_follower(opcode),
             opcode in COLLECTIVES or opcode == "collective-permute-start", opcode == "custom-call",
             opcode in _CHANNEL_OPS)
    _OPCODE_FACTS[opcode] = facts
    return facts


#: Instructions whose channel_id XLA's VerifyChannels groups (collectives, sends and receives).
_CHANNEL_OPS = frozenset(COLLECTIVES) | _SEND_RECV | {"collective-permute-start"}


def _shape_list(text: str) -> list[AnyShape]:
    """`{shape, shape, ...}` -> shapes (ValueError if malformed)."""
    t = text.strip()
    if not (t.startswith("{") and t.endswith("}")):
        raise ValueError(f"expected '{{shape, ...}}', got {t[:40]!r}")
    out: list[AnyShape] = []
    pos, body = 0, t[1:-1]
    while body[pos:].strip():
        shape, pos = parse_shape_at(body, pos)
        out.append(shape)
        rest = body[pos:].lstrip()
        if rest.startswith(","):
            pos = len(body) - len(rest) + 1
        elif rest:
            raise ValueError(f"expected ',' between shapes, got {rest[:20]!r}")
    return out


@lru_cache(maxsize=64)
def _program_shape(text: str) -> tuple[list[AnyShape], AnyShape]:
    """`{(shape, ...)->shape}` -> (parameter shapes, result shape) (ValueError if malformed)."""
    t = text.strip()
    if not (t.startswith("{(") and t.endswith("}")) or ")->" not in t.replace(") ->", ")->"):
        raise ValueError(f"expected '{{(parameter shapes)->result shape}}', got {t[:40]!r}")
    body = t[1:-1]
    params = parse_shape_at(body, 0)
    shapes, end = params
    rest = body[end:].lstrip()
    if not rest.startswith("->"):
        raise ValueError("expected '->' after the parameter shapes")
    result = parse_shape(rest[2:].strip())
    return list(shapes.elements), result


#: The module configuration the checks read (a change to one of them re-verifies everything).
_CHECKED_CONFIG = ("replica_count", "num_partitions", "entry_computation_layout")


def _checked_config(module: Module) -> dict:
    """The part of `module.config` the checks depend on."""
    return {k: module.config.get(k) for k in _CHECKED_CONFIG}


def _config_count(module: Module, key: str) -> int:
    try:
        return int(str(module.config.get(key, 1)))
    except ValueError:
        return 1


#: Collectives whose use_global_device_ids is a flag (absent = false), as XLA reads them.
_GLOBAL_ID_FLAG = frozenset({"all-reduce", "all-reduce-start", "all-gather", "all-gather-start", "reduce-scatter"})


def _group_mode(inst: Instruction) -> str | None:
    """XLA's CollectiveOpGroupMode of a collective (None for an invalid combination)."""
    flag = inst.attrs.get("use_global_device_ids")
    use_global = flag is True or str(flag) == "true"
    has_channel = inst.attrs.get("channel_id") is not None
    if not has_channel:
        return None if use_global else "cross-replica"
    if inst.opcode not in _GLOBAL_ID_FLAG:
        return "cross-partition"
    return "flattened-id" if use_global else "cross-replica-and-partition"


# ----------------------------------------------------------------------------- signature checks per opcode

_REQUIRED_CALLEES: dict[str, tuple[str, ...]] = {
    "while": ("body", "condition"), "call": ("to_apply",), "fusion": ("calls",), "async-start": ("calls",),
    "reduce": ("to_apply",), "reduce-window": ("to_apply",), "scatter": ("to_apply",), "sort": ("to_apply",),
    "map": ("to_apply",), "all-reduce": ("to_apply",), "all-reduce-start": ("to_apply",),
    "reduce-scatter": ("to_apply",), "select-and-scatter": ("select", "scatter"),
}


def _sig_while(ck: _Checker, comp: Computation, inst: Instruction) -> None:
    state = inst.operand(0).shape if inst.operand_count else inst.shape
    for role in ("condition", "body"):
        callee = inst.attrs[role]
        shapes = ck.param_shapes(comp, inst, callee, f"while {role}", 1)
        if shapes is not None:
            ck.expect_shape(comp, inst, f"the parameter of while {role} %{callee.name}", shapes[0], state)
    cond_root = inst.attrs["condition"].root.shape
    ck.expect_shape(comp, inst, f"the result of while condition %{inst.attrs['condition'].name}", cond_root,
                    Shape("pred", ()))
    body = inst.attrs["body"]
    ck.expect_shape(comp, inst, f"the result of while body %{body.name}", body.root.shape, inst.shape)


def _sig_conditional(ck: _Checker, comp: Computation, inst: Instruction) -> None:
    for j, branch in enumerate(conditional_branches(inst)):
        shapes = ck.param_shapes(comp, inst, branch, f"branch {j}", 1)
        if shapes is not None and j + 1 < inst.operand_count:
            ck.expect_shape(comp, inst, f"the parameter of branch {j} %{branch.name}", shapes[0],
                            inst.operand(j + 1).shape)
        ck.expect_shape(comp, inst, f"the result of branch {j} %{branch.name}", branch.root.shape, inst.shape)


def _sig_call(ck: _Checker, comp: Computation, inst: Instruction) -> None:
    callee = inst.attrs["to_apply"]
    ck.check_operands_as_params(comp, inst, callee, "to_apply", exact=True)
    if inst.opcode == "call":
        ck.expect_shape(comp, inst, f"the result of to_apply %{callee.name}", callee.root.shape, inst.shape)


def _sig_fusion(ck: _Checker, comp: Computation, inst: Instruction) -> None:
    callee = inst.attrs["calls"]
    ck.check_operands_as_params(comp, inst, callee, "fused computation", exact=True)
    if not shapes_compatible(callee.root.shape, inst.shape):
        ck.expect_shape(comp, inst, f"the result of fused computation %{callee.name}", callee.root.shape, inst.shape)


def _sig_async_start(ck: _Checker, comp: Computation, inst: Instruction) -> None:
    ck.check_operands_as_params(comp, inst, inst.attrs["calls"], "async computation", exact=True)


def _reducer(ck: _Checker, comp: Computation, inst: Instruction, inputs: list[str], inits: list[str]) -> None:
    callee = inst.attrs["to_apply"]
    root_types = [x.dtype if not x.is_tuple else "" for x in _leaves_of(callee.root.shape)] \
        if len(inputs) > 1 else [getattr(callee.root.shape, "dtype", "")]
    accumulators = root_types if len(root_types) == len(inits) and all(root_types) else inits
    for i, (acc, init) in enumerate(zip(accumulators, inits, strict=True)):
        if not _same_ignoring_fp(acc, init):
            ck.report(comp, inst, f"to_apply %{callee.name} accumulates {acc} but init value {i} is {init}")
    ck.check_scalar_function(comp, inst, "to_apply", accumulators + inputs, accumulators)


def _sig_reduce(ck: _Checker, comp: Computation, inst: Instruction) -> None:
    n = inst.operand_count // 2
    types = [op.shape.dtype if not op.shape.is_tuple else "token" for op in inst.operands]
    if inst.operand_count % 2 == 0 and n:
        _reducer(ck, comp, inst, types[:n], types[n:])


def _sig_scatter(ck: _Checker, comp: Computation, inst: Instruction) -> None:
    n = inst.operand_count // 2
    if inst.operand_count % 2 == 1 and n and not any(op.shape.is_tuple for op in inst.operands):
        types = [op.shape.dtype for op in inst.operands]
        _reducer(ck, comp, inst, types[n + 1:], types[:n])


def _sig_sort(ck: _Checker, comp: Computation, inst: Instruction) -> None:
    if not any(op.shape.is_tuple for op in inst.operands):
        types = [t for op in inst.operands for t in (op.shape.dtype, op.shape.dtype)]
        ck.check_scalar_function(comp, inst, "to_apply", types, None)


def _sig_select_and_scatter(ck: _Checker, comp: Computation, inst: Instruction) -> None:
    if inst.operand_count == 3 and not any(op.shape.is_tuple for op in inst.operands):
        operand, source = inst.operand(0).shape.dtype, inst.operand(1).shape.dtype
        ck.check_scalar_function(comp, inst, "select", [operand, operand], None)
        ck.check_scalar_function(comp, inst, "scatter", [source, source], [source])


def _sig_all_reduce(ck: _Checker, comp: Computation, inst: Instruction) -> None:
    types = [op.shape.dtype for op in inst.operands if not op.shape.is_tuple]
    if types:
        ck.check_scalar_function(comp, inst, "to_apply", [types[0], types[0]], [types[0]])
        callee = inst.attrs["to_apply"]
        for i, t in enumerate(types[1:], 1):
            if not _same_ignoring_fp(t, types[0]):
                ck.report(comp, inst, f"operand {i} is {t} but to_apply %{callee.name} reduces {types[0]}")


def _sig_map(ck: _Checker, comp: Computation, inst: Instruction) -> None:
    callee = inst.attrs["to_apply"]
    root = callee.root.shape
    if not _is_scalar(root):
        ck.report(comp, inst, f"to_apply %{callee.name} returns {root.to_text(layout=False)}, not a scalar")
    elif not any(op.shape.is_tuple for op in inst.operands):
        ck.check_scalar_function(comp, inst, "to_apply", [op.shape.dtype for op in inst.operands], [root.dtype])


_Signature = Callable[[_Checker, Computation, Instruction], None]
_SIGNATURES: dict[str, _Signature] = {
    "while": _sig_while, "conditional": _sig_conditional, "call": _sig_call, "call-start": _sig_call,
    "fusion": _sig_fusion, "async-start": _sig_async_start, "reduce": _sig_reduce, "reduce-window": _sig_reduce,
    "scatter": _sig_scatter, "sort": _sig_sort, "select-and-scatter": _sig_select_and_scatter,
    "all-reduce": _sig_all_reduce, "all-reduce-start": _sig_all_reduce, "reduce-scatter": _sig_all_reduce,
    "map": _sig_map,
}
