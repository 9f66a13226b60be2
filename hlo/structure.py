"""Structural keys of instructions: equal keys, equal structure as a cost model reads it (opcodes, shapes,
attributes but names, metadata and shardings, fused and called computations by their own structure, which
operands are the same value), so that what was computed for one instruction can be reused for another
that is built the same way: the layers of a model repeat the same fusions.

    keys = StructureKeys()
    keys.of(inst)                # one instruction, its operands by shape
    keys.of_kernel(fusion)       # ... and which of its operands are the same value (a kernel's reads)
    keys.of_computation(comp)    # a number: equal numbers, equal structures

`shared_keys(module)` is a module's instance (made on first use, dropped with the module), which the fusion
passes, their never-slower check and the kernel model all read: an instruction keyed by one of them (priority
fusion's trial, multi-output fusion's profiles) is not walked again by the next (the scheduler's kernel
estimates). Ids are never reused and every memo entry is checked against the instruction's edit stamp, so
passes may share it. Numbers are never reused across instances either, so a memo fed by the keys of several
instances (the process-wide kernel model's) never mistakes one structure for another.

A computation's key is remembered until its next edit (`Computation.edit_stamp`), an instruction's key until
the instruction's next edit (operand and attribute changes are stamped, and so is a new shape given with
`Instruction.set_shape`, which stamps the users too) or a new shape object. Direct writes to `shape` are not
stamped: an operand's new shape is not seen until the user's next edit (the IR's builders set a clone's shape
before it joins a computation, a fusion that grows outputs is read through get-tuple-elements, which launch
nothing, and passes that reshape instructions in place use `set_shape`).
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

from hlopt.hlo.ir import Computation, Instruction, Module

__all__ = ["StructureKeys", "UNKEYED_ATTRS", "shared_keys"]

#: Attributes left out of a key: they name things or describe provenance, and no model reads them.
UNKEYED_ATTRS = frozenset({"metadata", "frontend_attributes", "sharding", "calls", "statistics", "origin"})

#: Numbers standing for structures, shared by every instance: a number is never given to two structures.
_NUMBERS = itertools.count()

#: Entries kept before the memo starts afresh (a long-lived model in a hook process sees many modules).
_MAX_ENTRIES = 500_000


class StructureKeys:
    """Structural keys (see the module docstring), with their memos."""

    def __init__(self) -> None:
        #: id(computation) -> (a weak reference to it, its edit stamp, its number)
        self._computations: dict[int, tuple[weakref.ref, int, int]] = {}
        #: a computation's structural key -> a small number standing for it in the keys that contain it (so
        #: that a key is hashed and compared once, not again inside every key that names the computation)
        self._interned: dict[tuple, int] = {}
        self._numbers = _NUMBERS  # never reused, also after the memo starts afresh and across instances
        #: instruction id (never reused) -> (its edit stamp, its shape, its fused computation's number, its key
        #: [, the (attribute, key part) of each attribute naming computations, read again on a hit]): operands and
        #: attributes change only through stamped edits, a shape is compared
        self._keys: dict[int, tuple] = {}
        #: how a computation was built (`derive`) -> the number of what that built
        self._derived: dict[tuple, int] = {}

    def of(self, inst: Instruction) -> tuple:
        """One instruction's key (its operands by shape only)."""
        stamp = inst.edit_stamp
        shape = inst.shape
        fused = self.of_computation(inst.attrs["calls"]) if inst.opcode == "fusion" else None
        hit = self._keys.get(inst.id)
        if hit is not None and hit[0] == stamp and hit[1] is shape and hit[2] == fused:
            if len(hit) == 4:
                return hit[3]
            # the attributes naming computations: the key holds while each reads as it did (their numbers)
            attrs = inst.attrs
            attr = self._attr
            for k, part in hit[4]:
                if attr(attrs[k]) != part:
                    break
            else:
                return hit[3]
        values = inst.attrs
        items = [(k, v) for k, v in values.items() if k not in UNKEYED_ATTRS]
        calling: list[tuple[str, Any]] = []  # (attribute, its key part) where it names computations
        if items:
            if len(items) > 1:
                items.sort(key=_first)
            attr = self._attr
            for i, (k, v) in enumerate(items):
                if type(v) not in _PLAIN:
                    items[i] = (k, attr(v))
                    if _calls(v):
                        calling.append(items[i])
        attrs = tuple(items)
        key = inst.opcode, shape, tuple([o.shape for o in inst.operands]), attrs, fused
        if len(self._keys) > _MAX_ENTRIES:
            self._keys.clear()
        if not calling:
            self._keys[inst.id] = (stamp, shape, fused, key)
        else:
            # a called computation's key follows its own edits, not the instruction's: remembered with the key
            # parts of the attributes naming computations, which a hit reads again (`of_computation`, remembered)
            self._keys[inst.id] = (stamp, shape, fused, key, tuple(calling))
        return key

    def of_kernel(self, inst: Instruction) -> tuple:
        """`of(inst)` and, per operand, the position of its first occurrence (a value read twice)."""
        first: dict[Instruction, int] = {}
        return self.of(inst), tuple([first.setdefault(o, i) for i, o in enumerate(inst.operands)])

    def _attr(self, value: Any) -> Any:
        """An attribute value as a key part: a called computation (a reduce's `to_apply`) by its structure, so
        that the same reduction region of every layer gives one key; anything else as itself."""
        if isinstance(value, Computation):
            return ("computation", self.of_computation(value))
        if isinstance(value, tuple | list) and value and isinstance(value[0], Computation):
            return tuple(self._attr(v) for v in value)
        return _hashable(value)

    def derive(self, comp: Computation, how: tuple) -> int:
        """`of_computation(comp)` for a computation just built as `how` says, a description that determines its
        structure (the keys of the parts it was built from and the move): the first computation built so is
        walked, the next ones (the same fusion in the next layer) take its number without a walk."""
        number = self._derived.get(how)
        if number is not None:
            self._computations[id(comp)] = (weakref.ref(comp), comp.edit_stamp, number)
            return number
        number = self.of_computation(comp)
        if len(self._derived) > _MAX_ENTRIES:
            self._derived.clear()
        self._derived[how] = number
        return number

    def copied(self, copy: Computation, number: int) -> None:
        """`copy` was just made as an exact copy of a computation whose number (`of_computation`, of this or
        another instance) is `number`: it takes that number without a walk (until its next edit)."""
        self._computations[id(copy)] = (weakref.ref(copy), copy.edit_stamp, number)

    def of_computation(self, comp: Computation) -> int:
        """The number of `comp`'s structure (equal numbers: equal structures)."""
        hit = self._computations.get(id(comp))
        if hit is not None and hit[0]() is comp and hit[1] == comp.edit_stamp:
            return hit[2]
        order = comp.instructions  # the whole graph, in its order
        index = {inst: i for i, inst in enumerate(order)}
        root = comp.root
        of = self.of
        known = self._keys
        parts = []
        for inst in order:
            hit = known.get(inst.id)  # `of`'s remembered key, checked inline: the hottest loop of the trial
            if hit is None or hit[0] != inst.edit_stamp or hit[1] is not inst.shape or hit[2] is not None \
                    or inst.opcode == "fusion" or len(hit) != 4:
                k = of(inst)
            else:
                k = hit[3]
            parts.append((k, tuple([index[o] for o in inst.operands]), inst is root))
        key = tuple(parts)
        if len(self._interned) > _MAX_ENTRIES:
            self._interned.clear()
            self._computations.clear()
        number = self._interned.get(key)
        if number is None:
            number = self._interned[key] = next(self._numbers)
        self._computations[id(comp)] = (weakref.ref(comp), comp.edit_stamp, number)
        return number


_SHARED = StructureKeys()
_BY_MODULE: weakref.WeakKeyDictionary[Module, StructureKeys] = weakref.WeakKeyDictionary()


def shared_keys(module: Module | None) -> StructureKeys:
    """`module`'s `StructureKeys` (see the module docstring), or for instructions in no module the process's."""
    if module is None:
        return _SHARED
    got = _BY_MODULE.get(module)
    if got is None:
        got = _BY_MODULE[module] = StructureKeys()
    return got


def _calls(value: Any) -> bool:
    """Whether an attribute value is a computation or a sequence of them (keyed by their own edits)."""
    return isinstance(value, Computation) or (isinstance(value, tuple | list) and bool(value)
                                              and isinstance(value[0], Computation))


#: Attribute value types that are their own key part.
_PLAIN = frozenset({int, str, bool, float, type(None)})


def _first(item: tuple) -> Any:
    return item[0]


def _hashable(value: Any) -> Any:
    """`value` as a hashable key part (its repr when it is not hashable)."""
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value
