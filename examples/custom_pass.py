"""A user-written pass: fold `multiply(x, broadcast(constant 2))` into `add(x, x)`.

Run it on a dumped module:

    hlopt opt dump.hlo --load examples/custom_pass.py -p 'mul-by-two-to-add{max_rewrites=100},dce'
    hlopt check dump.hlo --load examples/custom_pass.py -p mul-by-two-to-add
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo import Instruction, Module
from hlopt.hlo.builder import Builder
from hlopt.passes import ModulePass, register


def _is_splat_two(inst: Instruction) -> bool:
    while inst.opcode == "broadcast":
        inst = inst.operand(0)
    literal = inst.get("literal")
    return literal is not None and inst.shape.rank == 0 and literal.scalar() == 2


@register
@dataclass(frozen=True)
class MulByTwoToAdd(ModulePass):
    """multiply(x, 2) -> add(x, x) for floating-point x (exact in IEEE arithmetic)."""

    name: ClassVar[str] = "mul-by-two-to-add"
    max_rewrites: int = 1_000_000

    def run(self, module: Module) -> bool:
        rewrites = 0
        for comp in module.computations:
            for inst in list(comp.instructions):
                if rewrites >= self.max_rewrites:
                    return rewrites > 0
                if inst.opcode != "multiply" or not inst.shape.element_type.is_float:
                    continue
                x, two = inst.operands
                if not _is_splat_two(two):
                    x, two = two, x
                if _is_splat_two(two):
                    comp.replace_instruction(inst, Builder(comp, before=inst).add(x, x))
                    rewrites += 1
        return rewrites > 0
