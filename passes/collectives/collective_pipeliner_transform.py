"""The loop rewrites of collective-pipeliner (XLA's TransformLoopForward / TransformLoopBackward /
TransformLoopForwardSink): peeling, the new loop state, the new body and condition, the epilogue.

The matching (which collectives move) is in `passes/collectives/collective_pipeliner.py`; this module only rewrites.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np
from hlopt.hlo.builder import Builder
from hlopt.hlo.clone import clone_computation
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.literal import Literal
from hlopt.hlo.opcodes import COLLECTIVES
from hlopt.hlo.shape import Shape, TupleShape

if TYPE_CHECKING:
    from hlopt.passes.collectives.collective_pipeliner import BackwardMove, ForwardMove, LoopInfo, SinkMove

__all__ = ["ChannelIds", "SchedulingGroups", "scheduling_annotation", "pipeline_forward", "pipeline_backward", "sink_forward", "send_recv_validation",
           "update_send_recv_validation"]

#: XLA's kSendRecvValidationAttr: for each source-target pair of a collective-permute in a loop, the
#: iterations {first,last} in which that pair really transfers ({1,0}: none)
SEND_RECV_VALIDATION = "_xla_send_recv_validation"

_CHANNEL_OPS = COLLECTIVES


class ChannelIds:
    """Fresh channel ids for copies of collectives (XLA's UpdateInstructionChannelId: every copy gets the
    next unused id; send/recv keep theirs)."""

    def __init__(self, module: Module):
        ids = [i.attrs.get("channel_id") for i in module.instructions()]
        self._next = max([i for i in ids if isinstance(i, int) and not isinstance(i, bool)], default=0) + 1

    def renumber(self, inst: Instruction) -> None:
        """Give a (not yet inserted) copy of a collective the next unused channel id, if it has one."""
        if inst.opcode in _CHANNEL_OPS and isinstance(inst.attrs.get("channel_id"), int):
            inst.attrs["channel_id"] = self._next
            self._next += 1


class Cloner:
    """Copies instructions into one computation: fresh names, fresh channel ids, and (for copies outside
    the loop) private copies of the computations that while/conditional/call/fusion instructions call."""

    def __init__(self, module: Module, target: Computation, channels: ChannelIds,
                 before: Instruction | None = None, deep: bool = True):
        self.module = module
        self.target = target
        self.channels = channels
        self.before = before
        self.deep = deep
        #: every instruction this cloner inserted, in order
        self.created: list[Instruction] = []

    def add(self, inst: Instruction) -> Instruction:
        """Insert a new instruction (before the anchor, else at the end)."""
        if not inst.name:
            inst.name = self.module.unique_name(inst.opcode)
        self.created.append(inst)
        return self.target.add(inst, before=self.before)

    def copy(self, inst: Instruction, operands: Iterable[Instruction], renumber: bool = True,
             shape: Shape | TupleShape | None = None) -> Instruction:
        """A copy of body instruction `inst` on `operands` (with another result shape if given)."""
        new = inst.clone(name=self.module.unique_name(inst.name), operands=list(operands))
        if shape is not None:
            new.shape = shape
        if renumber:
            self.channels.renumber(new)
        if self.deep:
            for comp in new.called_computations:
                if comp is not new.attrs.get("to_apply"):
                    new.replace_called_computation(comp, clone_computation(self.module, comp, deep=True))
        return self.add(new)

    def op(self, opcode: str, shape: Shape | TupleShape, operands: Iterable[Instruction], **attrs: object) -> Instruction:
        """A new instruction."""
        return self.add(Instruction(opcode, shape, list(operands), **attrs))

    def constant(self, value: int, dtype: str) -> Instruction:
        """A scalar integer constant."""
        shape = Shape(dtype, ())
        return self.op("constant", shape, (), literal=Literal.from_numpy(_np_scalar(value, dtype), shape))

    def gte(self, x: Instruction, index: int) -> Instruction:
        """get-tuple-element(x), index."""
        return self.op("get-tuple-element", x.shape.elements[index], (x,), index=index)

    def tuple(self, elements: list[Instruction]) -> Instruction:
        """tuple(elements)."""
        return self.op("tuple", TupleShape(tuple(e.shape for e in elements)), elements)


def _np_scalar(value: int, dtype: str) -> np.ndarray:
    from hlopt.hlo.shape import DTYPES

    return np.asarray(value, dtype=DTYPES[dtype].numpy)


def _with_parameter_shape(module: Module, comp: Computation, shape: TupleShape) -> Computation:
    """A copy of a one-parameter computation (a loop condition) whose parameter has tuple shape `shape`."""
    copy = Computation(module.unique_name(comp.name))
    copy.execution_thread = comp.execution_thread
    mapping: dict[Instruction, Instruction] = {}
    for inst in comp.post_order():
        if inst.opcode == "parameter":
            new = Instruction("parameter", shape, name=module.unique_name(inst.name), parameter_number=0)
        else:
            new = inst.clone(name=module.unique_name(inst.name), operands=[mapping[o] for o in inst.operands])
        mapping[inst] = copy.add(new)
    copy.set_root(mapping[comp.root])
    module.add_computation(copy, before=comp)
    return copy


def _empty_body(module: Module, body: Computation, param: Instruction, state: TupleShape,
                channels: ChannelIds) -> tuple[Computation, Cloner, Instruction]:
    """A new loop body beside `body` holding only a parameter like `param` (body's) of shape `state`:
    (the body, a Cloner into it, the new parameter)."""
    new_body = Computation(module.unique_name(body.name))
    module.add_computation(new_body, before=body)
    inner = Cloner(module, new_body, channels, deep=False)
    return new_body, inner, inner.op("parameter", state, (), name=module.unique_name(param.name),
                                     parameter_number=0)


def _init_elements(cl: Cloner, loop: Instruction) -> list[Instruction]:
    init = loop.operand(0)
    if init.opcode == "tuple":
        return list(init.operands)
    return [cl.gte(init, i) for i in range(len(init.shape.elements))]


def _replace_loop(old: Instruction, results: list[Instruction]) -> None:
    """Every get-tuple-element of the old loop reads `results[index]`; then the old loop goes."""
    comp = old.parent
    for user in list(old.users):
        value = results[user.attrs["index"]]
        user.replace_all_uses_with(value)
        if comp.root is user:
            comp.set_root(value)
        comp.remove(user)
    if comp.root is old:
        cl_tuple = Instruction("tuple", TupleShape(tuple(r.shape for r in results)), results,
                               name=comp.module.unique_name("tuple") if comp.module else "tuple")
        comp.add(cl_tuple, after=old)
        comp.set_root(cl_tuple)
    comp.remove_with_unused_operands(old)


def _new_loop(cl: Cloner, info: LoopInfo, body: Computation, cond: Computation, init: Instruction) -> Instruction:
    """The pipelined loop: one iteration less than the old one, annotated with its trip count as XLA's
    WhileLoopTripCountAnnotator would (`known_trip_count`), so that cost models count its body right."""
    attrs = {k: v for k, v in info.loop.attrs.items() if k not in ("body", "condition", "backend_config")}
    loop = cl.op("while", init.shape, (init,), condition=cond, body=body, **attrs)
    config = dict(info.loop.backend_config_dict())
    config["known_trip_count"] = {"n": str(info.range.trip_count - 1)}
    loop.set_backend_config_json(config)
    return loop


def _remove_dead(comp: Computation, candidates: Iterable[Instruction]) -> None:
    """Remove the candidates left without users, and operands that become dead, never a parameter (XLA's
    RemoveInstructionAndUnusedOperands)."""
    for inst in list(candidates):
        if (inst.parent is comp and not inst.user_count and inst is not comp.root and not inst.has_side_effect
                and not inst.has_control_dependencies and inst.opcode != "parameter"):
            comp.remove_with_unused_operands(inst)


def _finish(module: Module, info: LoopInfo) -> None:
    """Drop the old body and condition (the new loop has its own copies)."""
    for comp in (info.body, info.loop.attrs["condition"]):
        if comp.module is module and not module.callers(comp):
            module.remove_computation(comp)


# --------------------------------------------------------------------------- send/recv validation
def send_recv_validation(inst: Instruction) -> list[tuple[int, int]] | None:
    """The {first,last} iteration pairs of a collective-permute's `_xla_send_recv_validation` attribute
    (`"{{0,6},{1,7}}"`); None without one. Raises ValueError when the attribute is not such a list."""
    text = inst.frontend_attributes.get(SEND_RECV_VALIDATION)
    if inst.opcode != "collective-permute" or text is None:
        return None
    body = str(text).replace(" ", "")
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"%{inst.name}: {SEND_RECV_VALIDATION}={text!r} is not a list of {{a,b}} pairs")
    pairs = []
    for item in filter(None, body[1:-1].replace("},{", "}|{").split("|")):
        parts = item.strip("{}").split(",")
        if len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts):
            raise ValueError(f"%{inst.name}: {SEND_RECV_VALIDATION}={text!r} is not a list of {{a,b}} pairs")
        pairs.append((int(parts[0]), int(parts[1])))
    return pairs


def update_send_recv_validation(inst: Instruction, forward: bool, peeled: bool, trip_count: int) -> None:
    """Rewrite the send/recv validation of a copy of a loop's collective-permute, as XLA's
    UpdateSendRecvValidation: forward, the copy peeled before the loop runs the pairs valid in iteration
    0 ({0,0}, else {1,0}) and the loop's copy sees every iteration one earlier ({max(0,a-1),max(0,b-1)});
    backward, the copy peeled after the loop runs the pairs valid in the last iteration N-1 and the loop's
    copy stops before it ({a,min(N-2,b)})."""
    pairs = send_recv_validation(inst)
    if pairs is None:
        return
    last = trip_count - 1
    if forward and peeled:
        new = [(0, 0) if a <= 0 <= b else (1, 0) for a, b in pairs]
    elif forward:
        new = [(max(0, a - 1), max(0, b - 1)) for a, b in pairs]
    elif peeled:
        new = [(0, 0) if a <= last <= b else (1, 0) for a, b in pairs]
    else:
        new = [(a, min(last - 1, b)) for a, b in pairs]
    attrs = dict(inst.frontend_attributes)
    attrs[SEND_RECV_VALIDATION] = "{" + ",".join(f"{{{a},{b}}}" for a, b in new) + "}"
    inst.attrs["frontend_attributes"] = attrs


def _update_validations(cloners: Iterable[Cloner], forward: bool, peeled: bool, trip_count: int) -> None:
    for cl in cloners:
        for inst in cl.created:
            update_send_recv_validation(inst, forward, peeled, trip_count)


# --------------------------------------------------------------------------- scheduling annotations
#: XLA's scheduling annotation: `_scheduling_group_id="G"` or `"G:I"` (I: the iteration it belongs to)
SCHEDULING_GROUP = "_scheduling_group_id"


def scheduling_annotation(inst: Instruction) -> tuple[int, int | None] | None:
    """(group id, iteration id or None) of an instruction's scheduling annotation; None without one (or one
    that is not `G` / `G:I`)."""
    text = inst.frontend_attributes.get(SCHEDULING_GROUP)
    if text is None:
        return None
    parts = str(text).split(":")
    try:
        return int(parts[0]), (int(parts[1]) if len(parts) > 1 else None)
    except ValueError:
        return None


class SchedulingGroups:
    """New scheduling group ids for peeled copies, as XLA's UpdateInstructionSchedulingAnnotation: each old
    group gets the next unused id (one new id per old group, for one peeled copy), a copy of an annotation
    with an iteration id loses it."""

    def __init__(self, module: Module):
        ids = [a[0] for a in (scheduling_annotation(i) for i in module.instructions()) if a is not None]
        self._next = max(ids, default=0) + 1
        self._map: dict[int, int] = {}

    def renumber(self, created: Iterable[Instruction]) -> None:
        """Give the copies new group ids (an annotation with an iteration id is removed)."""
        for inst in created:
            annotation = scheduling_annotation(inst)
            if annotation is None:
                continue
            if annotation[1] is not None:
                _drop_annotation(inst)
                continue
            if annotation[0] not in self._map:
                self._map[annotation[0]] = self._next
                self._next += 1
            attrs = dict(inst.frontend_attributes)
            attrs[SCHEDULING_GROUP] = str(self._map[annotation[0]])
            inst.attrs["frontend_attributes"] = attrs

    @staticmethod
    def clear(created: Iterable[Instruction]) -> None:
        """Remove the copies' scheduling annotations."""
        for inst in created:
            if SCHEDULING_GROUP in inst.frontend_attributes:
                _drop_annotation(inst)


def _drop_annotation(inst: Instruction) -> None:
    attrs = {k: v for k, v in inst.frontend_attributes.items() if k != SCHEDULING_GROUP}
    inst.attrs["frontend_attributes"] = attrs


# --------------------------------------------------------------------------- forward
def pipeline_forward(module: Module, info: LoopInfo, moves: list[ForwardMove], channels: ChannelIds,
                     marker: int | None = None) -> Instruction:
    """Peel iteration 0 without the moved collectives; each iteration then finishes the previous
    iteration's collectives and stores where the store was; the last ones run after the loop. Returns the
    new loop. With `marker`, the finished collectives (in and after the loop) and the carried store indices
    (in the loop) pass through InsertedByPreviousStep markers of that level.

    A move with `reuse` (XLA's reuse_pipelined_op_buffer: the stored value has the collective operand's
    shape) stores the unreduced value in the buffer itself and reads it back a iteration later, instead of
    carrying it in the loop state."""
    loop, body, param = info.loop, info.body, info.param
    parent = loop.parent
    old_count = len(loop.shape.elements)
    skipped = {i for m in moves for i in (m.collective, *m.formatting, *(() if m.reuse else (m.dus,)))}
    stores = {m.dus: m for m in moves}
    # with `reuse`, the stored value stands for the collective's operand until the store is finished
    passthrough = {m.dus.operand(1): m.collective.operand(0) for m in moves if m.reuse}
    slots: dict[Instruction, int] = {}
    for m in moves:
        values = (m.dus.operand(2 + m.sliced_dim), *(() if m.reuse else (m.collective.operand(0),)), *m.dependencies)
        for x in values:
            if not _from_constants(x):  # copied where the store is finished, not carried
                slots.setdefault(x, old_count + len(slots))
    carried = list(slots)
    state = TupleShape((*loop.shape.elements, *(x.shape for x in carried)))

    # iteration 0, before the loop, without the moved collectives (and their stores, unless reused)
    pre = Cloner(module, parent, channels, before=loop)
    init = _init_elements(pre, loop)
    peeled: dict[Instruction, Instruction] = {g: init[g.attrs["index"]] for g in param.users}
    for inst in body.post_order():
        if inst is param or inst is body.root or inst in peeled:
            continue
        if inst in passthrough:
            peeled[inst] = peeled[passthrough[inst]]
        elif inst in skipped:
            if inst in stores:
                peeled[inst] = peeled[inst.operand(0)]  # the buffer passes through unchanged
        else:
            peeled[inst] = pre.copy(inst, [peeled[o] for o in inst.operands])
    init_values = [peeled[o] for o in body.root.operands]
    # the induction variable after the peeled iteration, as a constant (XLA analyses the new loop with this
    # known start), so that a later run (`level_to_operate_on`) finds the new loop's trip count
    iv_type = loop.shape.elements[info.iv_slot].dtype
    init_values[info.iv_slot] = pre.constant(info.range.start + info.range.step, iv_type)
    new_init = pre.tuple(init_values + [peeled[x] for x in carried])

    # the new body: the previous iteration's collectives and stores, then this iteration without them
    new_body, inner, new_param = _empty_body(module, body, param, state, channels)
    mapped: dict[Instruction, Instruction] = {param: new_param}
    for inst in body.post_order():
        if inst is param or inst is body.root:
            continue
        if inst in passthrough:
            mapped[inst] = mapped[passthrough[inst]]
        elif inst in stores and stores[inst].reuse:
            # finish the previous iteration's slot of the buffer, then store this iteration's unreduced value
            buffer = mapped[inst.operand(0)]
            done = _finish_store(inner, stores[inst], new_param, lambda x: mapped[x], slots, buffer, source=buffer,
                                 marker=marker, mark_index=True)
            mapped[inst] = inner.copy(inst, [done, *(mapped[o] for o in inst.operands[1:])], renumber=False)
        elif inst in stores and inst.users != (body.root,):
            # a store read by a later store (level above 0): the previous iteration's store takes its place
            mapped[inst] = _finish_store(inner, stores[inst], new_param, lambda x: mapped[x], slots,
                                         mapped[inst.operand(0)], marker=marker, mark_index=True)
        elif inst not in skipped:
            mapped[inst] = inner.copy(inst, [mapped[o] for o in inst.operands], renumber=False)
    for m in moves:  # the previous iteration's stores into the root's buffers, at the end of the body
        if m.dus not in mapped:
            mapped[m.dus] = _finish_store(inner, m, new_param, lambda x: mapped[x], slots, mapped[m.dus.operand(0)],
                                          marker=marker, mark_index=True)
    root_ops = [mapped[o] for o in body.root.operands] + [mapped[x] for x in carried]
    new_body.set_root(inner.tuple(root_ops))

    cond = _with_parameter_shape(module, loop.attrs["condition"], state)
    new_loop = _new_loop(pre, info, new_body, cond, new_init)

    # after the loop: the last iteration's collectives and stores
    post = Cloner(module, parent, channels, before=loop)
    results = [post.gte(new_loop, k) for k in range(old_count)]
    for m in moves:
        buffer = post.gte(new_loop, m.slot)
        results[m.slot] = _finish_store(post, m, new_loop, _constant_in(post), slots, buffer,
                                        source=buffer if m.reuse else None, marker=marker)
    _update_validations([pre], forward=True, peeled=True, trip_count=info.range.trip_count)
    _update_validations([inner, post], forward=True, peeled=False, trip_count=info.range.trip_count)
    groups = SchedulingGroups(module)
    groups.renumber(pre.created)  # the peeled iteration: new groups
    groups.clear(post.created)  # the last iteration's collectives and stores: no group
    _replace_loop(loop, results)
    _remove_dead(parent, [*peeled.values(), *results])
    _remove_dead(new_body, list(new_body.instructions))
    _finish(module, info)
    return new_loop


def _from_constants(x: Instruction) -> bool:
    """Whether `x` is computed from constants alone (a constant, a broadcast of one, an iota, ...): the same
    value in every iteration, copied where it is needed instead of carried in the loop state."""
    if x.opcode == "parameter" or x.has_side_effect or x.called_computations or x.shape.is_tuple:
        return False
    return x.opcode in ("constant", "iota") or (x.operand_count > 0 and all(_from_constants(o) for o in x.operands))


def _constant_in(cl: Cloner) -> Callable[[Instruction], Instruction]:
    """Index operands of a store, outside the loop: the constants, copied."""
    cache: dict[Instruction, Instruction] = {}

    def get(x: Instruction) -> Instruction:
        if x not in cache:
            cache[x] = cl.copy(x, [])
        return cache[x]

    return get


def _finish_store(cl: Cloner, m: ForwardMove, state: Instruction, mapped: Callable[[Instruction], Instruction],
                  slots: dict[Instruction, int], buffer: Instruction, source: Instruction | None = None,
                  marker: int | None = None, mark_index: bool = False) -> Instruction:
    """The collective, its formatting and its store into `buffer`, on the values carried in `state` (the loop
    parameter or the loop's result): returns the updated buffer. With `source` (a reused buffer), the
    collective's operand is read back from `source` at the stored slice instead of from the state. With
    `marker` (a run that is not the last), the collective's copy, and with `mark_index` the store index, pass
    through an InsertedByPreviousStep marker of that level (XLA's insert_non_alias_custom_call)."""
    local: dict[Instruction, Instruction] = {}

    def value(x: Instruction) -> Instruction:
        if x not in local:
            if x in slots:
                local[x] = cl.gte(state, slots[x])
            else:  # computed from constants alone: copied here
                local[x] = cl.copy(x, [value(o) for o in x.operands])
        return local[x]

    indices = []
    for d, idx in enumerate(m.dus.operands[2:]):
        if d != m.sliced_dim:
            indices.append(mapped(idx))
        elif marker is not None and mark_index:
            indices.append(_marker(cl, value(idx), marker))
        else:
            indices.append(value(idx))
    operand = m.collective.operand(0)
    if source is None:
        stored = value(operand)
    else:
        stored = cl.op("dynamic-slice", operand.shape, (source, *indices), dynamic_slice_sizes=tuple(operand.shape.dims))
    local[m.collective] = cl.copy(m.collective, [stored])
    if marker is not None:
        local[m.collective] = _marker(cl, local[m.collective], marker)
    for op in m.formatting:
        local[op] = cl.copy(op, [value(o) if o not in local else local[o] for o in op.operands])
    update = local[m.dus.operand(1)]  # the stored value (with `pipeline_use_tree`, not always the last op)
    return cl.copy(m.dus, [buffer, update, *indices])


def _marker(cl: Cloner, x: Instruction, level: int) -> Instruction:
    """`custom-call(x, s64[] constant(level)), custom_call_target="InsertedByPreviousStep"` (XLA's marker of
    what a run that is not the last one moved)."""
    from hlopt.passes.collectives.collective_pipeliner import INSERTED_BY_PREVIOUS_STEP

    shape = Shape("s64", ())
    level_constant = cl.op("constant", shape, (), literal=Literal.from_numpy(_np_scalar(level, "s64"), shape))
    return cl.op("custom-call", x.shape, (x, level_constant), custom_call_target=INSERTED_BY_PREVIOUS_STEP)


# --------------------------------------------------------------------------- backward
def pipeline_backward(module: Module, info: LoopInfo, moves: list[BackwardMove], channels: ChannelIds) -> Instruction:
    """Compute each moved collective one iteration early: the first before the loop, the next one in each
    iteration; the loop runs one iteration less and the last iteration follows it. Returns the new loop."""
    loop, body, param = info.loop, info.body, info.param
    parent = loop.parent
    rng = info.range
    old_count = len(loop.shape.elements)
    slot = {m.collective: old_count + n for n, m in enumerate(moves)}
    state = TupleShape((*loop.shape.elements, *(m.collective.shape for m in moves)))
    iv_type = loop.shape.elements[info.iv_slot].dtype

    # the first iteration's collectives, before the loop
    pre = Cloner(module, parent, channels, before=loop)
    init = _init_elements(pre, loop)
    first = [_chain_copy(pre, m, param, lambda k: init[k]) for m in moves]
    new_init = pre.tuple([*init, *first])

    # the new body: this iteration reads its collectives from the state and computes the next ones
    new_body, inner, new_param = _empty_body(module, body, param, state, channels)
    mapped = _copy_body(inner, info, moves, new_param, lambda m: inner.gte(new_param, slot[m.collective]))
    iv = mapped[next(g for g in param.users if g.attrs["index"] == info.iv_slot)] \
        if any(g.attrs["index"] == info.iv_slot for g in param.users) else inner.gte(new_param, info.iv_slot)
    step = inner.constant(rng.step, iv_type)
    next_iv = inner.op("add", iv.shape, (iv, step))

    def next_slot(k: int) -> Instruction:
        if k == info.iv_slot:
            return next_iv
        return inner.gte(new_param, k)

    following = [_chain_copy(inner, m, param, next_slot) for m in moves]
    new_body.set_root(inner.tuple([mapped[o] for o in body.root.operands] + following))

    cond = _bounded_condition(module, loop.attrs["condition"], state, info, iv_type)
    new_loop = _new_loop(pre, info, new_body, cond, new_init)

    # the last iteration, after the loop
    post = Cloner(module, parent, channels, before=loop)
    last = _copy_body(post, info, moves, new_loop, lambda m: post.gte(new_loop, slot[m.collective]))
    results = [last[o] for o in body.root.operands]
    _update_validations([inner], forward=False, peeled=False, trip_count=rng.trip_count)
    _update_validations([post], forward=False, peeled=True, trip_count=rng.trip_count)
    groups = SchedulingGroups(module)
    groups.clear(pre.created)  # the first iteration's collectives, before the loop: no group
    groups.renumber(post.created)  # the peeled last iteration: new groups
    _replace_loop(loop, results)
    _remove_dead(parent, [*first, *(v for v in last.values() if v is not new_loop)])
    _remove_dead(new_body, list(new_body.instructions))
    if any(m.barriers for m in moves):
        parent.make_topological()  # the widened barriers were added after their users' copies
        new_body.make_topological()
    _finish(module, info)
    return new_loop


def _chain_copy(cl: Cloner, m: BackwardMove, param: Instruction,
                slot_value: Callable[[int], Instruction]) -> Instruction:
    """The collective and its operand chain with loop slot k read as `slot_value(k)`, barriers looked
    through."""
    local: dict[Instruction, Instruction] = {}
    through = dict(m.barriers)

    def value(x: Instruction) -> Instruction:
        while x in through:
            x = through[x]
        if x.opcode == "get-tuple-element" and x.operand(0) is param:
            return slot_value(x.attrs["index"])
        return local[x]

    for inst in m.chain:
        if inst.opcode == "get-tuple-element" and inst.operand(0) is param:
            continue
        local[inst] = cl.copy(inst, [value(o) for o in inst.operands])
    return cl.copy(m.collective, [value(m.collective.operand(0))])


def _copy_body(cl: Cloner, info: LoopInfo, moves: list[BackwardMove], state: Instruction,
               carried: Callable[[BackwardMove], Instruction]) -> dict[Instruction, Instruction]:
    """The body on `state` (the new loop parameter, or the new loop's result) with each moved collective
    replaced by `carried(move)`; where the collective's operand came through an optimization barrier, the
    carried value passes through a copy of that barrier too."""
    body, param = info.body, info.param
    by_collective = {m.collective: m for m in moves}
    mapped: dict[Instruction, Instruction] = {param: state}
    for inst in body.post_order():
        if inst is param or inst is body.root:
            continue
        if inst in by_collective:
            m = by_collective[inst]
            value = carried(m)
            if m.barriers:
                value = _through_barrier(cl, mapped, m.barriers[0][0], value)
            mapped[inst] = value
            continue
        mapped[inst] = cl.copy(inst, [mapped[o] for o in inst.operands], renumber=cl.deep)
    return mapped


def _through_barrier(cl: Cloner, mapped: dict[Instruction, Instruction], gte: Instruction,
                     value: Instruction) -> Instruction:
    """Thread `value` through (the copy of) the barrier `gte` reads: a new barrier over the old barrier's
    tuple plus `value` replaces the copy; returns the new barrier's element holding `value`."""
    barrier = mapped[gte.operand(0)]
    elements = barrier.operand(0)
    ops = list(elements.operands)
    widened = cl.tuple([*ops, value])
    new_barrier = cl.copy(barrier, [widened], renumber=False, shape=widened.shape)  # keeps its attributes
    barrier.replace_all_uses_with(new_barrier)
    mapped[gte.operand(0)] = new_barrier
    comp = barrier.parent
    if not barrier.user_count and barrier is not comp.root:
        comp.remove_dead(barrier)
    return cl.gte(new_barrier, len(ops))


def _bounded_condition(module: Module, cond: Computation, state: TupleShape, info: LoopInfo,
                       iv_type: str) -> Computation:
    """`i < start + (N-1) * step` (`>` for a negative step): the loop runs one iteration less."""
    new = Computation(module.unique_name(cond.name))
    module.add_computation(new, before=cond)
    b = Builder(new)
    p = b.parameter(0, state, name=module.unique_name(cond.parameter(0).name))
    i = b.get_tuple_element(p, info.iv_slot)
    rng = info.range
    bound = b.constant(rng.start + (rng.trip_count - 1) * rng.step, iv_type)
    direction = "LT" if rng.step > 0 else "GT"
    new.set_root(b.compare(i, bound, direction))
    return new


# --------------------------------------------------------------------------- forward-sink
def sink_forward(module: Module, info: LoopInfo, moves: list[SinkMove], channels: ChannelIds,
                 mark: bool = False) -> Instruction:
    """The loop stacks, one slice per iteration, each moved collective's operand and the loop-variant operands
    of its formatting ops (loop-invariant ones are carried once); after it, the collectives and the formatting
    run once on the stacks, each op with a stack dimension in front, and fill the stored buffers (XLA's
    TransformLoopForwardSink). Returns the new loop. SunkByPreviousStep markers of an earlier run are dropped
    from the body; with `mark` (a run that is not the last) the stacked collective operands pass through new
    ones."""
    from hlopt.passes.collectives.collective_pipeliner import SUNK_BY_PREVIOUS_STEP, is_marker

    loop, body, param = info.loop, info.body, info.param
    parent = loop.parent
    n = info.range.trip_count
    old_count = len(loop.shape.elements)
    # the new state: (group, body value, how) per extra slot
    extra: list[tuple[int, Instruction, str]] = []
    for k, g in enumerate(moves):
        extra += [(k, c.operand(0), "collective") for c in g.collectives]
        extra += [(k, x, how) for x, how in g.dependencies.items() if how != "constant"]
    extra = list(dict.fromkeys(extra))
    shapes = [x.shape if how == "invariant" else _stacked(x.shape, n) for _, x, how in extra]
    state = TupleShape((*loop.shape.elements, *shapes))
    skipped = {i for g in moves for i in (*g.collectives, *g.formatting, *(d for d, _ in g.stores))}
    filled = {slot for g in moves for _, slot in g.stores}

    pre = Cloner(module, parent, channels, before=loop)
    init = _init_elements(pre, loop)
    new_init = pre.tuple([*init, *(_zeros(pre, shape) for shape in shapes)])

    new_body, inner, new_param = _empty_body(module, body, param, state, channels)
    mapped: dict[Instruction, Instruction] = {param: new_param}
    for inst in body.post_order():
        if inst is param or inst is body.root or inst in skipped:
            continue
        if is_marker(inst, SUNK_BY_PREVIOUS_STEP):
            mapped[inst] = mapped[inst.operand(0)]
            continue
        mapped[inst] = inner.copy(inst, [mapped[o] for o in inst.operands], renumber=False)
    root_ops = [inner.gte(new_param, k) if k in filled else mapped[o] for k, o in enumerate(body.root.operands)]
    for n_extra, (k, x, how) in enumerate(extra):
        slot = old_count + n_extra
        if how == "invariant":
            root_ops.append(mapped[x])
            continue
        value = mapped[x]
        row = inner.op("reshape", Shape(value.shape.dtype, (1, *value.shape.dims)), (value,))
        if mark and how == "collective":
            row = inner.op("custom-call", row.shape, (row,), custom_call_target=SUNK_BY_PREVIOUS_STEP)
        index = mapped[moves[k].index]
        zero = inner.constant(0, index.shape.dtype)
        root_ops.append(inner.op("dynamic-update-slice", shapes[n_extra],
                                 (inner.gte(new_param, slot), row, index, *[zero] * value.shape.rank)))
    new_body.set_root(inner.tuple(root_ops))

    cond = _with_parameter_shape(module, loop.attrs["condition"], state)
    new_loop = _new_loop(pre, info, new_body, cond, new_init)
    new_loop.set_backend_config_json({**new_loop.backend_config_dict(), "known_trip_count": {"n": str(n)}})
    post = Cloner(module, parent, channels, before=loop)
    results = [post.gte(new_loop, k) for k in range(old_count)]
    for k, g in enumerate(moves):
        stacks = {x: post.gte(new_loop, old_count + e) for e, (kk, x, how) in enumerate(extra) if kk == k}
        full = _sunk_group(post, g, stacks, n)
        for dus, slot in g.stores:
            value = full[dus.operand(1)]
            results[slot] = post.op("reshape", Shape(value.shape.dtype, dus.shape.dims), (value,))
    _replace_loop(loop, results)
    _remove_dead(parent, results)
    _remove_dead(new_body, list(new_body.instructions))
    _finish(module, info)
    return new_loop


def _stacked(shape: Shape, n: int) -> Shape:
    return Shape(shape.dtype, (n, *shape.dims))


def _zeros(cl: Cloner, shape: Shape) -> Instruction:
    zero = cl.op("constant", Shape(shape.dtype, ()), (), literal=Literal.from_numpy(_np_scalar(0, shape.dtype),
                                                                                     Shape(shape.dtype, ())))
    return zero if not shape.dims else cl.op("broadcast", shape, (zero,), dimensions=())


def _sunk_group(cl: Cloner, g: SinkMove, stacks: dict[Instruction, Instruction], n: int) -> dict:
    """The group's collectives and formatting ops after the loop, each with the stack dimension in front:
    body instruction -> its stacked value."""
    from hlopt.passes.collectives.collective_pipeliner import (
        INSERTED_BY_PREVIOUS_STEP,
        SUNK_BY_PREVIOUS_STEP,
        is_marker,
    )

    full: dict[Instruction, Instruction] = {}
    plain: dict[Instruction, Instruction] = {}

    def plain_copy(x: Instruction) -> Instruction:  # a value computed from constants, at its own shape
        if x not in plain:
            plain[x] = cl.copy(x, [plain_copy(o) for o in x.operands])
        return plain[x]

    def stacked(x: Instruction) -> Instruction:
        if x in full:
            return full[x]
        if x in stacks and g.dependencies.get(x) != "invariant":
            return stacks[x]
        value = stacks[x] if x in stacks else plain_copy(x)  # loop-invariant: the same slice N times
        return cl.op("broadcast", _stacked(x.shape, n), (value,), dimensions=tuple(range(1, x.shape.rank + 1)))

    for c in g.collectives:
        full[c] = _with_stack(cl, c, [stacked(c.operand(0))], n)
    for op in g.formatting:
        if is_marker(op, SUNK_BY_PREVIOUS_STEP) or is_marker(op, INSERTED_BY_PREVIOUS_STEP):
            full[op] = stacked(op.operand(0))
            continue
        plain_ops = _plain_operand_numbers(op)
        operands = [plain_copy(o) if k in plain_ops else stacked(o) for k, o in enumerate(op.operands)]
        full[op] = _with_stack(cl, op, operands, n)
    return full


def _plain_operand_numbers(op: Instruction) -> tuple[int, ...]:
    from hlopt.passes.collectives.collective_pipeliner import plain_operands

    return plain_operands(op)


def _with_stack(cl: Cloner, op: Instruction, operands: list[Instruction], n: int) -> Instruction:
    """A copy of `op` on stacked `operands`, with the stack dimension in front of its result."""
    shape = _stacked(op.shape, n)
    code = op.opcode
    if code in ("reshape", "bitcast"):
        return cl.op("reshape", shape, operands[:1])
    if code == "transpose":
        return cl.op("transpose", shape, operands[:1], dimensions=(0, *(d + 1 for d in op.attrs["dimensions"])))
    if code == "broadcast":
        dims = (0, *(d + 1 for d in op.attrs.get("dimensions") or ()))
        return cl.op("broadcast", shape, operands[:1], dimensions=dims)
    if code == "slice":
        return cl.op("slice", shape, operands[:1], slice=((0, n, 1), *op.attrs["slice"]))
    if code == "dynamic-slice":
        zero = cl.constant(0, operands[1].shape.dtype)
        return cl.op("dynamic-slice", shape, (operands[0], zero, *operands[1:]),
                     dynamic_slice_sizes=(n, *op.attrs["dynamic_slice_sizes"]))
    if code == "pad":
        config = op.attrs["padding"]
        return cl.op("pad", shape, operands, padding=type(config)(((0, 0, 0), *config.dims)))
    new = cl.copy(op, operands, shape=shape)
    if code == "reduce":
        new.attrs["dimensions"] = tuple(d + 1 for d in op.attrs["dimensions"])
    elif code in ("all-gather", "reduce-scatter", "all-to-all") and op.attrs.get("dimensions") is not None:
        new.attrs["dimensions"] = tuple(d + 1 for d in op.attrs["dimensions"])
    return new


def from_constants(x: Instruction) -> bool:
    """Whether `x` is computed from constants alone (a constant, a broadcast of one, an iota, ...): the same
    value in every iteration, copied where it is needed instead of carried in the loop state."""
    return _from_constants(x)
