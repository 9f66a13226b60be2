"""dce: remove dead instructions and computations nothing calls (XLA's HloDCE).

Before:                                   After:
    %a = f32[4] add(%p, %p)                   ROOT %n = f32[4] negate(%p)
    ROOT %n = f32[4] negate(%p)
Side-effecting instructions (send/recv, infeed/outfeed, custom-calls marked so, async ops, ...),
parameters and instructions with control successors stay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlo.ir import Computation, Instruction, Module
from passes.base import ModulePass
from passes.registry import register

__all__ = ["DeadCodeElimination", "remove_dead_instructions", "remove_unreachable_computations"]


def _removable(inst: Instruction, comp: Computation) -> bool:
    return (not inst.user_count and inst is not comp.root and not inst.has_side_effect
            and not inst.control_successors)


def remove_dead_instructions(comp: Computation) -> int:
    """Remove dead instructions of one computation (in reverse order, so chains go at once)."""
    removed = 0
    for inst in reversed(list(comp.instructions)):
        if inst.parent is comp and _removable(inst, comp):
            inst.drop_control_dependencies()
            comp.remove(inst)
            removed += 1
    return removed


def remove_unreachable_computations(module: Module) -> int:
    """Remove computations the entry cannot reach."""
    reachable = module.reachable_computations()
    dead = [c for c in module.computations if c not in reachable]
    for comp in dead:
        module.remove_computation(comp)
    return len(dead)


@register
@dataclass(frozen=True)
class DeadCodeElimination(ModulePass):
    """Remove dead instructions and unreachable computations."""

    name: ClassVar[str] = "dce"
    remove_computations: bool = True

    def run(self, module: Module) -> bool:
        removed = 0
        for comp in module.computations_post_order()[::-1]:
            removed += remove_dead_instructions(comp)
        if self.remove_computations:
            removed += remove_unreachable_computations(module)
        return removed > 0
