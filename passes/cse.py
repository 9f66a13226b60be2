"""cse: merge identical instructions (XLA's HloCSE).

    %a = f32[4] add(%p, %q)                   %a = f32[4] add(%p, %q)
    %b = f32[4] add(%p, %q)          =>       ROOT %m = f32[4] multiply(%a, %a)
    ROOT %m = f32[4] multiply(%a, %b)
Identical means same opcode, shape (layout included), operands, called computations and attributes
(metadata ignored); constants are merged by value. Side-effecting instructions, collectives, async ops
and instructions with control dependencies are never merged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlo.attributes import Metadata, format_value
from hlo.ir import COMPUTATION_ATTRS, COMPUTATION_LIST_ATTRS, Computation, Instruction
from hlo.opcodes import COLLECTIVES
from passes.base import ComputationPass
from passes.registry import register

__all__ = ["CommonSubexpressionElimination"]

_NEVER = COLLECTIVES | {"parameter", "rng", "rng-bit-generator", "infeed", "outfeed", "send", "recv",
                        "after-all", "custom-call", "while", "conditional"}


def _attr_key(inst: Instruction) -> tuple:
    items = []
    for key, value in inst.attrs.items():
        if key == "metadata" or isinstance(value, Metadata):
            continue
        if key == "literal":
            items.append((key, value.text))
        elif key in COMPUTATION_ATTRS:
            items.append((key, id(value)))
        elif key in COMPUTATION_LIST_ATTRS:
            items.append((key, tuple(id(c) for c in value)))
        else:
            items.append((key, format_value(key, value)))
    return tuple(sorted(items))


def _key(inst: Instruction) -> tuple:
    return (inst.opcode, inst.shape, tuple(id(o) for o in inst.operands), _attr_key(inst))


def _eligible(inst: Instruction) -> bool:
    return (inst.opcode not in _NEVER and not inst.has_side_effect and not inst.control_predecessors
            and not inst.control_successors and not inst.inline)


@register
@dataclass(frozen=True)
class CommonSubexpressionElimination(ComputationPass):
    """Replace each instruction identical to an earlier one by that one."""

    name: ClassVar[str] = "cse"

    def run_on_computation(self, computation: Computation) -> bool:
        seen: dict[tuple, Instruction] = {}
        changed = False
        for inst in list(computation.instructions):
            if inst.parent is not computation or not _eligible(inst):
                continue
            key = _key(inst)
            first = seen.get(key)
            if first is None:
                seen[key] = inst
                continue
            inst.replace_all_uses_with(first)
            if computation.root is inst:
                computation.root = first
            if not inst.user_count and inst is not computation.root:
                computation.remove(inst)
            changed = True
        return changed
