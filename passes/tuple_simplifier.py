"""tuple-simplifier: fold get-tuple-element of tuple, and tuple of all get-tuple-elements of one value.

    %t = (f32[], s32[]) tuple(%a, %b); %g = s32[] get-tuple-element(%t), index=1     =>  uses of %g use %b
    %t2 = (f32[], s32[]) tuple(gte(%x, 0), gte(%x, 1))  where %x: (f32[], s32[])      =>  uses of %t2 use %x
(XLA's TupleSimplifier.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlo.ir import Computation, Instruction
from passes.base import ComputationPass
from passes.registry import register

__all__ = ["TupleSimplifier"]


def _gte_of_tuple(inst: Instruction) -> Instruction | None:
    src = inst.operand(0)
    if src.opcode != "tuple":
        return None
    return src.operand(inst.attrs["index"])


def _tuple_of_gtes(inst: Instruction) -> Instruction | None:
    if not inst.operand_count:
        return None
    source = None
    for i, op in enumerate(inst.operands):
        if op.opcode != "get-tuple-element" or op.attrs.get("index") != i:
            return None
        if source is None:
            source = op.operand(0)
        elif op.operand(0) is not source:
            return None
    if source is None or not source.shape.is_tuple or len(source.shape.elements) != inst.operand_count:
        return None
    return source if source.shape.compatible(inst.shape) else None


@register
@dataclass(frozen=True)
class TupleSimplifier(ComputationPass):
    """gte(tuple(...)) -> element; tuple(gte(x, 0..n-1)) -> x."""

    name: ClassVar[str] = "tuple-simplifier"

    def run_on_computation(self, computation: Computation) -> bool:
        changed = False
        for inst in list(computation.instructions):
            if inst.parent is not computation:
                continue
            if inst.opcode == "get-tuple-element":
                new = _gte_of_tuple(inst)
            elif inst.opcode == "tuple":
                new = _tuple_of_gtes(inst)
            else:
                continue
            if new is None or new is inst:
                continue
            if not inst.user_count and inst is not computation.root:
                continue
            if inst is computation.root and computation.is_entry and new.opcode == "parameter":
                continue  # keep the entry's result distinct from its parameter (aliasing)
            inst.replace_all_uses_with(new)
            if computation.root is inst:
                computation.root = new
            changed = True
        return changed
