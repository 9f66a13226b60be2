"""async-collective-creator: turn synchronous collectives into start/done pairs, as XLA prints them.

Before:
    %ar = f32[8] all-reduce(%x), replica_groups={{0,1}}, to_apply=%add
After:
    %ar-start = f32[8] all-reduce-start(%x), replica_groups={{0,1}}, to_apply=%add
    %ar = f32[8] all-reduce-done(%ar-start)

all-gather and collective-permute get their own start ops (result `(operand, result)`); reduce-scatter
and all-to-all are wrapped: `async-start(...)`, calls=<computation holding the op>, then `async-done`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import TupleShape
from hlopt.passes.framework.base import ModulePass, non_fusion_computations
from hlopt.passes.framework.registry import register

__all__ = ["AsyncCollectiveCreator"]

_DEDICATED = {"all-reduce": "all-reduce-start", "all-gather": "all-gather-start",
              "collective-permute": "collective-permute-start"}
_WRAPPED = ("reduce-scatter", "all-to-all")


@register
@dataclass(frozen=True)
class AsyncCollectiveCreator(ModulePass):
    """Convert all-reduce, all-gather, collective-permute, reduce-scatter, all-to-all into async pairs."""

    name: ClassVar[str] = "async-collective-creator"
    convert_all_reduce: bool = True
    convert_all_gather: bool = True
    convert_collective_permute: bool = True
    convert_reduce_scatter: bool = True
    convert_all_to_all: bool = True

    def enabled(self, opcode: str) -> bool:
        """Whether this opcode is converted."""
        return bool(getattr(self, "convert_" + opcode.replace("-", "_"), False))

    def run(self, module: Module) -> bool:
        """Convert every enabled synchronous collective."""
        changed = False
        for comp in non_fusion_computations(module):
            for inst in list(comp.instructions):
                if inst.opcode in _DEDICATED and self.enabled(inst.opcode):
                    _convert_dedicated(comp, inst)
                    changed = True
                elif inst.opcode in _WRAPPED and self.enabled(inst.opcode):
                    _convert_wrapped(module, comp, inst)
                    changed = True
        return changed


def _start_shape(inst: Instruction):
    if inst.opcode == "all-reduce":
        return inst.shape
    operands = [op.shape for op in inst.operands]
    src = operands[0] if len(operands) == 1 else TupleShape(tuple(operands))
    return TupleShape((src, inst.shape))


def _convert_dedicated(comp: Computation, inst: Instruction) -> None:
    module = comp.module
    start = Instruction(_DEDICATED[inst.opcode], _start_shape(inst), inst.operands,
                        name=module.unique_name(inst.name + "-start"), **dict(inst.attrs))
    comp.add(start, before=inst)
    done_opcode = _DEDICATED[inst.opcode].replace("-start", "-done")
    done = Instruction(done_opcode, inst.shape, [start], name=module.unique_name(inst.name + "-done"))
    if inst.metadata is not None:
        done.metadata = inst.metadata.copy()
    comp.add(done, before=inst)
    _move_control_and_uses(comp, inst, start, done)


def _convert_wrapped(module: Module, comp: Computation, inst: Instruction) -> None:
    wrapped = Computation(module.unique_name(f"async_{inst.opcode.replace('-', '_')}_computation"))
    params = []
    for i, op in enumerate(inst.operands):
        p = Instruction("parameter", op.shape, name=module.unique_name(f"param_{i}"), parameter_number=i)
        wrapped.add(p)
        params.append(p)
    body = Instruction(inst.opcode, inst.shape, params, name=module.unique_name(inst.name), **dict(inst.attrs))
    wrapped.add(body)
    wrapped.set_root(body)
    module.add_computation(wrapped, before=comp)
    start_shape = TupleShape((TupleShape(tuple(op.shape for op in inst.operands)), inst.shape))
    start = Instruction("async-start", start_shape, inst.operands, name=module.unique_name(inst.name + "-start"),
                        calls=wrapped)
    comp.add(start, before=inst)
    done = Instruction("async-done", inst.shape, [start], name=module.unique_name(inst.name + "-done"))
    comp.add(done, before=inst)
    _move_control_and_uses(comp, inst, start, done)


def _move_control_and_uses(comp: Computation, old: Instruction, start: Instruction, done: Instruction) -> None:
    for p in old.control_predecessors:
        p.add_control_successor(start)
    for s in old.control_successors:
        done.add_control_successor(s)
    old.drop_control_dependencies()
    old.replace_all_uses_with(done)
    comp.remove(old)
