"""dce: remove dead instructions and the computations nothing reachable calls (XLA's HloDCE).

Before:                                        After:
    ENTRY %main (p: f32[4]) -> f32[4] {            ENTRY %main (p: f32[4]) -> f32[4] {
      %p = f32[4] parameter(0)                       %p = f32[4] parameter(0)
      %e = f32[4] exponential(%p)                    ROOT %n = f32[4] negate(%p)
      %a = f32[4] add(%e, %e)                      }
      ROOT %n = f32[4] negate(%p)
    }

As XLA: an instruction is dead when nothing uses it and it is not its computation's root; it stays
when it has control dependencies, is a parameter, or has a side effect (`hlo.side_effects`, the one
rule: send/recv, infeed/outfeed, rng, side-effecting custom-calls, async collectives, collectives with
a channel outside SPMD modules or with constrain_layout, ... and anything calling a computation that
has one). A dead
`custom-call(x), custom_call_target="Sharding"` stays when x is a root, a parameter or used
elsewhere; the frontend attribute `xla_allow_dce_side_effecting_op` ("true"/"false") overrides for
async ops. Computations the entry cannot reach are removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.opcodes import async_base
from hlopt.hlo.side_effects import LAYOUT_CONSTRAINED, SideEffects, chain_start
from hlopt.passes.framework.base import ModulePass, call_graph
from hlopt.passes.framework.registry import register

__all__ = ["DeadCodeElimination", "SideEffects", "remove_dead_instructions", "remove_unreachable_computations"]

#: Collectives `remove_cross_partition_collective_ops` lets DCE remove (XLA's HloCollectiveInstruction).
_COLLECTIVES = LAYOUT_CONSTRAINED | {"collective-broadcast"}
_ASYNC = frozenset({"async-start", "async-update", "async-done"})
_ALLOW_DCE = "xla_allow_dce_side_effecting_op"


def _dce_attr(inst: Instruction) -> str | None:
    for x in (inst, chain_start(inst)):
        value = x.frontend_attributes.get(_ALLOW_DCE)
        if value is not None:
            return str(value)
    return None


def _keeps_sharding(inst: Instruction) -> bool:
    if inst.opcode != "custom-call" or inst.attrs.get("custom_call_target") != "Sharding" or not inst.operand_count:
        return False
    x = inst.operand(0)
    return x.is_root or x.opcode == "parameter" or x.user_count != 1


def can_remove(inst: Instruction, effects: SideEffects, remove_collectives: bool = False) -> bool:
    """XLA's CanRemoveInstruction: dead, no control edges, not a parameter, no (unallowed) side effect."""
    comp = inst.parent
    if comp is None or inst.user_count or inst is comp.root or inst.opcode == "parameter":
        return False
    if inst.control_predecessors or inst.control_successors or _keeps_sharding(inst):
        return False
    attr = _dce_attr(inst)
    if attr == "false":
        return False
    if not effects(inst):
        return True
    if remove_collectives and inst.opcode in _COLLECTIVES and inst.attrs.get("constrain_layout") is not True:
        return True
    is_async = inst.opcode in _ASYNC or async_base(inst.opcode) is not None
    custom = inst.opcode == "custom-call" and inst.attrs.get("custom_call_target") == "tpu_custom_call"
    return attr == "true" and (is_async or custom)


def remove_dead_instructions(comp: Computation, effects: SideEffects | None = None,
                             remove_collectives: bool = False) -> int:
    """Remove the dead instructions of one computation (users before operands, so chains go at once)."""
    root = comp.root
    if all(inst is root or inst.opcode == "parameter" for inst in comp.unused_instructions()):
        return 0  # nothing is dead (the common case): no post order needed
    effects = effects or SideEffects(comp.module)
    removed = 0
    for inst in reversed(comp.post_order()):
        if inst.parent is comp and can_remove(inst, effects, remove_collectives):
            comp.remove(inst)
            removed += 1
    return removed


def remove_unreachable_computations(module: Module, reachable: set[Computation] | None = None) -> int:
    """Remove the computations the entry cannot reach (`reachable`: those it reaches, when known)."""
    reachable = module.reachable_computations() if reachable is None else reachable
    dead = [c for c in module.computations if c not in reachable]
    if dead:
        module.update_computations({}, dead)  # one pass over the list (one by one is quadratic)
    return len(dead)


def _reachable_callers_first(module: Module) -> list[Computation]:
    if module.entry is None:
        return []
    callees = call_graph(module)[0]  # one scan of the instructions
    order, seen, stack = [], {module.entry}, [module.entry]
    while stack:
        comp = stack.pop()
        order.append(comp)
        known = callees.get(comp)
        for callee in known if known is not None else comp.called_computations():
            if callee not in seen:
                seen.add(callee)
                stack.append(callee)
    return order


@register
@dataclass(frozen=True)
class DeadCodeElimination(ModulePass):
    """Remove dead instructions (callers before callees) and unreachable computations."""

    name: ClassVar[str] = "dce"
    remove_cross_partition_collective_ops: bool = False

    def run(self, module: Module) -> bool:
        effects = SideEffects(module)
        removed = 0
        order = _reachable_callers_first(module)
        for comp in order:
            removed += remove_dead_instructions(comp, effects, self.remove_cross_partition_collective_ops)
        # with nothing removed, what the entry reaches is what was walked above
        removed += remove_unreachable_computations(module, None if removed else set(order))
        return removed > 0
