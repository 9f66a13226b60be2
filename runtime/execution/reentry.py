"""Make an XLA-optimized module (a dump's `after_optimizations`) acceptable to XLA:CPU again.

jaxlib compiles through StableHLO, which carries no layouts, so layout-dependent instructions of an
optimized module must be rewritten into layout-free ones first:
- `bitcast` reinterprets the physical buffer: it becomes transpose(to physical order) -> reshape ->
  transpose(back to logical order), computed from both layouts;
- layouts are dropped (XLA assigns its own), and so is `entry_computation_layout`;
- fusions are inlined (XLA:CPU's own fusions carry backend configs its emitter expects; XLA fuses
  again anyway), unless `keep_fusions`.
The result computes the same values with XLA's default layouts.
"""

from __future__ import annotations

from hlopt.hlo.builder import Builder
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.opcodes import SYNC_COLLECTIVES
from hlopt.hlo.shape import Shape, TupleShape, default_layout
from hlopt.passes.dce import remove_unreachable_computations

__all__ = ["inline_fusion", "prepare_for_reentry", "needs_reentry", "cpu_fusion_kinds_only"]


def needs_reentry(module: Module) -> bool:
    """True for modules XLA has already optimized: scheduled, bitcasts, XLA-made fusions (with backend
    configs), an SPMD-partitioned entry."""
    if module.entry.name.endswith("_spmd") or module.is_scheduled:
        return True
    return any(i.opcode == "bitcast" or (i.opcode == "fusion" and "backend_config" in i.attrs)
               for i in module.instructions())


def _major_to_minor(shape: Shape) -> list[int]:
    layout = shape.layout or default_layout(shape.rank)
    return list(reversed(layout.minor_to_major)) if layout.minor_to_major else list(range(shape.rank))


def _bitcast_to_logical(comp: Computation, inst: Instruction) -> Instruction:
    src = inst.operand(0)
    b = Builder(comp, before=inst)
    x = src
    in_perm = _major_to_minor(src.shape)
    if in_perm != list(range(src.shape.rank)):
        x = b.transpose(x, in_perm)
    out_perm = _major_to_minor(inst.shape)
    physical_dims = [inst.shape.dims[d] for d in out_perm]
    if src.shape.dtype != inst.shape.dtype:
        if src.shape.dims != inst.shape.dims or src.shape.element_type.bits != inst.shape.element_type.bits:
            raise ValueError(f"bitcast %{inst.name} changes the element type and the shape; cannot rewrite it")
        return Builder(comp, before=inst).op("bitcast-convert", src, shape=inst.shape)
    if list(x.shape.dims) != physical_dims:
        x = b.reshape(x, physical_dims)
    if out_perm != list(range(inst.shape.rank)):
        inverse = [out_perm.index(i) for i in range(len(out_perm))]
        x = b.transpose(x, inverse)
    return x


def _strip_layout(shape):
    if shape is None:
        return None
    if isinstance(shape, TupleShape):
        return TupleShape(tuple(_strip_layout(s) for s in shape.elements))
    return shape.without_layout()


def inline_fusion(fusion: Instruction) -> Instruction:
    """Replace a fusion by the ops of its body (named after them) in its computation, keeping its control
    dependencies; the op that now stands for its root."""
    comp = fusion.parent
    body = fusion.attrs["calls"]
    mapping: dict[Instruction, Instruction] = {}
    for inst in body.post_order():
        if inst.opcode == "parameter":
            mapping[inst] = fusion.operand(inst.attrs["parameter_number"])
            continue
        clone = inst.clone(name=comp.module.unique_name(inst.name), operands=[mapping[o] for o in inst.operands])
        comp.add(clone, before=fusion)
        mapping[inst] = clone
    value = mapping[body.root]
    if value.parent is comp and (fusion.control_predecessors or fusion.control_successors):
        fusion.copy_control_dependencies_to(value)
    fusion.replace_all_uses_with(value)
    comp.remove(fusion)
    return value


def prepare_for_reentry(module: Module, keep_fusions: bool = False) -> Module:
    """A copy of `module` that XLA:CPU can compile from StableHLO, computing the same values."""
    out = module.clone()
    for comp in list(out.computations):
        for inst in list(comp.instructions):
            if inst.opcode == "bitcast" and inst.parent is comp:
                comp.replace_instruction(inst, _bitcast_to_logical(comp, inst), carry_annotations=False)
    if not keep_fusions:
        for comp in list(out.computations):
            for inst in list(comp.instructions):
                if inst.opcode == "fusion" and inst.parent is comp:
                    inline_fusion(inst)
        called = {c for i in out.instructions() for c in i.called_computations}
        for comp in list(out.computations):
            if comp is not out.entry and comp not in called:
                out.remove_computation(comp)
    for inst in out.instructions():
        if inst.opcode == "custom-call" and "operand_layout_constraints" in inst.attrs:
            continue  # library calls (LAPACK, ...) keep the layouts they were called with
        inst.shape = _strip_layout(inst.shape)
        if inst.opcode == "constant":
            inst.attrs["literal"].shape = inst.shape
    for key in ("entry_computation_layout", "is_scheduled"):
        out.config.pop(key, None)
    return out


def _cpu_rejects(fusion: Instruction, keep_fusions: bool) -> bool:
    """XLA:CPU (through StableHLO) keeps simple kLoop fusions of the entry computation; it rejects GPU
    kinds (kInput, kOutput, kCustom) and its emitter aborts on some fusions (inside loop bodies, around
    gathers, ...), so by default every fusion is inlined for execution (same values, XLA fuses again)."""
    if not keep_fusions:
        return True
    return str(fusion.get("kind")) != "kLoop" or not fusion.parent.is_entry


def cpu_fusion_kinds_only(module: Module, keep_fusions: bool = False) -> Module:
    """A copy of `module` with the fusions XLA:CPU should not see inlined (the module itself if none);
    `keep_fusions` keeps entry-computation kLoop fusions, to show that XLA:CPU runs them as they are."""
    if not any(i.opcode == "fusion" and _cpu_rejects(i, keep_fusions) for i in module.instructions()):
        return module
    out = module.clone()
    for comp in list(out.computations):
        for inst in list(comp.instructions):
            if inst.opcode == "fusion" and inst.parent is comp and _cpu_rejects(inst, keep_fusions):
                inline_fusion(inst)
    remove_unreachable_computations(out)
    return out


_DEDICATED_DONE = {"all-reduce-done": "all-reduce", "all-gather-done": "all-gather",
                   "collective-permute-done": "collective-permute"}


def _start_of(done: Instruction) -> Instruction:
    start = done.operand(0)
    while start.opcode in ("async-update",) or (start.opcode.endswith("-update") and start.operand_count):
        start = start.operand(0)
    return start


def synchronous_collectives(module: Module) -> Module:
    """A copy with async collective pairs turned back into the synchronous ops (XLA:CPU schedules
    by itself; its StableHLO import cannot take every async form). The module itself if it has none."""
    def is_done(i: Instruction) -> bool:
        return i.opcode in _DEDICATED_DONE or (i.opcode == "async-done" and _wrapped_collective(_start_of(i)))

    if not any(is_done(i) for i in module.instructions()):
        return module
    out = module.clone()
    for comp in list(out.computations):
        for done in [i for i in comp.instructions if is_done(i)]:
            start = _start_of(done)
            if done.opcode in _DEDICATED_DONE:
                attrs = dict(start.attrs)
                sync = Instruction(_DEDICATED_DONE[done.opcode], done.shape, start.operands,
                                   name=out.unique_name(done.name), **attrs)
            else:
                wrapped = start.attrs["calls"].root
                sync = Instruction(wrapped.opcode, done.shape, start.operands, name=out.unique_name(done.name),
                                   **dict(wrapped.attrs))
            comp.add(sync, before=done)
            done.replace_all_uses_with(sync)
            for x in (done, start):
                x.drop_control_dependencies()
            comp.remove(done)
            if not start.user_count:
                comp.remove(start)
    remove_unreachable_computations(out)
    return out


def _wrapped_collective(start: Instruction) -> bool:
    calls = start.attrs.get("calls")
    return start.opcode == "async-start" and calls is not None and calls.root is not None and \
        calls.root.opcode in SYNC_COLLECTIVES
