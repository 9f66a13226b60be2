"""Copying a computation into a module (XLA's `HloComputation::Clone` followed by `AddEmbeddedComputation`).

    %body (p: f32[4]) -> f32[4] { ... }          clone_computation(module, body)
                                         ==>     %body.1 (p.1: f32[4]) -> f32[4] { ... }   (added before %body)
"""

from __future__ import annotations

from hlopt.hlo.ir import Computation, Instruction, Module

__all__ = ["clone_computation"]


def clone_computation(module: Module, comp: Computation, *, deep: bool = False) -> Computation:
    """A copy of `comp` under fresh names, added to `module` just before it: instructions, root, control edges,
    execution thread and inline printing. The copy calls the same computations, or with `deep` private copies
    of each (made the same way) except those named by `to_apply` (reducers, comparators, a call's callee),
    which stay shared."""
    copy = Computation(module.unique_name(comp.name))
    copy.execution_thread = comp.execution_thread
    copy.is_inline = comp.is_inline
    mapping: dict[Instruction, Instruction] = {}
    for inst in comp.post_order():
        clone = inst.clone(name=module.unique_name(inst.name), operands=[mapping[o] for o in inst.operands])
        clone.inline = inst.inline
        if deep:
            for callee in clone.called_computations:
                if callee is not clone.attrs.get("to_apply"):
                    clone.replace_called_computation(callee, clone_computation(module, callee, deep=True))
        mapping[inst] = copy.add(clone)
    for inst in comp.instructions:
        for succ in inst.control_successors:
            mapping[inst].add_control_successor(mapping[succ])
    copy.set_root(mapping[comp.root])
    module.add_computation(copy, before=comp)
    return copy
