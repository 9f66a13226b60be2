"""cse: merge identical instructions (XLA's HloCSE).

Before:                                        After:
    %a = f32[4] add(%p, %q)                        %a = f32[4] add(%p, %q)
    %b = f32[4] add(%q, %p)                        ROOT %m = f32[4] multiply(%a, %a)
    ROOT %m = f32[4] multiply(%a, %b)

As XLA: first equal constants (same shape, layout included, and same literal; elided `{...}`
literals never) are merged, then, in post order, each instruction identical to an earlier one is
replaced by it. Identical means same opcode, shape (layout included unless `is_layout_sensitive` is
off), operands (either order for binary commutative ops), attributes (metadata ignored), sharding,
and called computations equal in structure. Never merged: parameters and other operand-less
instructions (except iota, partition-id and replica-id), side-effecting instructions, rng,
after-all / add-dependency, instructions carrying MUST_FUSE, and instructions with control
dependencies.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, ClassVar

from hlopt.hlo.attributes import Metadata, format_value
from hlopt.hlo.ir import COMPUTATION_ATTRS, COMPUTATION_LIST_ATTRS, Computation, Instruction, Module
from hlopt.passes.dce import SideEffects
from hlopt.passes.framework.base import ModulePass, call_graph, post_order
from hlopt.passes.framework.fixed_points import fixed_points
from hlopt.passes.framework.match import COMMUTATIVE, remove_with_unused_operands
from hlopt.passes.framework.registry import register

__all__ = ["CommonSubexpressionElimination", "computation_fingerprint"]

_NEVER = frozenset({"parameter", "constant", "rng", "rng-bit-generator", "after-all", "add-dependency", "domain",
                    "send", "recv", "infeed", "outfeed"})
_NULLARY_OK = frozenset({"iota", "partition-id", "replica-id"})
_ASYNC_SUFFIXES = ("-start", "-update", "-done")  # an async pair must keep its own start
#: opcode -> not in _NEVER and no async part (`eligible`, by opcode)
_MERGEABLE: dict[str, bool] = {}
_ID = attrgetter("id")
_UNKNOWN = object()  # an attribute key not built yet


class _Keys:
    """Equality keys of instructions and structural fingerprints of computations, memoized."""

    def __init__(self, layout_sensitive: bool):
        self.layout_sensitive = layout_sensitive
        self.fingerprints: dict[Computation, str] = {}

    def shape(self, inst: Instruction) -> Any:
        return inst.shape if self.layout_sensitive else inst.shape.without_layout()

    def attrs(self, inst: Instruction) -> tuple:
        values = inst.attrs
        if not values:
            return ()
        items = []
        for key, value in values.items():
            if key == "metadata" or isinstance(value, Metadata):
                continue
            if key in COMPUTATION_ATTRS and isinstance(value, Computation):
                items.append((key, self.computation(value)))
            elif key in COMPUTATION_LIST_ATTRS and isinstance(value, list):
                items.append((key, tuple(self.computation(c) for c in value)))
            elif key == "literal":  # an elided literal ({...}) equals no other: its values are unknown
                items.append((key, f"elided#{id(value)}" if value.is_elided else value.text))
            else:
                items.append((key, format_value(key, value)))
        return tuple(sorted(items))

    def head(self, inst: Instruction, operand_ids: tuple) -> tuple:
        """The key without its attributes: (opcode, shape, operand ids, in order unless commutative)."""
        if inst.opcode in COMMUTATIVE and len(operand_ids) == 2:
            operand_ids = tuple(sorted(operand_ids))
        return inst.opcode, inst.shape if self.layout_sensitive else inst.shape.without_layout(), operand_ids

    def local(self, inst: Instruction, operand_ids: tuple) -> tuple:
        """The whole equality key: `head` and the attributes."""
        return (*self.head(inst, operand_ids), self.attrs(inst))

    def computation(self, comp: Computation) -> str:
        """A digest equal for computations of the same structure (names ignored)."""
        found = self.fingerprints.get(comp)
        if found is None:
            index: dict[Instruction, int] = {}
            parts = []
            for inst in comp.post_order():
                index[inst] = len(index)
                parts.append(self.local(inst, tuple(index[o] for o in inst.operands)))
                parts.append(tuple(index.get(p, -1) for p in inst.control_predecessors))
            parts.append(index[comp.root])
            found = hashlib.sha1(repr(parts).encode()).hexdigest()
            self.fingerprints[comp] = found
        return found


def computation_fingerprint(comp: Computation, layout_sensitive: bool = True) -> str:
    """A digest equal for computations of the same structure (instruction names ignored)."""
    return _Keys(layout_sensitive).computation(comp)


def _combine_constants(comp: Computation, keys: _Keys) -> bool:
    """Merge constants of equal shape and literal (XLA's CombineConstants)."""
    first: dict[tuple, Instruction] = {}
    changed = False
    for inst in comp.instructions:
        if inst.opcode != "constant" or inst.control_predecessors or inst.control_successors:
            continue
        literal = inst.attrs.get("literal")
        if literal is None or literal.is_elided:
            continue
        key = (keys.shape(inst), literal.text, str(inst.sharding))
        rep = first.setdefault(key, inst)
        if rep is inst:
            continue
        inst.replace_all_uses_with(rep)
        comp.remove(inst)
        changed = True
    return changed


@register
@dataclass(frozen=True)
class CommonSubexpressionElimination(ModulePass):
    """Replace every instruction identical to an earlier one by that one, in every computation."""

    name: ClassVar[str] = "cse"
    is_layout_sensitive: bool = True
    only_fusion_computations: bool = False

    def eligible(self, inst: Instruction, effects: SideEffects) -> bool:
        """XLA's ShouldEliminateInstruction and IsSafelyRemovable (plus rng, never merged)."""
        op = inst.opcode
        mergeable = _MERGEABLE.get(op)
        if mergeable is None:
            mergeable = _MERGEABLE[op] = op not in _NEVER and not op.endswith(_ASYNC_SUFFIXES)
        if not mergeable or (not inst.operand_count and op not in _NULLARY_OK) or inst.has_control_dependencies:
            return False
        frontend = inst.attrs.get("frontend_attributes")
        if frontend and "MUST_FUSE" in frontend:
            return False
        if effects.own(inst):  # `effects(inst)`, spelled out: no generator for the many that call nothing
            return False
        called = inst.called_computations
        return not called or not any(map(effects.computation, called))

    def run_on_computation(self, comp: Computation, keys: _Keys, effects: SideEffects) -> bool:
        """CSE one computation.

        An instruction's key is (opcode, shape, operand ids, attributes: `_Keys.local`); the attributes' part
        (formatted values, called computations' fingerprints) is built only for instructions whose first three
        parts equal another's (a bucket of representatives with distinct attribute keys), which is rare: the
        same merges as with whole keys, without building most of them."""
        changed = _combine_constants(comp, keys)
        #: (opcode, shape, operand ids) -> [[attribute key (or _UNKNOWN, not built yet), representative], ...]
        buckets: dict[tuple, list[list]] = {}
        for inst in comp.post_order():
            if inst.parent is not comp or not self.eligible(inst, effects):
                continue
            head = keys.head(inst, tuple(map(_ID, inst.operands)))
            bucket = buckets.get(head)
            if bucket is None:
                buckets[head] = [[_UNKNOWN, inst]]
                continue
            attrs = keys.attrs(inst)
            for entry in bucket:
                if entry[0] is _UNKNOWN:
                    entry[0] = keys.attrs(entry[1])
                if entry[0] == attrs:
                    break
            else:
                bucket.append([attrs, inst])
                continue
            rep = entry[1]
            if rep.parent is not comp:
                entry[1] = inst
                continue
            inst.replace_all_uses_with(rep)
            remove_with_unused_operands(inst, effects)
            changed = True
        return changed

    def run(self, module: Module) -> bool:
        """CSE every computation (callees first) that is not as a run of this pass left it (one run leaves
        each computation at its fixed point: later instructions are keyed by operands already merged, and
        callees are done before their callers are keyed by them; `passes.framework.fixed_points`)."""
        keys = _Keys(self.is_layout_sensitive)
        effects = SideEffects(module)
        callees, calls = call_graph(module)
        fused = {c for opcode, called in calls if opcode == "fusion" for c in called} \
            if self.only_fusion_computations else None
        order = post_order(module, callees)
        done = fixed_points(module, self.describe(), effects.spmd)  # side effects read the partition count
        dirty = done.dirty(order, callees)
        changed = False
        for comp in order:
            if (fused is not None and comp not in fused) or comp not in dirty:
                continue
            if self.run_on_computation(comp, keys, effects):
                changed = True
                keys.fingerprints.pop(comp, None)
            done.mark(comp)
        return changed
