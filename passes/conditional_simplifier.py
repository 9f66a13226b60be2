"""conditional-simplifier: remove conditionals whose branch is known, or whose branches are cheap enough
to run both and select (XLA's ConditionalSimplifier::TryRemoveConditional).

Cheap branches, before:                              After (both branches inlined, then a select):
    %on_true (a: f32[4]) -> f32[4] {                     %s = f32[4] sine(%x)
      %a = f32[4] parameter(0)                           %c = f32[4] cosine(%x)
      ROOT %s = f32[4] sine(%a)                          %b = pred[4] broadcast(%p), dimensions={}
    }                                                    ROOT %r = f32[4] select(%b, %s, %c)
    %on_false (b: f32[4]) -> f32[4] {
      %b = f32[4] parameter(0)
      ROOT %c = f32[4] cosine(%b)
    }
    ROOT %r = f32[4] conditional(%p, %x, %x), true_computation=%on_true, false_computation=%on_false

XLA's rules, in order:
- left alone: conditionals with control edges, with a side effect anywhere in their branches, that
  call channel instructions (send/recv/collectives with a channel id), or that carry a sharding;
- a conditional with one branch is that branch, inlined (the index does not matter);
- a constant index picks its branch (pred: true -> branch 0; s32 out of range -> the last branch),
  which is inlined;
- a pred conditional (or one indexed by convert(pred), as jax lowers `lax.cond`: index 1 when true)
  whose two branches hold only cheap instructions (elementwise, broadcast,
  concatenate, dynamic-slice, get-tuple-element, reduce, reshape, pad, parameter, slice, tuple; not
  even a constant) and that both compute something (a branch made of parameters, tuples and
  get-tuple-elements around an array is faster to run than a select) becomes both branches inlined
  and a select per array (tuples element by element, tokens joined by after-all).
Branch computations left without callers are removed (as after XLA's DCE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.builder import Builder
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.opcodes import CHANNEL_OPCODES, ELEMENTWISE
from hlopt.hlo.shape import AnyShape
from hlopt.hlo.shape_inference import conditional_branches
from hlopt.passes.call_inliner import inline_call
from hlopt.passes.dce import SideEffects, remove_unreachable_computations
from hlopt.passes.framework.base import ModulePass, module_opcodes
from hlopt.passes.framework.match import scalar_constant_value
from hlopt.passes.framework.registry import register

__all__ = ["ConditionalSimplifier", "removable_branch"]

#: Opcodes XLA does not count as expensive in a branch (besides elementwise ones).
CHEAP_OPCODES = frozenset({"broadcast", "concatenate", "dynamic-slice", "get-tuple-element", "reduce", "reshape",
                           "pad", "parameter", "slice", "tuple"})
_CHANNEL_OPCODES = CHANNEL_OPCODES


def _calls_channel_instructions(inst: Instruction) -> bool:
    """Does any computation `inst` calls (transitively) hold a channel instruction? (Cloning such a
    branch would give two instructions one channel.)"""
    work = list(inst.called_computations)
    seen: set[Computation] = set()
    while work:
        comp = work.pop()
        if comp in seen:
            continue
        seen.add(comp)
        for i in comp.instructions:
            if i.opcode in _CHANNEL_OPCODES:
                return True
            work.extend(i.called_computations)
    return False


def _is_expensive(inst: Instruction) -> bool:
    return inst.opcode not in CHEAP_OPCODES and inst.opcode not in ELEMENTWISE


def _empty_with_array_root(comp: Computation) -> bool:
    """Only parameters, tuples and get-tuple-elements, and an array somewhere in the root."""
    only_plumbing = all(i.opcode in ("parameter", "tuple", "get-tuple-element") for i in comp.instructions)
    return only_plumbing and any(leaf.is_array for leaf in comp.root.shape.leaves())


def removable_branch(cond: Instruction) -> int | None:
    """The branch a conditional always takes (one branch, or a constant index), else None."""
    branches = conditional_branches(cond)
    if len(branches) == 1:
        return 0
    index = cond.operand(0)
    value = scalar_constant_value(index) if index.opcode == "constant" else None
    if value is None:
        return None
    if index.shape.dtype == "pred":
        return 0 if value else 1
    value = int(value)
    return value if 0 <= value < len(branches) else len(branches) - 1


def _pred_choice(cond: Instruction) -> tuple[Instruction, int, int] | None:
    """(p, branch when p, branch when not p) of a two-branch conditional indexed by a pred p, or by
    convert(p) to an integer (jax's `lax.cond` lowers so: index 1 when p); None otherwise."""
    if len(conditional_branches(cond)) != 2:
        return None
    index = cond.operand(0)
    if index.shape.dtype == "pred":
        return index, 0, 1
    source = index.operand(0) if index.opcode == "convert" else None
    if source is not None and not source.shape.is_tuple and source.shape.dtype == "pred":
        return source, 1, 0
    return None


def _call(cond: Instruction, branch: int) -> Instruction:
    """A call of one branch with its operand, placed before the conditional."""
    comp: Computation = conditional_branches(cond)[branch]
    call = Builder(cond.parent, before=cond).op("call", cond.operand(1 + branch), shape=cond.shape, to_apply=comp)
    if cond.metadata is not None:
        call.metadata = cond.metadata.copy()
    return call


def _select(b: Builder, pred: Instruction, t: Instruction, f: Instruction, shape: AnyShape) -> Instruction:
    """select(pred, t, f) over every array of `shape` (tokens joined by after-all)."""
    if shape.is_tuple:
        elements = []
        for i, element in enumerate(shape.elements):
            ti = b.op("get-tuple-element", t, shape=element, index=i)
            fi = b.op("get-tuple-element", f, shape=element, index=i)
            elements.append(_select(b, pred, ti, fi, element))
        return b.op("tuple", *elements, shape=shape)
    if not shape.is_array:
        return b.op("after-all", t, f, shape=shape)
    mask = pred if shape.rank == 0 else b.op("broadcast", pred, shape=shape.with_dtype("pred"), dimensions=())
    return b.op("select", mask, t, f, shape=shape)


@register
@dataclass(frozen=True)
class ConditionalSimplifier(ModulePass):
    """Remove conditionals with a known branch or cheap branches (see the module docstring)."""

    name: ClassVar[str] = "conditional-simplifier"

    def candidates(self, module: Module) -> list[Instruction]:
        """The conditionals XLA would try, in post order per computation."""
        if "conditional" not in module_opcodes(module):
            return []
        return [i for comp in list(module.computations) for i in comp.post_order()
                if i.opcode == "conditional" and "sharding" not in i.attrs and not _calls_channel_instructions(i)]

    def try_remove(self, cond: Instruction, effects: SideEffects) -> bool:
        """Replace one conditional by its branch or by a select of both; True if it did."""
        if cond.control_predecessors or cond.control_successors or effects(cond):
            return False
        comp = cond.parent
        branch = removable_branch(cond)
        if branch is not None:
            call = _call(cond, branch)
            comp.replace_instruction(cond, call)
            inline_call(call, effects)
            return True
        branches = conditional_branches(cond)
        choice = _pred_choice(cond)
        if choice is None:
            return False
        if any(_is_expensive(i) for b in branches for i in b.instructions):
            return False
        if any(_empty_with_array_root(b) for b in branches):
            return False  # an empty branch runs faster than a select
        pred, taken, other = choice
        on_true, on_false = _call(cond, taken), _call(cond, other)
        select = _select(Builder(comp, before=cond), pred, on_true, on_false, cond.shape)
        comp.replace_instruction(cond, select)
        inline_call(on_false, effects)
        inline_call(on_true, effects)
        return True

    def run(self, module: Module) -> bool:
        effects = SideEffects(module)
        changed = False
        for cond in self.candidates(module):
            if cond.parent is not None:
                changed |= self.try_remove(cond, effects)
        if changed:
            remove_unreachable_computations(module)  # branches left without callers (XLA's DCE after it)
        return changed
