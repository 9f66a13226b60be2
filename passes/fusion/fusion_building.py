"""Building fusions the way XLA prints them: a fused computation is named `fused_computation[.N]`, its
parameters `param_<n>[.N]`, the fusion instruction `fusion[.N]`, with the kind XLA:GPU's emitter gives it.
Producer-consumer fusion, multi-output fusion (a tuple root), removing a fusion with its computation.
Every builder takes the pass's `FusionRun` (`run=`); without one it applies its edits before returning.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import Shape, TupleShape
from hlopt.passes.fusion.fusion_rules import fusion_kind, in_place_operand, is_multi_output, with_layouts
from hlopt.passes.fusion.fusion_run import FusionRun

__all__ = [
    "wrap_in_fusion", "fuse_into_new_fusion", "fuse_producer", "fuse_into_multi_output",
    "merge_into_multi_output", "fuse_user_as_output", "remove_fusion",
]

T = TypeVar("T")
_UNKNOWN: Any = object()  # a value not looked up yet


def _edits_applied(build: Callable[..., T]) -> Callable[..., T]:
    """A fusion builder called without `run` gets a run of its own, finished before it returns (the new
    fused computations are in the module at once)."""

    @functools.wraps(build)
    def wrapper(*args: Any, run: FusionRun | None = None, **kwargs: Any) -> T:
        if run is not None:
            return build(*args, run=run, **kwargs)
        return _in_own_run(build, *args, **kwargs)

    return wrapper


def _in_own_run(build: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`build(*args, run=..., **kwargs)` with a run of its own, finished before returning (`_edits_applied`'s
    wrapper, and the builders the fusion passes call most, which test `run` themselves)."""
    own = FusionRun(args[0].parent.module)
    out = build(*args, run=own, **kwargs)
    own.finish()
    return out


#: `_fresh_name(module, prefix)`: `module.unique_name(prefix)` (kept as the name fusion code calls)
_fresh_name: Callable[[Module, str], str] = Module.unique_name


def _new_fused_computation(module: Module, caller: Computation, run: FusionRun) -> Computation:
    comp = Computation(_fresh_name(module, "fused_computation"))
    run.params_first.add(comp)  # its `module` is set at `finish`: names are noted once, by unique_name
    run.new[comp] = caller
    return comp


def _drop_computation(module: Module, comp: Computation, run: FusionRun) -> None:
    if run.new.pop(comp, None) is None and comp.module is module:
        run.dead.add(comp)
    comp.module = None


def _new_parameter(fused: Computation, number: int, shape: Shape | TupleShape, module: Module) -> Instruction:
    p = _parameter(number, shape, module)
    fused.add(p, before=fused.first_non_parameter())
    return p


def _parameters_first(fused: Computation, run: FusionRun) -> None:
    """Put the parameters ahead of everything (XLA's own fused computations interleave them)."""
    if fused in run.params_first:
        return
    run.params_first.add(fused)
    x = fused.first_non_parameter()
    while x is not None and x.opcode != "parameter":
        x = x.next_instruction
    if x is not None:
        order = fused.instructions
        fused.instructions = [i for i in order if i.opcode == "parameter"] + \
            [i for i in order if i.opcode != "parameter"]


def _fused_clone(inst: Instruction, name: str, operands: Sequence[Instruction]) -> Instruction:
    """A clone of `inst` named `name` reading `operands`, its shape with layouts (as a fused computation's)."""
    clone = inst.clone(name=name, operands=operands)
    clone.shape = with_layouts(clone.shape)
    return clone


def _clone_into(fused: Computation, inst: Instruction, operands: Sequence[Instruction], module: Module,
                before: Instruction | None, keep_name: bool) -> Instruction:
    clone = _fused_clone(inst, inst.name if keep_name else _fresh_name(module, inst.name), operands)
    fused.add(clone, before=before)
    return clone


@_edits_applied
def wrap_in_fusion(inst: Instruction, *, run: FusionRun) -> Instruction:
    """Replace a lone instruction by a fusion of just that instruction (XLA's CreateFusion); returns it.
    `run`: the fusion pass's run (without one, the new computation is in the module on return)."""
    comp = inst.parent
    module = comp.module
    fused = _new_fused_computation(module, comp, run)
    params: dict[Instruction, Instruction] = {}
    for op in inst.operands:
        if op not in params:
            params[op] = _new_parameter(fused, len(params), op.shape, module)
    body = _fused_clone(inst, inst.name, [params[o] for o in inst.operands])
    fused.add(body)
    fused.set_root(body)
    fusion = Instruction("fusion", with_layouts(inst.shape), list(params), name=module.unique_name("fusion"),
                         kind=fusion_kind(fused), calls=fused)
    if inst.metadata is not None:
        fusion.metadata = inst.metadata.copy()
    comp.add(fusion, before=inst)
    inst.replace_all_uses_with(fusion)
    comp.remove(inst)
    return fusion


def fuse_into_new_fusion(producer: Instruction, consumer: Instruction, last_use: bool,
                         constants: bool = False, *, run: FusionRun | None = None, kind: str | None = None) -> Instruction:
    """Replace the lone `consumer` by a new fusion computing it with `producer` fused in (what
    `wrap_in_fusion` then `fuse_producer` do, without making and dropping the producer's parameter).
    `kind`: the fusion's kind where the caller knows it (`fusion_kind` of the same fused computation).
    `run`: the fusion pass's run (without one, the new computation is in the module on return)."""
    if run is None:
        return _in_own_run(fuse_into_new_fusion, producer, consumer, last_use, constants, kind=kind)
    comp = consumer.parent
    module = comp.module
    fused = _new_fused_computation(module, comp, run)
    fusion = Instruction("fusion", with_layouts(consumer.shape), (), name=_fresh_name(module, "fusion"),
                         kind="kLoop", calls=fused)
    fused.set_root(_inline_producer(fusion, producer, run, keep_name=last_use, constants=constants,
                                    consumer=consumer, module=module))
    fusion.attrs["kind"] = kind or fusion_kind(fused)
    if consumer.metadata is not None:
        fusion.metadata = consumer.metadata.copy()
    comp.replace_with_new(consumer, fusion)
    return fusion


def _is_small_constant(inst: Instruction) -> bool:
    """XLA's IsSmallConstant: an array constant of at most one element."""
    return inst.opcode == "constant" and not inst.shape.is_tuple and inst.shape.numel <= 1


def _feed_from_inside(fusion: Instruction, producer: Instruction, value: Instruction, run: FusionRun) -> None:
    """Every parameter of `fusion`'s computation that `producer` fed now reads `value` (the producer's copy
    inside), and the operand and its parameter are removed."""
    fused: Computation = fusion.attrs["calls"]
    ops = fusion.operands  # removing slot i leaves the slots before it as they are
    for i in range(len(ops) - 1, -1, -1):
        if ops[i] is producer:
            fused.remove_parameter(i, replacement=value)
            fusion.remove_operand(i)
            run.touched[fused] = None


def _inline_producer(fusion: Instruction, producer: Instruction, run: FusionRun, keep_name: bool,
                     constants: bool = False, consumer: Instruction | None = None,
                     module: Module | None = None) -> Instruction:
    """Clone `producer` (or merge its fused computation) into `fusion`; return the value it computes.
    New instructions go ahead of the fused computation's body, in order: the new parameters (one per operand
    not read yet), then the small constants cloned in and the producer's instructions. `consumer` (for a
    new, empty fusion): its other operands are bound to the first parameters, and a clone of it reading the
    producer's value comes last; then that clone is returned. `module`: the module (by default `fusion`'s)."""
    fused: Computation = fusion.attrs["calls"]
    if module is None:
        module = fusion.parent.module
    _parameters_first(fused, run)
    anchor = fused.first_non_parameter()
    ops = list(fusion.operands)  # the fusion's operands, with the new ones appended
    first_new = len(ops)
    new: list[Instruction] = []  # the new parameters
    body: list[Instruction] = []  # what goes after them
    if consumer is not None:
        for op in consumer.operands:
            if op is not producer and op not in ops:
                new.append(_parameter(len(ops), op.shape, module))
                ops.append(op)
    inner: Computation | None = None
    if producer.opcode == "fusion":
        inner = producer.attrs["calls"]
        inner_params = [i for i in inner.instructions if i.opcode == "parameter"]
        outer = [producer.operand(i.attrs["parameter_number"]) for i in inner_params]
    else:
        outer = producer.operands
    values: list[Instruction] = []
    clones: dict[int, Instruction] | None = {} if constants else None
    in_place: Any = _UNKNOWN  # `in_place_operand(fusion)`, found on first need
    for op in outer:
        if clones is not None and op.opcode == "constant" and op not in ops and _is_small_constant(op):
            # XLA fuses small constants into every fusible user anyway: a clone (one per constant)
            if in_place is _UNKNOWN:
                in_place = in_place_operand(fusion)
            if in_place is not op:
                clone = clones.get(op.id)
                if clone is None:
                    clone = clones[op.id] = op.clone(name=_fresh_name(module, op.name), operands=())
                    body.append(clone)
                values.append(clone)
                continue
        bound = _bound(op, fused, ops, first_new, new)
        if bound is not None:
            values.append(bound)
        else:
            p = _parameter(len(ops), op.shape, module)
            new.append(p)
            ops.append(op)
            values.append(p)
    if inner is None:
        value = _fused_clone(producer, producer.name if keep_name else _fresh_name(module, producer.name), values)
        body.append(value)
    else:
        mapping = dict(zip(inner_params, values, strict=True))
        # names kept must stay unique in `fused` (hand-written HLO reuses names across fused computations)
        taken = {i.name for i in fused.instructions}.union([i.name for i in new], [i.name for i in body]) \
            if keep_name else set()
        if keep_name and inner in run.new:  # made by this run: called by one fusion alone, never shared
            _commit(fusion, fused, ops[first_new:], new + body, anchor)
            value = _move_body(inner, fused, mapping, anchor, taken, module)
            if consumer is None:
                return value
            root = _consumer_clone(consumer, producer, value, fused, ops, first_new, new)
            fused.add(root)
            return root
        for inst in inner.instructions:
            if inst.opcode != "parameter":
                keep = keep_name and inst.name not in taken
                clone = _fused_clone(inst, inst.name if keep else _fresh_name(module, inst.name),
                                     [mapping[o] for o in inst.operands])
                mapping[inst] = clone
                body.append(clone)
        value = mapping[inner.root]
    if consumer is not None:
        value = _consumer_clone(consumer, producer, value, fused, ops, first_new, new)
        body.append(value)
    _commit(fusion, fused, ops[first_new:], new + body, anchor)
    return value


#: `param_<n>`, made once (a string made afresh hashes afresh in each look-up of it)
_PARAM_NAMES = tuple(f"param_{n}" for n in range(256))


def _parameter(number: int, shape: Shape | TupleShape, module: Module) -> Instruction:
    """A new fused parameter `param_<number>` (uniquified) of `shape` (with layouts)."""
    prefix = _PARAM_NAMES[number] if number < 256 else f"param_{number}"
    return Instruction("parameter", with_layouts(shape), name=_fresh_name(module, prefix), parameter_number=number)


def _bound(op: Instruction, fused: Computation, ops: list[Instruction], first_new: int,
           new: list[Instruction]) -> Instruction | None:
    """The parameter bound to `op` (None: none yet): `ops[i]` is bound to parameter i of `fused`, to
    `new[i - first_new]` from `first_new` on (added to `fused` or about to be)."""
    for i, bound in enumerate(ops):
        if bound is op:
            return fused.parameter(i) if i < first_new else new[i - first_new]
    return None


def _consumer_clone(consumer: Instruction, producer: Instruction, value: Instruction, fused: Computation,
                    ops: list[Instruction], first_new: int, new: list[Instruction]) -> Instruction:
    """A clone of `consumer` (keeping its name) reading `value` for `producer` and, for each other operand, the
    parameter bound to it (`_bound`)."""
    values = [value if op is producer else _bound(op, fused, ops, first_new, new) for op in consumer.operands]
    return _fused_clone(consumer, consumer.name, values)


def _commit(fusion: Instruction, fused: Computation, operands: list[Instruction], insts: list[Instruction],
            anchor: Instruction | None) -> None:
    """Add `insts` to `fused` ahead of `anchor` and `operands` to `fusion`, an edit each."""
    fused.add_all(insts, before=anchor)
    fusion.extend_operands(operands)


def _move_body(inner: Computation, fused: Computation, params: dict[Instruction, Instruction],
               anchor: Instruction | None, taken: set[str] | None = None, module: Module | None = None) -> Instruction:
    """Move the body of `inner` (a fused computation about to be dropped) into `fused` ahead of
    `anchor`, its parameters replaced by `params`; returns what its root computes. A producer's last
    use takes its instructions as they are instead of cloning them (same names, same result)."""
    body = [inst for inst in inner.instructions if inst.opcode != "parameter"]
    if taken and module is not None and not taken.isdisjoint([inst.name for inst in body]):
        for inst in body:  # one by one: a name noted by a move comes before the next renaming, as always
            if inst.name in taken:
                inst.name = _fresh_name(module, inst.name)  # a name `fused` already has
            inner.move_to(inst, fused, before=anchor)
    else:
        inner.move_all_to(body, fused, before=anchor)
    readers = {user for p in params for user in p.users}  # what reads a parameter: rewired, in body order
    for inst in body:
        if inst in readers:
            inst.replace_operands([params.get(op, op) for op in inst.operands])
    return params.get(inner.root, inner.root)


def _finish(fusion: Instruction, kind: str | None = None) -> None:
    fusion.attrs["kind"] = kind or fusion_kind(fusion.attrs["calls"])


def fuse_producer(fusion: Instruction, producer: Instruction, last_use: bool, constants: bool = False, *,
                  run: FusionRun | None = None, kind: str | None = None) -> None:
    """Fuse `producer` into `fusion` (one of its users): the fusion computes the producer itself instead
    of reading it; a producer that is a fusion has its computation merged in. The producer stays in
    its computation (the caller removes it when unused); `last_use` keeps its instruction names;
    `constants` clones the producer's small-constant operands in instead of passing them in; `kind`: the
    fusion's kind where the caller knows it (`fusion_kind` of the same fused computation). `run`: the fusion
    pass's run (without one, the edits are applied before returning)."""
    if run is None:
        return _in_own_run(fuse_producer, fusion, producer, last_use, constants, kind=kind)
    value = _inline_producer(fusion, producer, run, keep_name=last_use, constants=constants)
    _feed_from_inside(fusion, producer, value, run)
    _finish(fusion, kind)


def _make_multi_output(fusion: Instruction) -> None:
    """Give a single-output fusion a tuple root; its users read element 0 through a get-tuple-element."""
    if is_multi_output(fusion):
        return
    if fusion.shape.is_tuple:
        raise ValueError(f"%{fusion.name} has a tuple shape without a tuple root")
    comp = fusion.parent
    module = comp.module
    fused: Computation = fusion.attrs["calls"]
    old_root = fused.root
    tup = Instruction("tuple", TupleShape((old_root.shape,)), [old_root], name=module.unique_name("tuple"))
    fused.add(tup)
    fused.set_root(tup)
    users = list(fusion.users)
    was_root = comp.root is fusion
    fusion.shape = TupleShape((fusion.shape,))
    gte = Instruction("get-tuple-element", fusion.shape.elements[0], [fusion],
                      name=module.unique_name("get-tuple-element"), index=0)
    comp.add(gte, after=fusion)
    for u in users:
        u.replace_use_of(fusion, gte)
    if was_root:
        comp.set_root(gte)


def _add_output(fusion: Instruction, value: Instruction) -> int:
    """Append `value` (in the fused computation) to the fusion's tuple root; returns its index."""
    fused: Computation = fusion.attrs["calls"]
    tup = fused.root
    for i, op in enumerate(tup.operands):
        if op is value:
            return i
    tup.add_operand(value)
    tup.shape = TupleShape(tup.shape.elements + (value.shape,))
    fusion.shape = TupleShape(fusion.shape.elements + (value.shape,))
    return len(tup.shape.elements) - 1


def _redirect_users(comp: Computation, old: Instruction, fusion: Instruction, index_map: dict[int, int] | int) -> None:
    """Users of `old` (a single value, or a tuple read through get-tuple-elements) read `fusion`'s outputs."""
    module = comp.module
    if isinstance(index_map, int):
        gte = Instruction("get-tuple-element", fusion.shape.elements[index_map], [fusion],
                          name=module.unique_name("get-tuple-element"), index=index_map)
        comp.add(gte, after=fusion)
        was_root = comp.root is old
        for u in list(old.users):
            u.replace_use_of(old, gte)
        if was_root:
            comp.set_root(gte)
        return
    for u in list(old.users):
        if u.opcode == "get-tuple-element":
            u.replace_use_of(old, fusion)
            u.attrs["index"] = index_map[u.attrs["index"]]
        else:
            raise ValueError(f"%{u.name} reads multi-output %{old.name} without a get-tuple-element")


@_edits_applied
def fuse_into_multi_output(fusion: Instruction, producer: Instruction, reorder: bool = True, *,
                           run: FusionRun) -> None:
    """Fuse `producer` into `fusion` and also output its value there (XLA's
    FuseInstructionIntoMultiOutput): the producer's other users read it from the fusion.
    `reorder=False` leaves the computation's order to the caller (it may no longer be topological)."""
    comp = fusion.parent
    _make_multi_output(fusion)
    value = _inline_producer(fusion, producer, run, keep_name=True)
    _feed_from_inside(fusion, producer, value, run)
    if producer.shape.is_tuple:
        outs = {k: _add_output(fusion, value.operand(k)) for k in range(len(producer.shape.elements))}
        fused: Computation = fusion.attrs["calls"]
        if value.user_count == 0 and value is not fused.root:
            fused.remove(value)
        _redirect_users(comp, producer, fusion, outs)
    else:
        _redirect_users(comp, producer, fusion, _add_output(fusion, value))
    if reorder:
        comp.make_topological()
    _finish(fusion)


@_edits_applied
def merge_into_multi_output(fusion: Instruction, sibling: Instruction, reorder: bool = True, *,
                            run: FusionRun) -> None:
    """Merge `sibling` (a fusion or a lone instruction sharing an operand with `fusion`) into `fusion`
    as extra outputs (XLA's MergeFusionInstructionIntoMultiOutput); its users read them from `fusion`.
    `reorder=False` leaves the computation's order to the caller (it may no longer be topological)."""
    comp = fusion.parent
    _make_multi_output(fusion)
    value = _inline_producer(fusion, sibling, run, keep_name=True)
    fused: Computation = fusion.attrs["calls"]
    if sibling.shape.is_tuple:
        outs = {k: _add_output(fusion, value.operand(k)) for k in range(len(sibling.shape.elements))}
        if value.user_count == 0 and value is not fused.root:
            fused.remove(value)
        _redirect_users(comp, sibling, fusion, outs)
    else:
        _redirect_users(comp, sibling, fusion, _add_output(fusion, value))
    remove_fusion(sibling, run=run)
    if reorder:
        comp.make_topological()
    _finish(fusion)


@_edits_applied
def fuse_user_as_output(fusion: Instruction, chain: Sequence[Instruction], *, run: FusionRun) -> Instruction:
    """Compute a user of `fusion` inside it and output it from there (XLA's CopyFusion): `chain` is the path
    from the fusion to the user, each reading the one before, a leading get-tuple-element naming the output it
    starts from, then one-operand ops (a bitcast, the copy). The user's users read the new output through a
    get-tuple-element, returned; the chain's other instructions are removed when nothing else reads them."""
    comp = fusion.parent
    module = comp.module
    fused: Computation = fusion.attrs["calls"]
    ops = list(chain)
    if ops and ops[0].opcode == "get-tuple-element":
        value = fused.root.operand(ops.pop(0).attrs["index"])
    else:  # a single-output fusion (made multi-output by an earlier chain: its first output)
        value = fused.root.operand(0) if is_multi_output(fusion) else fused.root
    _make_multi_output(fusion)
    for op in ops:
        value = _clone_into(fused, op, [value], module, fused.root, keep_name=False)
    index = len(fused.root.shape.elements)
    fused.root.add_operand(value)
    fused.root.shape = TupleShape(fused.root.shape.elements + (value.shape,))
    fusion.shape = TupleShape(fusion.shape.elements + (value.shape,))
    user = chain[-1]
    gte = Instruction("get-tuple-element", fusion.shape.elements[index], [fusion],
                      name=module.unique_name("get-tuple-element"), index=index)
    comp.add(gte, before=user)
    user.replace_all_uses_with(gte)
    for inst in reversed(chain):
        if inst.user_count == 0 and inst is not comp.root and inst.parent is comp:
            comp.remove(inst)
    _finish(fusion)
    return gte


def remove_fusion(inst: Instruction, *, run: FusionRun | None = None) -> None:
    """Remove an unused instruction; a fusion's computation goes with it (`run`: the fusion pass's run;
    without one, the computation leaves the module before returning)."""
    if run is None:
        return _in_own_run(remove_fusion, inst)
    comp = inst.parent
    called = inst.attrs.get("calls") if inst.opcode == "fusion" else None
    module = comp.module
    comp.remove(inst)
    if called is not None:
        _drop_computation(module, called, run)
