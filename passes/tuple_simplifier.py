"""tuple-simplifier: fold get-tuple-element of tuple, and tuples of every element of one value (XLA's
TupleSimplifier).

Before:                                                After:
    %t = (f32[], s32[]) tuple(%a, %b)                      (uses of %g use %b)
    %g = s32[] get-tuple-element(%t), index=1
    %x0 = f32[] get-tuple-element(%x), index=0             (uses of %u use %x)
    %x1 = s32[] get-tuple-element(%x), index=1
    %u = (f32[], s32[]) tuple(%x0, %x1)

As XLA: chains of get-tuple-elements resolve through nested tuples; a tuple is replaced by the value
whose elements it lists when their shapes are compatible; a replacement is refused when both carry
different shardings; control edges are relayed (predecessors to the users, successors to the
replacement); the replacement takes the replaced instruction's op_name, frontend attributes and
sharding when it has none. `exclude_entry_computation` leaves the entry alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.passes.dce import SideEffects
from hlopt.passes.framework.base import ModulePass, module_opcodes
from hlopt.passes.framework.match import replace_instruction
from hlopt.passes.framework.registry import register

__all__ = ["TupleSimplifier", "forwarded_element", "whole_tuple_source"]


def forwarded_element(gte: Instruction) -> Instruction | None:
    """What a get-tuple-element (chain) reads, when it reads straight out of tuple instructions."""
    indices = []
    x = gte
    while x.opcode == "get-tuple-element":
        indices.append(x.attrs["index"])
        x = x.operand(0)
    for index in reversed(indices):
        if x.opcode != "tuple":
            return None
        x = x.operand(index)
    return x


def whole_tuple_source(tup: Instruction) -> Instruction | None:
    """For tuple(gte(x, 0), ..., gte(x, n-1)) with x's shape compatible, x."""
    source = None
    for i, op in enumerate(tup.operands):
        if op.opcode != "get-tuple-element" or op.attrs.get("index") != i:
            return None
        if source is None:
            source = op.operand(0)
            if not source.shape.compatible(tup.shape):
                return None
        elif op.operand(0) is not source:
            return None
    return source


_CANDIDATES = frozenset({"tuple", "get-tuple-element"})


def _replacement(inst: Instruction) -> Instruction | None:
    """What a tuple or get-tuple-element would be replaced by (reading only, no edit), or None."""
    if inst.opcode == "tuple":
        return whole_tuple_source(inst) if inst.operand_count else None
    return forwarded_element(inst)


def _relay_control_dependencies(inst: Instruction, replacement: Instruction) -> None:
    """XLA's RelayControlDependenciesSafely: nothing scheduled moves before a predecessor."""
    for pred in inst.control_predecessors:
        for after in inst.users or inst.control_successors:
            if after is not pred:
                pred.add_control_successor(after)
    for succ in inst.control_successors:
        if succ is not replacement:
            replacement.add_control_successor(succ)
    inst.drop_control_dependencies()


def _aliased_entry_root(inst: Instruction, new: Instruction) -> bool:
    """Keep an entry result distinct from a parameter when the module declares aliasing."""
    comp = inst.parent
    module = comp.module
    if not comp.is_entry or new.opcode != "parameter" or module is None:
        return False
    if "input_output_alias" not in module.config and "buffer_donor" not in module.config:
        return False
    return inst.is_root or any(u.is_root for u in inst.users)


@register
@dataclass(frozen=True)
class TupleSimplifier(ModulePass):
    """get-tuple-element(tuple(...)) -> the element; tuple(gte(x, 0..n-1)) -> x."""

    name: ClassVar[str] = "tuple-simplifier"
    exclude_entry_computation: bool = False

    def _replace(self, inst: Instruction, new: Instruction, effects: SideEffects) -> bool:
        if new is inst or _aliased_entry_root(inst, new):
            return False
        if inst.sharding is not None and new.sharding is not None and inst.sharding != new.sharding:
            return False
        _relay_control_dependencies(inst, new)
        return replace_instruction(inst, new, preserve_sharding=True, effects=effects)

    def run_on_computation(self, comp: Computation, effects: SideEffects) -> bool:
        """Simplify one computation. When no tuple or get-tuple-element of it has a replacement as the
        computation stands, nothing would change: the walk in post order is left out."""
        if all(_replacement(i) is None for i in comp.instructions if i.opcode in _CANDIDATES):
            return False
        changed = False
        for inst in comp.post_order():
            if inst.parent is not comp:
                continue
            if inst.opcode not in _CANDIDATES:
                continue
            new = _replacement(inst)
            if new is not None:
                changed |= self._replace(inst, new, effects)
        return changed

    def run(self, module: Module) -> bool:
        if _CANDIDATES.isdisjoint(module_opcodes(module)):
            return False
        effects = SideEffects(module)
        changed = False
        if all(_replacement(i) is None for c in module.computations for i in c.instructions
               if i.opcode in _CANDIDATES):
            return False  # nothing has a replacement as the module stands: the walks change nothing
        for comp in module.computations_post_order():
            if self.exclude_entry_computation and comp is module.entry:
                continue
            changed |= self.run_on_computation(comp, effects)
        return changed
