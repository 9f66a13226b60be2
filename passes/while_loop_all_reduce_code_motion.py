"""while-loop-all-reduce-code-motion: move accumulated all-reduces out of while loops.

XLA's WhileLoopAllReduceCodeMotion, accumulation form. In a loop body

    %g   = f32[N] ...                                   (per-iteration, per-device value)
    %ar  = f32[N] all-reduce(%g), to_apply=%sum
    %acc = f32[N] get-tuple-element(%param), index=k
    %new = f32[N] add(%ar, %acc)
    ROOT %r = tuple(..., %new, ...)                     (slot k)

a SUM all-reduce is linear, so the loop may accumulate the unreduced values and all-reduce once:

    body:   %new = f32[N] add(%g, %acc)
    init:   slot k starts at zeros
    after:  %sum = all-reduce(gte(%while, k)); %out = add(<old init of slot k>, %sum)

N all-reduces become one. Converts, bitcasts, reshapes, transposes, slices and broadcasts may stand between
the all-reduce and the add (a SUM all-reduce commutes with them); the moved all-reduce runs on the
accumulator, in its own type when a convert intervened (convert -> all-reduce -> convert). Refused, as in XLA: non-SUM
reductions, constrain_layout, all-reduces with other users, accumulators read by anything else
(including the loop condition) or accumulated twice, tuple-shaped all-reduces. Options as XLA's:
`enable_reduce_scatter` (reduce-scatter accumulation; not implemented here: the option is accepted and
such loops are left unchanged) and `run_setup_passes` (likewise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hlo.builder import Builder
from hlo.ir import Computation, Instruction, Module
from hlo.literal import Literal
from hlo.shape import Shape, TupleShape, default_layout
from passes.base import ModulePass
from passes.registry import register

__all__ = ["WhileLoopAllReduceCodeMotion", "Accumulation", "find_accumulations"]

#: Ops between the all-reduce and the add that commute with a SUM all-reduce (it is linear and acts
#: element by element across devices), so the all-reduce may run on the accumulator instead.
_FORWARDING = frozenset({"convert", "bitcast", "reshape", "transpose", "slice", "broadcast", "copy"})


@dataclass
class Accumulation:
    """One movable all-reduce: its chain to the accumulating add, and the loop-carried slot."""

    all_reduce: Instruction
    converts: list[Instruction]  # between the all-reduce and the add, in order
    add: Instruction
    slot: int


def _is_sum(comp: Computation) -> bool:
    root = comp.root
    params = comp.parameters
    return (root is not None and root.opcode == "add" and len(params) == 2
            and set(root.operands) == set(params))


def _single_user(inst: Instruction) -> Instruction | None:
    users = inst.users
    return users[0] if len(users) == 1 and inst.user_count == 1 and not inst.control_successors else None


def _slot_reader(param: Instruction, acc: Instruction) -> int | None:
    if acc.opcode == "get-tuple-element" and acc.operand(0) is param:
        return acc.attrs["index"]
    return None


def find_accumulations(body: Computation, cond: Computation) -> list[Accumulation]:
    """The all-reduces of `body` that can move out of the loop."""
    if len(body.parameters) != 1 or body.root is None or body.root.opcode != "tuple":
        return []
    param = body.parameters[0]
    cond_slots = _slots_read(cond)
    root = body.root
    found: list[Accumulation] = []
    used_slots: set[int] = set()
    pinned: set[Instruction] = set()  # scalar all-reduces used as scaling factors stay in the body
    for ar in body.instructions:
        if ar.opcode != "all-reduce" or ar.shape.is_tuple or ar.operand_count != 1:
            continue
        if ar.get("constrain_layout") is True or not _is_sum(ar.attrs["to_apply"]):
            continue
        chain: list[Instruction] = []
        x = ar
        user = _single_user(x)
        while user is not None and (user.opcode in _FORWARDING or _scaling_factor(user, x, ar) is not None):
            if user.opcode == "multiply":
                pinned.add(_scaling_factor(user, x, ar))
            chain.append(user)
            x = user
            user = _single_user(x)
        if user is None or user.opcode != "add":
            continue
        other = user.operand(1) if user.operand(0) is x else user.operand(0)
        slot = _slot_reader(param, other)
        if slot is None or slot in used_slots or slot in cond_slots:
            continue
        if other.user_count != 1 or _single_user(user) is not root:
            continue
        if [i for i, op in enumerate(root.operands) if op is user] != [slot]:
            continue
        if _gte_count(param, slot) != 1:
            continue
        used_slots.add(slot)
        found.append(Accumulation(ar, chain, user, slot))
    return [a for a in found if a.all_reduce not in pinned]


def _scaling_factor(mul: Instruction, x: Instruction, ar: Instruction) -> Instruction | None:
    """For multiply(x, broadcast(convert(scalar all-reduce))) with the same replica groups as `ar`: that
    scalar all-reduce (its value is the same on every device of the group, so the sum commutes with it)."""
    if mul.opcode != "multiply" or mul.operand_count != 2:
        return None
    other = mul.operand(1) if mul.operand(0) is x else mul.operand(0)
    while other.opcode in ("broadcast", "convert", "reshape", "bitcast") and other.operand_count == 1:
        other = other.operand(0)
    if other.opcode != "all-reduce" or other.shape.is_tuple or other.shape.rank != 0:
        return None
    same_groups = str(other.get("replica_groups")) == str(ar.get("replica_groups")) and \
        other.get("use_global_device_ids") == ar.get("use_global_device_ids")
    return other if same_groups and _is_sum(other.attrs["to_apply"]) else None


def _gte_count(param: Instruction, slot: int) -> int:
    return sum(1 for u in param.users if u.opcode == "get-tuple-element" and u.attrs["index"] == slot)


def _slots_read(cond: Computation) -> set[int]:
    if len(cond.parameters) != 1:
        return set()
    p = cond.parameters[0]
    slots = set()
    for u in p.users:
        if u.opcode != "get-tuple-element":
            return set(range(len(p.shape.elements)))  # the whole tuple is read
        slots.add(u.attrs["index"])
    return slots


def _zeros(b: Builder, shape: Shape) -> Instruction:
    zero = b.op("constant", shape=Shape(shape.dtype, ()), literal=Literal.from_numpy(np.zeros(()), Shape(shape.dtype, ())))
    return b.op("broadcast", zero, shape=shape.with_layout(shape.layout or default_layout(shape.rank)), dimensions=())


def _next_channel_id(module: Module) -> int:
    ids = [i.get("channel_id") for i in module.instructions() if isinstance(i.get("channel_id"), int)]
    return max(ids, default=0) + 1


def _hoist(module: Module, loop: Instruction, accs: list[Accumulation]) -> None:
    comp = loop.parent
    body: Computation = loop.attrs["body"]
    init = loop.operand(0)
    b = Builder(comp, before=loop)
    # 1. The loop starts the moved slots at zero; the old init values are added back after the loop.
    old_values: dict[int, Instruction] = {}
    elements = []
    for i, shape in enumerate(init.shape.elements):
        gte = init.operand(i) if init.opcode == "tuple" else b.get_tuple_element(init, i)
        if any(a.slot == i for a in accs):
            old_values[i] = gte
            elements.append(_zeros(b, shape))
        else:
            elements.append(gte)
    loop.replace_operands([b.tuple(*elements)])
    # 2. In the body, accumulate the unreduced value.
    for acc in accs:
        ar = acc.all_reduce
        ar.replace_all_uses_with(ar.operand(0))
    # 3. After the loop: all-reduce the accumulated slot (in the all-reduce's own type), add the old value.
    users = [u for u in loop.users]
    after = Builder(comp, after=loop)
    outs = []
    results: dict[int, Instruction] = {}
    for acc in sorted(accs, key=lambda a: a.slot):
        ar = acc.all_reduce
        x = after.get_tuple_element(loop, acc.slot)
        acc_dtype = x.shape.dtype
        if acc_dtype != ar.shape.dtype:  # all-reduce in its own type, as XLA: convert -> all-reduce -> convert
            x = after.convert(x, ar.shape.dtype)
        attrs = {k: v for k, v in ar.attrs.items()}
        if not isinstance(attrs.get("channel_id"), int):
            attrs["channel_id"] = _next_channel_id(module)
        moved = after.op("all-reduce", x, shape=x.shape, **attrs)
        if moved.shape.dtype != acc_dtype:
            moved = after.convert(moved, acc_dtype)
        results[acc.slot] = after.add(old_values[acc.slot], moved)
    for i in range(len(loop.shape.elements)):
        outs.append(results[i] if i in results else after.get_tuple_element(loop, i))
    new_tuple = after.tuple(*outs)
    for u in users:
        u.replace_use_of(loop, new_tuple)
    if comp.root is loop:
        comp.root = new_tuple
    for acc in accs:
        if acc.all_reduce.parent is body and not acc.all_reduce.user_count:
            body.remove(acc.all_reduce)


def _shared_body(module: Module, body: Computation) -> bool:
    return sum(1 for i in module.instructions() if i.opcode == "while" and i.get("body") is body) > 1


@register
@dataclass(frozen=True)
class WhileLoopAllReduceCodeMotion(ModulePass):
    """Move SUM all-reduces whose results are only accumulated across iterations out of while loops."""

    name: ClassVar[str] = "while-loop-all-reduce-code-motion"
    enable_reduce_scatter: bool = False
    run_setup_passes: bool = False

    def run(self, module: Module) -> bool:
        changed = False
        for comp in module.computations_post_order():
            for loop in [i for i in comp.instructions if i.opcode == "while"]:
                body, cond = loop.attrs["body"], loop.attrs["condition"]
                if not isinstance(loop.shape, TupleShape) or _shared_body(module, body):
                    continue
                accs = find_accumulations(body, cond)
                if accs:
                    _hoist(module, loop, accs)
                    changed = True
        return changed
