"""Which computations of a module a pass left at its fixed point, remembered across its runs.

A clean-up pass (cse, algebraic-simplifier, ...) reruns inside a `fix(...)` group, and again in later groups,
on a module that the other passes edited in a few computations only. A rerun on a computation that no IR edit
touched since the pass left it at its fixed point (a run on it that could find nothing more to do), whose
instructions still have the shapes they had then (shapes may be written directly, without a stamp), and whose
called computations are unchanged as well (`FixedPoints.dirty`), would change nothing: the pass skips it, as
XLA's passes find "no change" cheaply. A pass records, per module and per configuration (`fixed_points(module,
key, context)`), the edit clock's tick (`hlo.ir.edit_stamp`) taken once it is done with a computation; `context`
is whatever else the pass reads of the module (its configuration's relevant entries, the entry computation):
a different context forgets the record.

The record lives with the module (a weak map, dropped with it) and holds no reference to the module or its
computations (ids, weak references), so that it never keeps them alive.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import Any

from hlopt.hlo.ir import Computation, Module, edit_stamp

__all__ = ["FixedPoints", "fixed_points", "forget_fixed_points"]

_SHAPE_OF = attrgetter("shape")


class FixedPoints:
    """One pass configuration's record for one module: id(computation) -> (a weak reference to it, the tick
    taken when the pass left it at its fixed point, its instructions' shapes then)."""

    def __init__(self, context: Any):
        self.context = context
        self._entries: dict[int, tuple[weakref.ref, int, tuple]] = {}

    def holds(self, comp: Computation) -> bool:
        """Whether `comp` is as the pass left it at its fixed point: recorded, no IR edit since, same shapes."""
        entry = self._entries.get(id(comp))
        if entry is None or entry[0]() is not comp or comp.edit_stamp >= entry[1]:
            return False
        return tuple(map(_SHAPE_OF, comp.instructions)) == entry[2]

    def marked_at(self, comp: Computation) -> int | None:
        """The tick recorded for `comp` (None when nothing is)."""
        entry = self._entries.get(id(comp))
        return None if entry is None or entry[0]() is not comp else entry[1]

    def callee_holds(self, callee: Computation, caller: Computation) -> bool:
        """Whether `callee` `holds` and was recorded before `caller` was: then it is as it was while the pass
        ran on `caller` (a pass does its callees first; a run cut short by an error leaves a callee recorded
        after its caller, which this refuses)."""
        if not self.holds(callee):
            return False
        at, caller_at = self.marked_at(callee), self.marked_at(caller)
        return at is not None and caller_at is not None and at < caller_at

    def mark(self, comp: Computation) -> None:
        """Record that the pass has just left `comp` at its fixed point (call it once done with `comp`)."""
        self._entries[id(comp)] = (weakref.ref(comp), edit_stamp(), tuple(map(_SHAPE_OF, comp.instructions)))

    def forget(self, comp: Computation) -> None:
        """Drop what is recorded of `comp` (the pass left it where a rerun may change it)."""
        self._entries.pop(id(comp), None)

    def dirty(self, order: Iterable[Computation], callees: Mapping[Computation, Iterable[Computation]],
              read: Any = None) -> set[Computation]:
        """The computations of `order` (callees before callers) that a rerun must visit: those that do not
        `hold`, and those calling one that is dirty or was not recorded before it (`callee_holds`), directly or
        through other computations. `read(comp)`, when given, says whether the pass reads into a callee `comp`
        at all (a callee it never reads cannot make its caller dirty)."""
        dirty: set[Computation] = set()
        for comp in order:
            if not self.holds(comp) or any(c in dirty or not self.callee_holds(c, comp)
                                           for c in callees.get(comp, ()) if read is None or read(c)):
                dirty.add(comp)
        return dirty


#: module -> {(pass key): FixedPoints}
_BY_MODULE: weakref.WeakKeyDictionary[Module, dict[Any, FixedPoints]] = weakref.WeakKeyDictionary()


def fixed_points(module: Module, key: Any, context: Any = None) -> FixedPoints:
    """The record of pass configuration `key` on `module`; a fresh one when there is none or when it was made
    under another `context`."""
    records = _BY_MODULE.get(module)
    if records is None:
        records = _BY_MODULE[module] = {}
    got = records.get(key)
    if got is None or got.context != context:
        got = records[key] = FixedPoints(context)
    return got


def forget_fixed_points(module: Module) -> None:
    """Drop every pass's record of `module`: its next runs visit everything (a paranoid pipeline's, which also
    catches edits the IR does not stamp, such as a list attribute changed in place)."""
    _BY_MODULE.pop(module, None)
