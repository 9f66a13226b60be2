"""The HLO IR: Module, Computation, Instruction, with a use-def graph that stays consistent.

Operands change only through `Instruction.set_operand` / `replace_operands` / `add_operand`
(and `replace_all_uses_with`, which uses them), so every instruction's `users` is always right.
A computation's `instructions` list is its print order; in a scheduled module it is the schedule.
"""

from __future__ import annotations

import itertools
import json
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from hlopt.hlo.attributes import Metadata, Raw
from hlopt.hlo.shape import AnyShape
from hlopt.hlo.side_effects import SideEffects

__all__ = ["Module", "Computation", "Instruction", "IrError", "Attrs", "edit_stamp"]

#: Attributes whose value is one computation.
COMPUTATION_ATTRS = frozenset(
    {"to_apply", "calls", "body", "condition", "true_computation", "false_computation", "select", "scatter"}
)
#: Attributes whose value is a list of computations.
COMPUTATION_LIST_ATTRS = frozenset({"branch_computations", "called_computations"})

#: Either kind.
_CALLING_ATTRS = COMPUTATION_ATTRS | COMPUTATION_LIST_ATTRS


class IrError(RuntimeError):
    """A misuse of the IR API (removing a used instruction, a cross-computation operand, ...)."""


_IDS = itertools.count(1)
#: The edit clock: every edit made through the IR takes the next tick as its stamp (`edit_stamp`).
_CLOCK = itertools.count(1)


def edit_stamp() -> int:
    """A tick of the IR's edit clock: every edit made after this call carries a larger stamp
    (`Instruction.edit_stamp`, `Computation.edit_stamp`, `Computation.structure_stamp`). Incremental
    verification (`hlo.verifier.verify_changes`) re-checks only what was stamped after its checkpoint."""
    return next(_CLOCK)


#: backend_config text -> its JSON object, read-only (`Instruction.backend_config_dict`).
_CONFIG_CACHE: dict[str, Mapping[str, Any]] = {}
_EMPTY_CONFIG: Mapping[str, Any] = MappingProxyType({})


def _bump(comp: Computation | None, *touched: Instruction) -> None:
    """Record one edit: stamp the `touched` instructions and `comp`, count it on the module
    (`Module.mutations`)."""
    stamp = next(_CLOCK)
    for inst in touched:
        inst._edit = stamp
    if comp is not None:
        comp._edit = stamp
        if comp.module is not None:
            comp.module.mutations += 1


def _bump_structure(comp: Computation, *touched: Instruction) -> None:
    """Record an edit of `comp`'s order, membership, root or parameters (and stamp `touched`)."""
    _bump(comp, *touched)
    comp._structure_edit = comp._edit


def _same_value(old: Any, new: Any) -> bool:
    """Whether writing `new` over `old` leaves an attribute as it was (identical or equal)."""
    if old is new:
        return True
    try:
        return type(old) is type(new) and bool(old == new)
    except Exception:  # noqa: BLE001 - arrays and odd values: count it as an edit
        return False


class Attrs(dict):
    """An instruction's attributes: a dict whose writes are IR edits (they stamp the instruction and its
    computation and move `Module.mutations`), so that a pass writing `inst.attrs[key] = value` is seen by
    the honest-`changed` check and by incremental verification. Writing a value equal to the one there is
    no edit. Values are not watched inside: replace a list or dict value instead of changing it in place."""

    __slots__ = ("_owner",)  # a weak reference to the instruction: no cycle, dropped instructions free at once

    def _edited(self) -> None:
        ref = getattr(self, "_owner", None)
        owner = ref() if ref is not None else None
        if owner is not None:
            _bump(owner.parent, owner)

    def __setitem__(self, key: str, value: Any) -> None:
        same = key in self and _same_value(dict.__getitem__(self, key), value)
        dict.__setitem__(self, key, value)  # stored even when equal: `attrs[key] is value` afterwards
        if not same:
            self._edited()

    def __delitem__(self, key: str) -> None:
        dict.__delitem__(self, key)
        self._edited()

    def pop(self, key: str, *default: Any) -> Any:
        """Remove `key` and return its value (or `default`)."""
        if key in self:
            value = dict.pop(self, key)
            self._edited()
            return value
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[str, Any]:
        """Remove and return the last item."""
        item = dict.popitem(self)
        self._edited()
        return item

    def setdefault(self, key: str, default: Any = None) -> Any:
        """`self[key]`, set to `default` first when absent."""
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Write every item given (each write an edit unless equal)."""
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> Attrs:
        self.update(other)
        return self

    def clear(self) -> None:
        """Remove every attribute."""
        if self:
            dict.clear(self)
            self._edited()

    def __reduce__(self) -> tuple:
        return (Attrs, (dict(self),))  # a copy belongs to no instruction until one takes it


class Instruction:
    """One HLO instruction: opcode, shape, operands, attributes, control dependencies."""

    __slots__ = (
        "name", "opcode", "shape", "_operands", "_users", "attrs", "parent",
        "_control_preds", "_control_succs", "inline", "shape_elided", "id", "_prev", "_next", "_edit",
        "__weakref__",
    )

    def __init__(
        self,
        opcode: str,
        shape: AnyShape,
        operands: Iterable[Instruction] = (),
        name: str | None = None,
        **attrs: Any,
    ):
        _setup(self, opcode, shape, name or "", Attrs(attrs))
        if operands:
            ops = list(operands)
            if ops:
                self._take_operands(ops)

    def _take_operands(self, ops: list[Instruction]) -> None:
        """Give a new instruction (no operands yet, in no computation) its operands: what `add_operand` of
        each does (the uses in order), as one edit (one stamp on it and the operands)."""
        self._operands = ops
        stamp = next(_CLOCK)
        self._edit = stamp
        n = len(ops)
        if n == 1 or (n == 2 and ops[0] is not ops[1]) or (n > 2 and len({id(op) for op in ops}) == n):
            for op in ops:  # each once, and no operand has this new instruction as a user yet
                op._users[self] = 1
                op._edit = stamp
            return
        for op in ops:
            users = op._users
            users[self] = users.get(self, 0) + 1
            op._edit = stamp

    @staticmethod
    def id_watermark() -> int:
        """An id below every id issued from now on (instructions made later have a larger `id`)."""
        return next(_IDS)

    @property
    def edit_stamp(self) -> int:
        """The edit clock's stamp (`edit_stamp()`) of this instruction's last IR edit: its operands, users,
        control edges, attributes (`attrs` writes), position, root role, or shape through `set_shape`. Direct
        writes to `shape`, `name` or `opcode` are not stamped (incremental verification compares shapes and
        names itself)."""
        return self._edit

    @property
    def next_instruction(self) -> Instruction | None:
        """The instruction after this one in its computation's order (None at the end or if detached)."""
        return self._next

    @property
    def previous_instruction(self) -> Instruction | None:
        """The instruction before this one in its computation's order (None at the start or if detached)."""
        return self._prev

    # ----------------------------------------------------------------- operands and users
    @property
    def operands(self) -> tuple[Instruction, ...]:
        """The operands, in order."""
        return tuple(self._operands)

    def operand(self, i: int) -> Instruction:
        """Operand number i."""
        return self._operands[i]

    def operand_index(self, op: Instruction) -> int | None:
        """The first operand slot holding `op` (None if it is not an operand)."""
        ops = self._operands
        return ops.index(op) if op in ops else None  # identity: Instruction keeps object's equality

    @property
    def operand_count(self) -> int:
        """Number of operands."""
        return len(self._operands)

    @property
    def users(self) -> tuple[Instruction, ...]:
        """The instructions that use this one, each once, in the order they became users."""
        return tuple(self._users)

    @property
    def user_count(self) -> int:
        """Number of distinct users."""
        return len(self._users)

    def _add_use(self, user: Instruction) -> None:
        self._users[user] = self._users.get(user, 0) + 1

    def _drop_use(self, user: Instruction) -> None:
        n = self._users[user] - 1
        if n:
            self._users[user] = n
        else:
            del self._users[user]

    def add_operand(self, op: Instruction) -> None:
        """Append an operand."""
        self._operands.append(op)
        users = op._users
        users[self] = users.get(self, 0) + 1
        stamp = self._edit = op._edit = next(_CLOCK)  # `_bump(self.parent, self, op)`
        comp = self.parent
        if comp is not None:
            comp._edit = stamp
            if comp.module is not None:
                comp.module.mutations += 1

    def extend_operands(self, ops: Sequence[Instruction]) -> None:
        """`add_operand` of each of `ops` in turn, as one edit (it and the operands take one stamp)."""
        if not ops:
            return
        self._operands.extend(ops)
        stamp = self._edit = next(_CLOCK)
        for op in ops:
            users = op._users
            users[self] = users.get(self, 0) + 1
            op._edit = stamp
        comp = self.parent
        if comp is not None:
            comp._edit = stamp
            if comp.module is not None:
                comp.module.mutations += 1

    def set_shape(self, shape: AnyShape) -> None:
        """Give the instruction a new result shape as an IR edit: it, its users (whose operand shapes changed)
        and its computation are stamped, so that what is remembered by edit stamps (structural keys, incremental
        verification) sees the change. A direct write to `shape` is not stamped."""
        if shape is self.shape:
            return
        self.shape = shape
        _bump(self.parent, self, *self._users)

    def set_operand(self, i: int, new: Instruction) -> None:
        """Replace operand i, keeping both instructions' users right."""
        old = self._operands[i]
        if old is new:
            return
        old._drop_use(self)
        self._operands[i] = new
        users = new._users
        users[self] = users.get(self, 0) + 1
        stamp = self._edit = old._edit = new._edit = next(_CLOCK)  # `_bump(self.parent, self, old, new)`
        comp = self.parent
        if comp is not None:
            comp._edit = stamp
            if comp.module is not None:
                comp.module.mutations += 1

    def replace_operands(self, new_operands: Iterable[Instruction]) -> None:
        """Replace the whole operand list."""
        new_operands = list(new_operands)
        old_operands = self._operands
        if new_operands == old_operands:  # item by item `is` (equality is identity)
            return
        for op in old_operands:
            op._users.pop(self, None)  # every use goes (then the new ones come, in order)
        self._operands = new_operands
        for op in new_operands:
            users = op._users
            users[self] = users.get(self, 0) + 1
        stamp = self._edit = next(_CLOCK)  # `_bump(self.parent, self, *old_operands, *new_operands)`
        for op in old_operands:
            op._edit = stamp
        for op in new_operands:
            op._edit = stamp
        comp = self.parent
        if comp is not None:
            comp._edit = stamp
            if comp.module is not None:
                comp.module.mutations += 1

    def _take_parsed_operands(self, operands: list[Instruction], distinct: bool = False) -> None:
        """Give an instruction the parser has just made (no operands yet) its operand list:
        `replace_operands` without its comparisons with the old list (there is none) and without a stamp
        (the parser stamps each computation once it is complete: `Computation._stamp_parsed`). `distinct`:
        no operand is there twice (then each is used once by it: one dict write each)."""
        if self._operands:
            raise IrError(f"%{self.name} has operands already")
        self._operands = operands
        if distinct:
            for op in operands:
                op._users[self] = 1
            return
        for op in operands:
            users = op._users
            users[self] = users.get(self, 0) + 1

    def remove_operand(self, i: int) -> None:
        """Remove operand i (callers keep the instruction's semantics right)."""
        old = self._operands.pop(i)
        old._drop_use(self)
        _bump(self.parent, self, old)

    def replace_use_of(self, old: Instruction, new: Instruction) -> None:
        """In this instruction only, use `new` wherever `old` is an operand."""
        if old is new:
            return
        count = old._users.pop(self, 0)  # the slots holding `old` (its use count by this instruction)
        if count:  # `set_operand(i, new)` of each, the slots stamped as one edit
            _replace_slots(self._operands, old, new, count)
            users = new._users
            users[self] = users.get(self, 0) + count
            stamp = self._edit = old._edit = new._edit = next(_CLOCK)
            comp = self.parent
            if comp is not None:
                comp._edit = stamp
                if comp.module is not None:
                    comp.module.mutations += 1

    def replace_all_uses_with(self, new: Instruction, keep_root: bool = False) -> None:
        """Every user of this instruction uses `new` instead; the root moves too unless keep_root."""
        if new is self:
            return
        for user in list(self._users):
            if user is not new:
                user.replace_use_of(self, new)
        comp = self.parent
        if not keep_root and comp is not None and comp._root is self and new.parent is comp:
            comp.set_root(new)

    # ----------------------------------------------------------------- control dependencies
    @property
    def control_predecessors(self) -> tuple[Instruction, ...]:
        """Instructions that must run before this one."""
        return tuple(self._control_preds)

    @property
    def control_successors(self) -> tuple[Instruction, ...]:
        """Instructions that must run after this one."""
        return tuple(self._control_succs)

    @property
    def has_control_dependencies(self) -> bool:
        """True if any control edge goes into or out of this instruction."""
        return bool(self._control_preds or self._control_succs)

    def user_use_count(self, user: Instruction) -> int:
        """How many operand slots of `user` hold this instruction (0 if `user` does not use it)."""
        return self._users.get(user, 0)

    def add_control_successor(self, succ: Instruction) -> None:
        """Make `succ` run after this instruction."""
        if succ not in self._control_succs:
            self._control_succs.append(succ)
            succ._control_preds.append(self)
            self.inline = succ.inline = False  # control edges need named instructions
            _bump(self.parent, self, succ)

    def add_control_predecessor(self, pred: Instruction) -> None:
        """Make this instruction run after `pred`."""
        pred.add_control_successor(self)

    def remove_control_successor(self, succ: Instruction) -> None:
        """Drop the control edge self -> succ."""
        self._control_succs.remove(succ)
        succ._control_preds.remove(self)
        _bump(self.parent, self, succ)

    def drop_control_dependencies(self) -> None:
        """Remove every control edge into and out of this instruction."""
        for p in list(self._control_preds):
            p.remove_control_successor(self)
        for s in list(self._control_succs):
            self.remove_control_successor(s)

    def copy_control_dependencies_to(self, other: Instruction) -> None:
        """Give `other` this instruction's control predecessors and successors."""
        for p in self._control_preds:
            if p is not other:
                p.add_control_successor(other)
        for s in self._control_succs:
            if s is not other:
                other.add_control_successor(s)

    # ----------------------------------------------------------------- attributes
    @property
    def called_computations(self) -> list[Computation]:
        """Computations this instruction calls, in attribute order."""
        attrs = self.attrs
        if _CALLING_ATTRS.isdisjoint(attrs):  # most instructions: no attribute names a computation
            return []
        out: list[Computation] = []
        for key, value in attrs.items():
            if key in COMPUTATION_ATTRS and isinstance(value, Computation):
                out.append(value)
            elif key in COMPUTATION_LIST_ATTRS and isinstance(value, list):
                out.extend(v for v in value if isinstance(v, Computation))
        return out

    def replace_called_computation(self, old: Computation, new: Computation) -> None:
        """Call `new` wherever this instruction calls `old`."""
        for key, value in self.attrs.items():
            if value is old:
                self.attrs[key] = new
            elif key in COMPUTATION_LIST_ATTRS and isinstance(value, list):
                self.attrs[key] = [new if v is old else v for v in value]
        _bump(self.parent, self)

    @property
    def metadata(self) -> Metadata | None:
        """The `metadata={...}` attribute, or None."""
        return self.attrs.get("metadata")

    @metadata.setter
    def metadata(self, value: Metadata | None) -> None:
        if value is None:
            self.attrs.pop("metadata", None)
        else:
            self.attrs["metadata"] = value
        _bump(self.parent, self)

    @property
    def frontend_attributes(self) -> dict[str, Any]:
        """The `frontend_attributes={...}` dict (empty if absent)."""
        return self.attrs.get("frontend_attributes") or {}

    @property
    def backend_config(self) -> str | None:
        """The backend_config text as written (quoted string or braces), or None."""
        value = self.attrs.get("backend_config")
        return None if value is None else str(value)

    def backend_config_json(self) -> Any:
        """The backend_config parsed as JSON (None if absent or empty)."""
        from hlopt.hlo.attributes import unquote

        text = self.backend_config
        if not text:
            return None
        text = unquote(text) if text.startswith('"') else text
        return json.loads(text) if text.strip() else None

    def backend_config_dict(self) -> Mapping[str, Any]:
        """The backend_config's JSON object, read-only, parsed once per distinct text: empty when there is none,
        it is empty, not JSON, or not an object (`backend_config_json` raises on text that is not JSON and
        returns a fresh copy to edit; write back with `set_backend_config_json`)."""
        text = self.backend_config
        if not text:
            return _EMPTY_CONFIG
        hit = _CONFIG_CACHE.get(text)
        if hit is None:
            try:
                value = self.backend_config_json()
            except ValueError:
                value = None
            hit = MappingProxyType(value) if isinstance(value, dict) else _EMPTY_CONFIG
            if len(_CONFIG_CACHE) < 50_000:
                _CONFIG_CACHE[text] = hit
        return hit

    def backend_config_value(self, *keys: str) -> Any:
        """A value inside the backend_config's JSON object by its path of keys
        (`inst.backend_config_value("fusion_backend_config", "kind")`); None where a key is missing."""
        value: Any = self.backend_config_dict()
        for key in keys:
            if not isinstance(value, Mapping):
                return None
            value = value.get(key)
        return value

    def set_backend_config_json(self, value: Any) -> None:
        """Set backend_config from a JSON-serializable value."""
        from hlopt.hlo.attributes import quote

        self.attrs["backend_config"] = Raw(quote(json.dumps(value, separators=(",", ":"))))
        _bump(self.parent, self)

    @property
    def sharding(self) -> Raw | None:
        """The sharding attribute text, or None."""
        return self.attrs.get("sharding")

    @property
    def is_root(self) -> bool:
        """True if this is its computation's root."""
        return self.parent is not None and self.parent.root is self

    @property
    def has_side_effect(self) -> bool:
        """XLA's HasSideEffect: this instruction or a computation it calls has a side effect
        (`hlo.side_effects`, the one rule; DCE keeps such instructions when dead)."""
        return SideEffects(self.parent.module if self.parent is not None else None)(self)

    @property
    def has_side_effect_no_recurse(self) -> bool:
        """XLA's HasSideEffectNoRecurse: this instruction's own side effect, its callees left out."""
        return SideEffects(self.parent.module if self.parent is not None else None).own(self)

    def __getitem__(self, key: str) -> Any:
        return self.attrs[key]

    def get(self, key: str, default: Any = None) -> Any:
        """Attribute `key`, or default."""
        return self.attrs.get(key, default)

    # ----------------------------------------------------------------- misc
    def clone(self, name: str | None = None, operands: Iterable[Instruction] | None = None) -> Instruction:
        """A copy (not inserted anywhere) with the same attributes and the given operands."""
        src = self.attrs
        attrs = Attrs(src)
        for k, v in src.items():  # dict values copied (a plain dict; `metadata` a Metadata of its own)
            if isinstance(v, dict):
                dict.__setitem__(attrs, k, dict(v) if not isinstance(v, Metadata) else v.copy() if k == "metadata"
                                 else v)
        inst = Instruction.__new__(Instruction)
        _setup(inst, self.opcode, self.shape, name or self.name, attrs)
        ops = list(self._operands if operands is None else operands)
        if ops:
            inst._take_operands(ops)
        inst.shape_elided = self.shape_elided
        return inst

    def __repr__(self) -> str:
        return f"<{self.opcode} %{self.name}: {self.shape}>"

    def __hash__(self) -> int:
        return self.id

    # equality is identity: object's own __eq__ (C), not a Python method every list search would call

    def to_text(self) -> str:
        """This instruction as one HLO text line (without indentation)."""
        from hlopt.hlo.printer import instruction_text

        return instruction_text(self)


def _replace_slots(ops: list[Instruction], old: Instruction, new: Instruction, count: int) -> None:
    """Write `new` into the `count` slots of `ops` that hold `old` (all of them: its use count by their owner;
    `list.index` finds each in C, by identity as instructions compare)."""
    i = -1
    for _ in range(count):
        i = ops.index(old, i + 1)
        ops[i] = new


def _setup(inst: Instruction, opcode: str, shape: AnyShape, name: str, attrs: Attrs) -> None:
    """The fields of a new instruction (no operands, in no computation) owning `attrs`."""
    inst.name = name
    inst.opcode = opcode
    inst.shape = shape
    inst._operands = []
    inst._users = {}
    attrs._owner = weakref.ref(inst)
    inst.attrs = attrs
    inst.parent = None
    inst._control_preds = []
    inst._control_succs = []
    inst.inline = False  # parsed as an inline operand (`s32[] constant(1)`): printed inline again
    inst.shape_elided = False
    inst._prev = None  # neighbours in the parent's instruction order
    inst._next = None
    inst.id = next(_IDS)  # unique, increasing; `next` on itertools.count is atomic (hook threads)
    inst._edit = 0  # the edit clock's stamp of its last IR edit (set when it joins a computation)


def _carry_annotations(old: Instruction, new: Instruction) -> None:
    """What XLA's ReplaceInstruction copies onto the replacement when it has none of its own."""
    old_md = old.metadata
    if old_md is not None and old_md.op_name and not (new.metadata and new.metadata.op_name):
        new.metadata = old_md.copy()
    if old.frontend_attributes and not new.frontend_attributes:
        new.attrs["frontend_attributes"] = dict(old.frontend_attributes)
    if old.sharding is not None and new.sharding is None:
        new.attrs["sharding"] = old.sharding


def _has_side_effect(inst: Instruction) -> bool:
    return inst.has_side_effect


class Computation:
    """A named list of instructions with a root; parameters are numbered."""

    def __init__(self, name: str, instructions: Iterable[Instruction] = (), root: Instruction | None = None):
        self.name = name
        self.module: Module | None = None
        self._root: Instruction | None = None
        self.execution_thread: str | None = None
        self.is_inline = False  # parsed as `to_apply={...}`; printed the same way
        self._params: dict[int, Instruction] = {}
        self._first: Instruction | None = None
        self._last: Instruction | None = None
        self._count = 0
        self._view: tuple[Instruction, ...] | None = ()
        self._edit = 0  # the edit clock's stamp of the last IR edit inside it
        self._structure_edit = 0  # ... of the last edit of its order, membership, root or parameters
        #: (`_edit` when it was made, `post_order()`): every edit inside stamps `_edit`, so it holds until the next
        self._post_order: tuple[int, tuple[Instruction, ...]] | None = None
        self._calls: tuple[int, tuple[tuple[Instruction, list[Computation]], ...]] | None = None  # `_calling()`
        for inst in instructions:
            self.add(inst)
        if root is not None:
            self.set_root(root)

    @property
    def edit_stamp(self) -> int:
        """The edit clock's stamp of the last IR edit inside this computation (0: none since it was made)."""
        return self._edit

    @property
    def structure_stamp(self) -> int:
        """The edit clock's stamp of the last edit of its order, membership, root or parameter numbering."""
        return self._structure_edit

    # ----------------------------------------------------------------- order
    @property
    def instructions(self) -> tuple[Instruction, ...]:
        """The instructions in order (print order; the schedule of a scheduled module)."""
        view = self._view
        if view is None:
            out = []
            x = self._first
            while x is not None:
                out.append(x)
                x = x._next
            view = self._view = tuple(out)
        return view

    @instructions.setter
    def instructions(self, order: Iterable[Instruction]) -> None:
        """Reorder: `order` must hold exactly this computation's instructions."""
        order = list(order)
        if len(order) != self._count or any(i.parent is not self for i in order):
            raise IrError(f"new order of {self.name} does not hold exactly its instructions")
        view = self.instructions
        if len(order) == len(view) \
                and all(x is y for x, y in zip(order, view, strict=True)):
            return  # the same order: nothing to relink, no edit to count
        prev = None
        for inst in order:
            inst._prev = prev
            if prev is not None:
                prev._next = inst
            prev = inst
        if prev is not None:
            prev._next = None
        self._first = order[0] if order else None
        self._last = prev
        self._view = tuple(order)
        _bump_structure(self)

    def _place(self, inst: Instruction, prev: Instruction | None, nxt: Instruction | None) -> None:
        """Link `inst` into the order between the neighbours `prev` and `nxt` (None: the first or last place)."""
        inst._prev, inst._next = prev, nxt
        if prev is not None:
            prev._next = inst
        else:
            self._first = inst
        if nxt is not None:
            nxt._prev = inst
        else:
            self._last = inst

    def _link(self, inst: Instruction, before: Instruction | None, after: Instruction | None) -> int:
        if before is not None:
            if before.parent is not self:
                raise IrError(f"%{before.name} is not in {self.name}")
            after = before._prev
            nxt = before
        elif after is not None:
            if after.parent is not self:
                raise IrError(f"%{after.name} is not in {self.name}")
            nxt = after._next
        else:
            after, nxt = self._last, None
        self._place(inst, after, nxt)
        self._count += 1
        self._view = None
        stamp = inst._edit = self._edit = self._structure_edit = next(_CLOCK)  # `_bump_structure(self, inst)`
        module = self.module
        if module is not None:
            module.mutations += 1
        return stamp

    def _splice_out(self, inst: Instruction) -> None:
        """Take `inst` out of the order's links (no count, view or stamp kept up: the caller's)."""
        prev, nxt = inst._prev, inst._next
        if prev is not None:
            prev._next = nxt
        else:
            self._first = nxt
        if nxt is not None:
            nxt._prev = prev
        else:
            self._last = prev

    def _unlink(self, inst: Instruction) -> None:
        self._splice_out(inst)
        inst._prev = inst._next = None
        self._count -= 1
        self._view = None
        self._post_order = self._calls = None  # they hold the instruction
        self._edit = self._structure_edit = next(_CLOCK)  # `_bump_structure(self)`
        module = self.module
        if module is not None:
            module.mutations += 1

    @property
    def first_instruction(self) -> Instruction | None:
        """The first instruction in order (None if empty); walk on with `next_instruction`."""
        return self._first

    def move(self, inst: Instruction, before: Instruction | None = None, after: Instruction | None = None) -> None:
        """Move `inst` (of this computation) before or after another instruction of it (else to the end)."""
        if inst.parent is not self:
            raise IrError(f"cannot move %{inst.name}: it is not in {self.name}")
        if inst is before or inst is after:
            return
        self._unlink(inst)
        self._link(inst, before, after)

    def move_to(self, inst: Instruction, dest: Computation, before: Instruction | None = None) -> None:
        """Move `inst` out of this computation into `dest` (before `before`, else at the end), keeping
        its operands: the caller rewires operands that stay behind (as when a body is spliced). Moving
        the root leaves `root` naming it: meant for a computation about to be dropped."""
        if inst.parent is not self:
            raise IrError(f"cannot move %{inst.name}: it is not in {self.name}")
        self._unlink(inst)
        inst.parent = None
        if inst.opcode == "parameter" and self._params.get(inst.attrs["parameter_number"]) is inst:
            del self._params[inst.attrs["parameter_number"]]
        dest.add(inst, before=before)

    def move_all_to(self, insts: Sequence[Instruction], dest: Computation, before: Instruction | None = None) -> None:
        """`move_to` of each of `insts` in turn (they keep their order, before `before` of `dest`, else at the
        end), as one edit of each computation (the instructions and both computations take one stamp)."""
        if dest is self:
            raise IrError(f"cannot move instructions of {self.name} into itself")
        for inst in insts:
            if inst.parent is not self:
                raise IrError(f"cannot move %{inst.name}: it is not in {self.name}")
        if before is not None and before.parent is not dest:
            raise IrError(f"%{before.name} is not in {dest.name}")
        if not insts:
            return
        if len({id(inst) for inst in insts}) != len(insts):
            raise IrError(f"an instruction to move out of {self.name} is listed twice")
        params = self._params
        for inst in insts:  # `_unlink`, unstamped
            self._splice_out(inst)
            inst.parent = None
            if inst.opcode == "parameter" and params.get(inst.attrs["parameter_number"]) is inst:
                del params[inst.attrs["parameter_number"]]
        self._count -= len(insts)
        self._view = None
        self._post_order = self._calls = None
        stamp = next(_CLOCK)
        dest._link_run(insts, before, stamp)
        self._edit = self._structure_edit = dest._edit = dest._structure_edit = stamp
        if self.module is not None:
            self.module.mutations += 1
        if dest.module is not None and dest.module is not self.module:
            dest.module.mutations += 1

    def unused_instructions(self) -> list[Instruction]:
        """The instructions no instruction uses, in order (the root among them where nothing uses it)."""
        return [inst for inst in self.instructions if not inst._users]

    def first_non_parameter(self) -> Instruction | None:
        """The first instruction in order that is not a parameter (None if there is none)."""
        x = self._first
        while x is not None and x.opcode == "parameter":
            x = x._next
        return x

    # ----------------------------------------------------------------- membership
    def _extend_parsed(self, insts: list[Instruction]) -> None:
        """Append instructions the parser has just made (named, in no computation, their names noted on the
        module already: `Module._unnoted`): `add` at the end, without the checks the parser has made
        already, and without a stamp (`_stamp_parsed`)."""
        last = self._last
        params = self._params
        for inst in insts:
            inst._prev = last
            if last is None:
                self._first = inst
            else:
                last._next = inst
            inst.parent = self
            if inst.opcode == "parameter":
                params[inst.attrs["parameter_number"]] = inst
            last = inst
        self._last = last
        self._count += len(insts)
        self._view = None

    def _stamp_parsed(self) -> None:
        """Stamp a computation the parser has just completed, and all its instructions, as one edit (its
        `_extend_parsed` and `_take_parsed_operands` calls leave the stamps to this)."""
        stamp = next(_CLOCK)
        self._edit = self._structure_edit = stamp
        inst = self._first
        while inst is not None:
            inst._edit = stamp
            inst = inst._next
        if self.module is not None:
            self.module.mutations += 1

    def add(self, inst: Instruction, before: Instruction | None = None, after: Instruction | None = None) -> Instruction:
        """Insert `inst` (at the end, or before/after an instruction) and return it."""
        if inst.parent is not None:
            raise IrError(f"{inst.name} already belongs to computation {inst.parent.name}")
        self._link(inst, before, after)
        inst.parent = self
        module = self.module
        if not inst.name:
            inst.name = module.unique_name(inst.opcode) if module else f"{inst.opcode}.{inst.id}"
        elif module is not None:
            module._note_name(inst.name)
        if inst.opcode == "parameter":
            self._params[inst.attrs["parameter_number"]] = inst
        return inst

    def add_all(self, insts: Sequence[Instruction], before: Instruction | None = None) -> None:
        """`add` of each of `insts` in turn (they keep their order, before `before`, else at the end), as one
        edit (they and the computation take one stamp)."""
        if not insts:
            return
        if before is not None and before.parent is not self:
            raise IrError(f"%{before.name} is not in {self.name}")
        for k, inst in enumerate(insts):  # each taken (its parent set) here: one listed twice is refused
            if inst.parent is not None:
                where = "is listed twice" if inst.parent is self and inst in insts[:k] \
                    else f"already belongs to computation {inst.parent.name}"
                for taken in insts[:k]:
                    taken.parent = None
                raise IrError(f"{inst.name} {where}")
            inst.parent = self
        stamp = next(_CLOCK)
        self._link_run(insts, before, stamp)
        self._edit = self._structure_edit = stamp
        if self.module is not None:
            self.module.mutations += 1

    def _link_run(self, insts: Sequence[Instruction], before: Instruction | None, stamp: int) -> None:
        """Link `insts` (not in any computation's list) in order before `before` (else at the end), each made
        this computation's, named where unnamed (its name noted otherwise), indexed where a parameter, and
        stamped `stamp`: the shared part of `add_all` and `move_all_to` (the computation's stamps are theirs)."""
        module = self.module
        params = self._params
        after = self._last if before is None else before._prev
        for inst in insts:
            inst._prev = after
            if after is not None:
                after._next = inst
            else:
                self._first = inst
            inst.parent = self
            inst._edit = stamp
            if not inst.name:
                inst.name = module.unique_name(inst.opcode) if module else f"{inst.opcode}.{inst.id}"
            elif module is not None:
                module._note_name(inst.name)
            if inst.opcode == "parameter":
                params[inst.attrs["parameter_number"]] = inst
            after = inst
        after._next = before
        if before is not None:
            before._prev = after
        else:
            self._last = after
        self._count += len(insts)
        self._view = None

    def remove(self, inst: Instruction) -> None:
        """Remove an instruction that has no users and is not the root."""
        if inst.parent is not self:
            raise IrError(f"cannot remove %{inst.name}: it is not in {self.name}")
        if inst._users:
            names = ", ".join(u.name for u in inst._users)
            raise IrError(f"cannot remove %{inst.name}: still used by {names}")
        if inst is self._root:
            raise IrError(f"cannot remove %{inst.name}: it is the root of {self.name}")
        if inst._control_preds or inst._control_succs:
            inst.drop_control_dependencies()
        old = inst._operands
        if old:  # `inst.replace_operands(())`, stamped with the unlinking below as one edit
            inst._operands = []
            for op in old:
                op._users.pop(inst, None)  # every use of it by `inst` goes: the entry, whatever its count
        self._unlink(inst)
        if old:
            stamp = inst._edit = self._edit
            for op in old:
                op._edit = stamp
        inst.parent = None
        if inst.opcode == "parameter":
            params = self._params
            number = inst.attrs["parameter_number"]
            if params.get(number) is inst:
                del params[number]

    def remove_dead(self, inst: Instruction) -> int:
        """Remove `inst` and every operand that becomes dead; return how many were removed."""
        work = [inst]
        removed = 0
        while work:
            x = work.pop()
            if x.parent is not self or x.user_count or x is self.root or x.opcode == "parameter" \
                    or x.has_side_effect:
                continue
            ops = list(dict.fromkeys(x.operands))
            self.remove(x)
            removed += 1
            work.extend(ops)
        return removed

    def remove_with_unused_operands(self, inst: Instruction,
                                    effects: Callable[[Instruction], bool] | None = None) -> None:
        """Remove `inst` (dead), then every operand that became dead (XLA's
        RemoveInstructionAndUnusedOperands): not the root, not a parameter, no control edges and no
        side effect (`effects`, default `Instruction.has_side_effect`)."""
        has_effect = effects or _has_side_effect
        work = list(dict.fromkeys(inst.operands))
        self.remove(inst)
        while work:
            x = work.pop()
            if (x.parent is self and not x._users and x is not self.root and x.opcode != "parameter"
                    and not x._control_preds and not x._control_succs and not has_effect(x)):
                work.extend(dict.fromkeys(x._operands))
                self.remove(x)

    def replace_with_new(self, old: Instruction, new: Instruction) -> None:
        """Put `new` (an instruction in no computation) in the place of `old`: its position in the order, its
        users (every slot reading `old` reads `new`) and its root role; `old`, unused then, leaves the
        computation. What `add(new, before=old)`, `old.replace_all_uses_with(new)` and `remove(old)` do, as
        one edit (the instructions touched and the computation take one stamp)."""
        if old.parent is not self:
            raise IrError(f"cannot replace %{old.name}: it is not in {self.name}")
        if new.parent is not None:
            raise IrError(f"{new.name} already belongs to computation {new.parent.name}")
        if old._control_preds or old._control_succs or any(op is old for op in new._operands):
            self.add(new, before=old)  # control edges to drop, or `new` reads `old`: step by step
            old.replace_all_uses_with(new)
            self.remove(old)
            return
        stamp = next(_CLOCK)
        users = new._users
        for user, count in old._users.items():  # `replace_use_of` of each user, in order
            _replace_slots(user._operands, old, new, count)
            users[user] = users.get(user, 0) + count
            user._edit = stamp
        old._users.clear()
        for op in old._operands:  # `remove(old)`: every use of it by `old` goes
            op._users.pop(old, None)
            op._edit = stamp
        old._operands = []
        self._place(new, old._prev, old._next)  # `new` takes `old`'s place in the order
        old._prev = old._next = None
        old.parent = None
        new.parent = self
        params = self._params
        if old.opcode == "parameter" and params.get(old.attrs["parameter_number"]) is old:
            del params[old.attrs["parameter_number"]]
        module = self.module
        if not new.name:
            new.name = module.unique_name(new.opcode) if module else f"{new.opcode}.{new.id}"
        elif module is not None:
            module._note_name(new.name)
        if new.opcode == "parameter":
            params[new.attrs["parameter_number"]] = new
        if self._root is old:
            self._root = new
        self._view = None
        self._post_order = self._calls = None  # they hold `old`
        old._edit = new._edit = self._edit = self._structure_edit = stamp
        if module is not None:
            module.mutations += 1

    def replace_instruction(self, old: Instruction, new: Instruction, *, preserve_sharding: bool = False,
                            relay_control_dependency: bool = True, remove_unused_operands: bool = True,
                            effects: Callable[[Instruction], bool] | None = None,
                            carry_annotations: bool = True) -> bool:
        """Replace `old` by `new` the way XLA's HloComputation::ReplaceInstruction does; False if refused.

        `new` is inserted before `old` when it belongs to no computation yet. Refused when `new` is
        `old`, when (with preserve_sharding) both carry different shardings, and when `old` has control
        edges and relay_control_dependency is False (when True they move to `new`). `new` takes old's
        metadata when it has no op_name, old's frontend attributes and sharding when it has none; every
        use and the root move to `new`; `old` is removed, then (remove_unused_operands) its operands
        that became dead, unless they have a side effect (`effects`, default `has_side_effect`).
        carry_annotations=False skips the metadata/frontend-attribute/sharding copy (callers that
        set the replacement's annotations themselves).
        """
        if new is old:
            return False
        if preserve_sharding and old.sharding is not None and new.sharding is not None \
                and old.sharding != new.sharding:
            return False
        if old.has_control_dependencies and not relay_control_dependency:
            return False
        if new.parent is None:
            self.add(new, before=old)
        if old.has_control_dependencies:
            old.copy_control_dependencies_to(new)
            old.drop_control_dependencies()
        if carry_annotations:
            _carry_annotations(old, new)
        old.replace_all_uses_with(new)
        if remove_unused_operands:
            self.remove_with_unused_operands(old, effects)
        else:
            self.remove(old)
        return True

    def set_root(self, inst: Instruction) -> None:
        """Make `inst` (an instruction of this computation) the root."""
        if inst.parent is not self:
            raise IrError(f"%{inst.name} is not in {self.name}")
        if inst is not self._root:
            old, self._root = self._root, inst
            _bump_structure(self, inst, *(() if old is None else (old,)))

    @property
    def root(self) -> Instruction | None:
        """The root instruction (what the computation returns); change it with `set_root`."""
        return self._root

    # ----------------------------------------------------------------- queries
    @property
    def parameters(self) -> list[Instruction]:
        """Parameter instructions ordered by parameter number."""
        return [self._params[i] for i in sorted(self._params)]

    def parameter(self, i: int) -> Instruction:
        """Parameter number i."""
        return self._params[i]

    def remove_parameter(self, index: int, replacement: Instruction | None = None) -> None:
        """Remove unused parameter `index` and renumber the ones after it down by one (callers drop the
        matching operand of every caller). `replacement` (an instruction of this computation): the parameter's
        uses and root role go to it first (`replace_all_uses_with`), in the same edit."""
        param = self._params[index]
        if replacement is not None:
            if replacement.parent is not self:
                raise IrError(f"%{replacement.name} is not in {self.name}")
            if replacement is param or param._control_preds or param._control_succs \
                    or replacement in param._users:
                param.replace_all_uses_with(replacement)  # the unusual cases, step by step
            else:
                self._drop_parameter(index, param, replacement)
                return
        self.remove(param)
        params = self._params
        renumbered = []
        for n in range(index + 1, len(params) + 2):
            p = params.pop(n, None)
            if p is None:
                break
            dict.__setitem__(p.attrs, "parameter_number", n - 1)  # stamped below: one edit for all
            params[n - 1] = p
            renumbered.append(p)
        _bump_structure(self, *renumbered)

    def _drop_parameter(self, index: int, param: Instruction, replacement: Instruction) -> None:
        """`remove_parameter(index, replacement)` where `replacement` is another instruction, not read by
        `param` (a parameter reads nothing), and `param` has no control edges: one stamp for all it touches."""
        stamp = next(_CLOCK)
        users = replacement._users
        for user, count in param._users.items():  # `replace_use_of` of each user, in order
            _replace_slots(user._operands, param, replacement, count)
            users[user] = users.get(user, 0) + count
            user._edit = stamp
        param._users.clear()
        if self._root is param:
            self._root = replacement
        self._splice_out(param)  # `remove(param)`
        param._prev = param._next = None
        param.parent = None
        self._count -= 1
        self._view = None
        self._post_order = self._calls = None  # they hold the parameter
        params = self._params
        del params[index]
        for n in range(index + 1, len(params) + 2):  # the ones after it, renumbered
            p = params.pop(n, None)
            if p is None:
                break
            dict.__setitem__(p.attrs, "parameter_number", n - 1)
            params[n - 1] = p
            p._edit = stamp
        param._edit = replacement._edit = self._edit = self._structure_edit = stamp
        if self.module is not None:
            self.module.mutations += 1

    def _reindex_parameters(self) -> None:
        self._params = {i.attrs["parameter_number"]: i for i in self.instructions if i.opcode == "parameter"}
        _bump_structure(self)

    def index(self, inst: Instruction) -> int:
        """Position of `inst` in the instruction order."""
        return self.instructions.index(inst)

    @property
    def is_entry(self) -> bool:
        """True for the module's entry computation."""
        return self.module is not None and self.module.entry is self

    def post_order(self) -> list[Instruction]:
        """Instructions with operands (and control predecessors) before users, roots last (a new list; the
        order is remembered until the computation's next edit)."""
        stamp = self._edit
        known = self._post_order
        if known is not None and known[0] == stamp:
            return list(known[1])
        visited: set[int] = set()  # ids: no Python-level __hash__ per look-up
        order: list[Instruction] = []
        for start in self.instructions:
            key = id(start)
            if key in visited:
                continue
            visited.add(key)
            deps = start._operands + start._control_preds if start._control_preds else start._operands
            for dep in deps:
                if id(dep) not in visited and dep.parent is self:
                    break
            else:  # every operand placed already (the common case): what the walk below does at once
                order.append(start)
                continue
            stack: list[tuple[Instruction, Iterator[Instruction]]] = [(start, iter(deps))]
            while stack:
                node, it = stack[-1]
                for dep in it:
                    if id(dep) not in visited and dep.parent is self:
                        visited.add(id(dep))
                        stack.append((dep, iter(dep._operands + dep._control_preds if dep._control_preds
                                                else dep._operands)))
                        break
                else:
                    stack.pop()
                    order.append(node)
        self._post_order = (stamp, tuple(order))
        return order

    def make_topological(self) -> None:
        """Reorder `instructions` so operands precede users (keeps the current order where it is valid)."""
        self.instructions = self.post_order()

    def called_computations(self) -> list[Computation]:
        """Computations called by instructions of this one (direct callees, unique, in order)."""
        seen: dict[Computation, None] = {}
        for _, called in self._calling():
            for c in called:
                seen.setdefault(c, None)
        return list(seen)

    def calling_instructions(self) -> list[tuple[Instruction, list[Computation]]]:
        """Each instruction that calls a computation, in order, with what it calls (its `called_computations`)."""
        return [(inst, list(called)) for inst, called in self._calling()]

    def _calling(self) -> tuple[tuple[Instruction, list[Computation]], ...]:
        """`calling_instructions`, remembered until the computation's next edit (callees change only through
        stamped `attrs` writes); its lists are not to be changed."""
        stamp = self._edit
        known = self._calls
        if known is None or known[0] != stamp:
            disjoint = _CALLING_ATTRS.isdisjoint  # most instructions: no attribute names a computation
            pairs = []
            for inst in self.instructions:
                if not disjoint(inst.attrs):
                    called = inst.called_computations
                    if called:
                        pairs.append((inst, called))
            known = self._calls = (stamp, tuple(pairs))
        return known[1]

    def instruction(self, name: str) -> Instruction:
        """The instruction of this name (KeyError if none)."""
        for inst in self.instructions:
            if inst.name == name:
                return inst
        raise KeyError(name)

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"<Computation {self.name}: {len(self.instructions)} instructions>"

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def to_text(self) -> str:
        """This computation as HLO text."""
        from hlopt.hlo.printer import computation_text

        return computation_text(self)


_SPLIT_CACHE: dict[str, tuple[str, int | None]] = {}


def _split_name(name: str) -> tuple[str, int | None]:
    """`name` as (base, N) when it ends in `.N` (ASCII digits), else (name, None); cached."""
    got = _SPLIT_CACHE.get(name)
    if got is None:
        head, dot, tail = name.rpartition(".")
        got = (head, int(tail)) if dot and tail.isascii() and tail.isdigit() else (name, None)
        if len(_SPLIT_CACHE) < 1 << 16:
            _SPLIT_CACHE[name] = got
    return got


class Module:
    """An HLO module: header configuration, computations, the entry, optional stack-trace trailer."""

    def __init__(self, name: str):
        self.name = name
        self.computations: list[Computation] = []
        self.entry: Computation | None = None
        self.config: dict[str, Any] = {}
        self.trailer: str = ""  # FileNames/FunctionNames/FileLocations/StackFrames sections, verbatim
        self._name_ids: dict[str, int] = {}
        self._names: set[str] = set()
        #: Edits made through the IR's methods (operands, control edges, instructions added, removed or
        #: reordered, roots, computations, `attrs` writes): pipelines compare it around a pass. Direct
        #: writes to `shape` or `name` and changes inside an attribute's value are not counted.
        self.mutations = 0
        self._unnoted: list[str] = []  # names the parser used, noted (`_note_name`) on the next `unique_name`

    def _note_unnoted(self) -> None:
        """Note the names in `_unnoted` (noting is order-free: a set and running maxima)."""
        unnoted = self._unnoted[:]
        self._unnoted.clear()
        self._names.update(unnoted)
        ids = self._name_ids
        get = ids.get
        for name in unnoted:  # `_split_name` inline, uncached: parsed names are split once
            head, dot, tail = name.rpartition(".")
            if dot and tail.isascii() and tail.isdigit():
                num = int(tail)
                if num > get(head, -1):
                    ids[head] = num
            elif name not in ids:
                ids[name] = 0

    # ----------------------------------------------------------------- names
    def _note_name(self, name: str) -> None:
        names = self._names
        if name in names:
            return  # noted before (noting is idempotent: a set and running maxima)
        names.add(name)
        prefix, num = _SPLIT_CACHE.get(name) or _split_name(name)
        ids = self._name_ids
        if num is not None:
            if num > ids.get(prefix, -1):
                ids[prefix] = num
        elif prefix not in ids:
            ids[prefix] = 0

    def unique_name(self, prefix: str) -> str:
        """A name not yet used in this module, `prefix` (less any `.N` suffix) or `prefix.N`."""
        if self._unnoted:
            self._note_unnoted()
        base = (_SPLIT_CACHE.get(prefix) or _split_name(prefix))[0] or prefix
        names, ids = self._names, self._name_ids
        n = ids.get(base)
        if n is None and base not in names:
            self._note_name(base)  # a base like `x.3` (from `x.3.4`) also raises the count of `x`
            return base
        # `base.{n+1}` is free: every name noted as `base.N` raised `ids[base]` to N at least (`_note_name`,
        # `_note_unnoted`, here), and `ids` never goes down
        n = (n or 0) + 1
        name = f"{base}.{n}"
        names.add(name)
        ids[base] = n
        return name

    # ----------------------------------------------------------------- computations
    @property
    def is_scheduled(self) -> bool:
        """Whether the module carries a schedule (instruction order of each computation)."""
        return self.config.get("is_scheduled") is True

    @is_scheduled.setter
    def is_scheduled(self, value: bool) -> None:
        if value:
            self.config["is_scheduled"] = True
        else:
            self.config.pop("is_scheduled", None)

    def add_computation(self, comp: Computation, before: Computation | None = None, entry: bool = False) -> Computation:
        """Add a computation (before another one, else at the end before the entry) and return it."""
        comp.module = self
        self._note_name(comp.name)
        for inst in comp.instructions:
            self._note_name(inst.name)
        if before is not None:
            self.computations.insert(self.computations.index(before), comp)
        elif self.entry is not None and self.entry in self.computations and not entry:
            self.computations.insert(self.computations.index(self.entry), comp)
        else:
            self.computations.append(comp)
        if entry:
            self.entry = comp
        self.mutations += 1
        return comp

    def update_computations(self, added: dict[Computation, Computation], removed: Iterable[Computation] = ()) -> None:
        """Add many computations and remove many in one pass over the list (adding one by one is
        quadratic on modules with thousands): each of `added` goes just before the computation it maps
        to (its caller; at the end before the entry if that is not in the module)."""
        removed = set(removed)
        before: dict[Computation, list[Computation]] = {}
        for comp, caller in added.items():
            comp.module = self
            self._note_name(comp.name)
            for inst in comp.instructions:
                self._note_name(inst.name)
            before.setdefault(caller, []).append(comp)
        out: list[Computation] = []
        for comp in self.computations:
            if comp in removed:
                comp.module = None if comp.module is self else comp.module
                continue
            out.extend(before.pop(comp, ()))
            out.append(comp)
        rest = [c for group in before.values() for c in group]
        if rest:
            at = out.index(self.entry) if self.entry in out else len(out)
            out[at:at] = rest
        self.computations[:] = out
        self.mutations += 1

    def remove_computation(self, comp: Computation) -> None:
        """Remove a computation (callers must not call it any more)."""
        self.computations.remove(comp)
        comp.module = None
        self.mutations += 1

    def computation(self, name: str) -> Computation:
        """The computation of this name."""
        for c in self.computations:
            if c.name == name:
                return c
        raise KeyError(name)

    def computations_post_order(self) -> list[Computation]:
        """Every computation reachable from the entry (and the rest), callees before callers."""
        visited: set[Computation] = set()
        order: list[Computation] = []

        def visit(c: Computation) -> None:
            stack = [(c, iter(c.called_computations()))]
            visited.add(c)
            while stack:
                node, it = stack[-1]
                for callee in it:
                    if callee not in visited:
                        visited.add(callee)
                        stack.append((callee, iter(callee.called_computations())))
                        break
                else:
                    stack.pop()
                    order.append(node)

        roots = ([self.entry] if self.entry else []) + self.computations
        for c in roots:
            if c not in visited:
                visit(c)
        return order

    def reachable_computations(self) -> set[Computation]:
        """Computations reachable from the entry."""
        if self.entry is None:
            return set()
        seen = {self.entry}
        work = [self.entry]
        while work:
            for callee in work.pop().called_computations():
                if callee not in seen:
                    seen.add(callee)
                    work.append(callee)
        return seen

    def callers(self, comp: Computation) -> list[Instruction]:
        """Instructions (anywhere in the module) that call `comp`."""
        return [i for c in self.computations for i in c.instructions if comp in i.called_computations]

    def call_graph(self) -> dict[Computation, list[Instruction]]:
        """Map each computation to the instructions that call it."""
        graph: dict[Computation, list[Instruction]] = {c: [] for c in self.computations}
        for c in self.computations:
            for inst in c.instructions:
                for callee in inst.called_computations:
                    graph.setdefault(callee, []).append(inst)
        return graph

    def instructions(self) -> Iterator[Instruction]:
        """Every instruction of every computation."""
        for c in self.computations:
            yield from c.instructions

    def instruction_count(self) -> int:
        """Total number of instructions."""
        return sum(len(c) for c in self.computations)

    # ----------------------------------------------------------------- text
    def to_text(self) -> str:
        """The module as HLO text that XLA's parser accepts."""
        from hlopt.hlo.printer import module_text

        return module_text(self)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"<Module {self.name}: {len(self.computations)} computations, {self.instruction_count()} instructions>"

    def clone(self) -> Module:
        """A deep copy (through the text form, which is lossless)."""
        from hlopt.hlo.parser import parse

        return parse(self.to_text())
