"""select-and-scatter-expander: select-and-scatter becomes a variadic reduce-window picking each
window's selected element and its index, then a scatter of the source there (XLA's
SelectAndScatterExpander, `select_and_scatter_expander`, which XLA:GPU runs before fusion), so that the
iotas fuse into the reduce-window and the index concatenate into the scatter.

Before:
    %s = f32[8,8] select-and-scatter(%x, f32[4,4] %g, %zero), window={size=2x2 stride=2x2}, select=%ge, scatter=%sum
After:
    %rw = (f32[4,4], s32[4,4], s32[4,4]) reduce-window(%x, %iota0, %iota1, %zero, %m1, %m1), to_apply=%ge.reduce_window
    %idx = s32[16,2] concatenate(reshape(gte(%rw, 1)), reshape(gte(%rw, 2))), dimensions={1}
    %s = f32[8,8] scatter(broadcast(%zero), %idx, reshape(%g)), to_apply=%sum
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import Shape, TupleShape
from hlopt.passes.framework.base import ExpanderPass
from hlopt.passes.framework.registry import register

__all__ = [
    "SelectAndScatterExpander", "can_expand_select_and_scatter", "expand_select_and_scatter",
    "select_and_scatter_expansion",
]


def _scalar_const(comp: Computation, module: Module, dtype: str, text: str,
                  before: Instruction | None = None) -> Instruction:
    from hlopt.hlo.literal import Literal

    return comp.add(Instruction("constant", Shape(dtype, ()), name=module.unique_name("constant"),
                                literal=Literal(text, Shape(dtype, ()))), before=before)


def _select_reducer(module: Module, select: Computation, dtype: str, rank: int, before: Computation) -> Computation:
    """The variadic reduce-window reducer of XLA's SelectAndScatterExpander over (value, index_0..) pairs:
    keep the accumulator (lhs) when the incoming element is padding (index -1), or when the accumulator
    is a real element that `select` prefers; else take the element (the first selected wins ties, as in
    select-and-scatter)."""
    comp = Computation(module.unique_name(f"{select.name}.reduce_window"))
    module.add_computation(comp, before=before)
    n = rank + 1
    types = [dtype] + ["s32"] * rank
    params = [comp.add(Instruction("parameter", Shape(types[i % n], ()), name=module.unique_name("p"),
                                   parameter_number=i)) for i in range(2 * n)]
    lhs, rhs = params[:n], params[n:]
    mapping = {select.parameter(0): lhs[0], select.parameter(1): rhs[0]}
    for inst in select.instructions:
        if inst.opcode != "parameter":
            mapping[inst] = comp.add(inst.clone(name=module.unique_name(inst.name),
                                                operands=[mapping[o] for o in inst.operands]))
    prefer = mapping[select.root]
    minus_one = _scalar_const(comp, module, "s32", "-1")
    pred = Shape("pred", ())

    def cmp(x: Instruction, direction: str) -> Instruction:
        return comp.add(Instruction("compare", pred, [x, minus_one], name=module.unique_name("compare"),
                                    direction=direction))

    real = comp.add(Instruction("and", pred, [cmp(lhs[1], "NE"), prefer], name=module.unique_name("and")))
    keep = comp.add(Instruction("or", pred, [cmp(rhs[1], "EQ"), real], name=module.unique_name("or")))
    outs = [comp.add(Instruction("select", Shape(types[i], ()), [keep, lhs[i], rhs[i]],
                                 name=module.unique_name("select"))) for i in range(n)]
    comp.set_root(comp.add(Instruction("tuple", TupleShape(tuple(o.shape for o in outs)), outs,
                                     name=module.unique_name("tuple"))))
    return comp


def can_expand_select_and_scatter(inst: Instruction) -> bool:
    """A select-and-scatter XLA:GPU's SelectAndScatterExpander rewrites (array operand, no dilation)."""
    if inst.opcode != "select-and-scatter" or inst.shape.is_tuple or inst.operand_count != 3:
        return False
    window = inst.attrs.get("window")
    return window is not None and all(d.lhs_dilate == 1 and d.rhs_dilate == 1 and not d.reversal
                                      for d in window.dims)


def expand_select_and_scatter(sas: Instruction) -> Instruction:
    """Replace select-and-scatter by `select_and_scatter_expansion(sas)`; returns the scatter."""
    scatter = select_and_scatter_expansion(sas)
    sas.parent.replace_instruction(sas, scatter)
    return scatter


def select_and_scatter_expansion(sas: Instruction) -> Instruction:
    """Build, before `sas`, what XLA:GPU's SelectAndScatterExpander makes of it before fusion: a variadic
    reduce-window over (operand, one iota per dimension) picking each window's selected element and its
    index, the indices concatenated into [N, rank], and a scatter (ScatterSimplifier's canonical form) of
    the source into a broadcast of the init value. Returns the scatter (with the metadata of `sas`)."""
    comp = sas.parent
    module = comp.module
    operand, source, init = sas.operands
    dims, rank, dtype = tuple(operand.shape.dims), operand.shape.rank, operand.shape.dtype
    wdims = tuple(source.shape.dims)
    n = math.prod(wdims)

    def add(opcode: str, shape: Shape | TupleShape, ops: Sequence[Instruction], **attrs) -> Instruction:
        return comp.add(Instruction(opcode, shape, ops, name=module.unique_name(opcode), **attrs), before=sas)

    def arr(dt: str, ds: tuple[int, ...]) -> Shape:
        return Shape(dt, ds).with_default_layout()

    iotas = [add("iota", arr("s32", dims), (), iota_dimension=d) for d in range(rank)]
    minus_one = _scalar_const(comp, module, "s32", "-1", before=sas)
    reducer = _select_reducer(module, sas.attrs["select"], dtype, rank, comp)
    out = TupleShape((arr(dtype, wdims),) + tuple(arr("s32", wdims) for _ in range(rank)))
    window = add("reduce-window", out, [operand, *iotas, init, *([minus_one] * rank)],
                 window=sas.attrs["window"], to_apply=reducer)
    columns = [add("reshape", arr("s32", (n, 1)), [add("get-tuple-element", out.elements[d + 1], [window],
                                                       index=d + 1)]) for d in range(rank)]
    indices = add("concatenate", arr("s32", (n, rank)), columns, dimensions=(1,))
    updates = add("reshape", arr(dtype, (n,) + (1,) * rank), [source])
    base = add("broadcast", arr(dtype, dims), [init], dimensions=())
    scatter = add("scatter", sas.shape, [base, indices, updates], update_window_dims=tuple(range(1, rank + 1)),
                  inserted_window_dims=(), scatter_dims_to_operand_dims=tuple(range(rank)), index_vector_dim=1,
                  to_apply=sas.attrs["scatter"])
    if sas.metadata is not None:
        scatter.metadata = sas.metadata.copy()
    return scatter


@register
@dataclass(frozen=True)
class SelectAndScatterExpander(ExpanderPass):
    """Expand select-and-scatter into reduce-window + scatter (see the module docstring)."""

    name: ClassVar[str] = "select-and-scatter-expander"
    opcodes: ClassVar[frozenset[str]] = frozenset({"select-and-scatter"})

    def instruction_matches(self, inst: Instruction) -> bool:
        return can_expand_select_and_scatter(inst)

    def expand(self, inst: Instruction) -> Instruction:
        return select_and_scatter_expansion(inst)

    def explain_expansion(self, old: Instruction, new: Instruction) -> str:
        return (f"[{self.name}] {old.parent.name}: %{old.name} expanded into reduce-window + scatter "
                f"%{new.name} (XLA:GPU's SelectAndScatterExpander)")
