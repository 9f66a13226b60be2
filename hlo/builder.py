"""Builder: create instructions in a computation with their shapes worked out.

    b = Builder(comp, before=some_inst)
    zero = b.constant(0.0, "f32")
    s = b.add(x, b.broadcast(zero, x.shape, ()))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from hlopt.hlo.ir import Computation, Instruction
from hlopt.hlo.literal import Literal
from hlopt.hlo.shape import AnyShape, Shape, TupleShape, default_layout
from hlopt.hlo.shape_inference import infer_shape

__all__ = ["Builder"]


class Builder:
    """Adds instructions to `computation`, at the end or before/after a given instruction."""

    def __init__(self, computation: Computation, before: Instruction | None = None, after: Instruction | None = None):
        self.computation = computation
        self.before = before
        self.after = after

    def insert(self, inst: Instruction) -> Instruction:
        """Add an already-built instruction at the builder's position."""
        if self.after is not None:
            self.computation.add(inst, after=self.after)
            self.after = inst
        else:
            self.computation.add(inst, before=self.before)
        return inst

    def op(self, opcode: str, *operands: Instruction, shape: AnyShape | None = None, name: str | None = None,
           **attrs: Any) -> Instruction:
        """Any instruction; its shape is inferred when not given."""
        inst = Instruction(opcode, shape, operands, name=name, **attrs)
        if shape is None:
            inst.shape = infer_shape(inst)
        return self.insert(inst)

    # ----------------------------------------------------------------- leaves
    def constant(self, value: Any, dtype_or_shape: str | Shape, name: str | None = None) -> Instruction:
        """A constant of a scalar dtype, or of a shape (a scalar value is broadcast)."""
        shape = Shape(dtype_or_shape, ()) if isinstance(dtype_or_shape, str) else dtype_or_shape
        if shape.layout is None and shape.rank:
            shape = shape.with_layout(default_layout(shape.rank))
        return self.op("constant", shape=shape, name=name, literal=Literal.from_numpy(np.asarray(value), shape))

    def parameter(self, number: int, shape: AnyShape, name: str | None = None) -> Instruction:
        """A parameter instruction."""
        return self.op("parameter", shape=shape, name=name, parameter_number=number)

    def iota(self, shape: Shape, dimension: int) -> Instruction:
        """iota along one dimension."""
        return self.op("iota", shape=shape, iota_dimension=dimension)

    # ----------------------------------------------------------------- elementwise
    def unary(self, opcode: str, x: Instruction) -> Instruction:
        """A unary elementwise op."""
        return self.op(opcode, x)

    def binary(self, opcode: str, x: Instruction, y: Instruction) -> Instruction:
        """A binary elementwise op on equal shapes."""
        return self.op(opcode, x, y, shape=x.shape)

    def add(self, x: Instruction, y: Instruction) -> Instruction:
        """x + y."""
        return self.binary("add", x, y)

    def subtract(self, x: Instruction, y: Instruction) -> Instruction:
        """x - y."""
        return self.binary("subtract", x, y)

    def multiply(self, x: Instruction, y: Instruction) -> Instruction:
        """x * y."""
        return self.binary("multiply", x, y)

    def divide(self, x: Instruction, y: Instruction) -> Instruction:
        """x / y."""
        return self.binary("divide", x, y)

    def maximum(self, x: Instruction, y: Instruction) -> Instruction:
        """max(x, y)."""
        return self.binary("maximum", x, y)

    def compare(self, x: Instruction, y: Instruction, direction: str, type: str | None = None) -> Instruction:
        """compare(x, y), direction=EQ/NE/LT/LE/GT/GE."""
        attrs: dict[str, Any] = {"direction": direction}
        if type:
            attrs["type"] = type
        return self.op("compare", x, y, shape=x.shape.with_dtype("pred"), **attrs)

    def select(self, pred: Instruction, on_true: Instruction, on_false: Instruction) -> Instruction:
        """select(pred, on_true, on_false)."""
        return self.op("select", pred, on_true, on_false, shape=on_true.shape)

    def convert(self, x: Instruction, dtype: str) -> Instruction:
        """Convert elements to `dtype`."""
        return self.op("convert", x, shape=x.shape.with_dtype(dtype))

    # ----------------------------------------------------------------- shape ops
    def broadcast(self, x: Instruction, shape: Shape | Sequence[int], dimensions: Sequence[int]) -> Instruction:
        """Broadcast x into `shape` (dims or a Shape; dtype from x); x's dims map to `dimensions`."""
        dims = tuple(shape.dims) if isinstance(shape, Shape) else tuple(shape)
        out = Shape(x.shape.dtype, dims, (), default_layout(len(dims)))
        return self.op("broadcast", x, shape=out, dimensions=tuple(dimensions))

    def reshape(self, x: Instruction, dims: Sequence[int]) -> Instruction:
        """Reshape x to `dims`."""
        return self.op("reshape", x, shape=Shape(x.shape.dtype, tuple(dims), (), default_layout(len(dims))))

    def bitcast(self, x: Instruction, shape: Shape) -> Instruction:
        """A bitcast to `shape`."""
        return self.op("bitcast", x, shape=shape)

    def transpose(self, x: Instruction, permutation: Sequence[int]) -> Instruction:
        """Transpose x: output dim i is input dim permutation[i]."""
        dims = tuple(x.shape.dims[p] for p in permutation)
        return self.op("transpose", x, shape=Shape(x.shape.dtype, dims, (), default_layout(len(dims))),
                       dimensions=tuple(permutation))

    def slice(self, x: Instruction, starts: Sequence[int], limits: Sequence[int],
              strides: Sequence[int] | None = None) -> Instruction:
        """A static slice."""
        strides = strides or [1] * len(starts)
        dims = tuple((lim - s + st - 1) // st for s, lim, st in zip(starts, limits, strides, strict=True))
        spec = tuple(zip(starts, limits, strides, strict=True))
        return self.op("slice", x, shape=Shape(x.shape.dtype, dims, (), default_layout(len(dims))), slice=spec)

    def pad(self, x: Instruction, value: Instruction, config: Sequence[tuple[int, int, int]]) -> Instruction:
        """Pad x with `value`; config is (low, high, interior) per dimension."""
        from hlopt.hlo.attributes import PaddingConfig

        dims = tuple(
            lo + hi + d + max(d - 1, 0) * interior for d, (lo, hi, interior) in zip(x.shape.dims, config, strict=True)
        )
        return self.op("pad", x, value, shape=Shape(x.shape.dtype, dims, (), default_layout(len(dims))),
                       padding=PaddingConfig(tuple(tuple(c) for c in config)))

    def dynamic_update_slice(self, x: Instruction, update: Instruction, *indices: Instruction) -> Instruction:
        """dynamic-update-slice(x, update, indices...)."""
        return self.op("dynamic-update-slice", x, update, *indices, shape=x.shape)

    def dynamic_slice(self, x: Instruction, sizes: Sequence[int], *indices: Instruction) -> Instruction:
        """dynamic-slice(x, indices...) of `sizes`."""
        return self.op("dynamic-slice", x, *indices, shape=Shape(x.shape.dtype, tuple(sizes), (),
                                                                 default_layout(len(sizes))),
                       dynamic_slice_sizes=tuple(sizes))

    # ----------------------------------------------------------------- tuples and calls
    def tuple(self, *elements: Instruction) -> Instruction:
        """A tuple of the elements."""
        return self.op("tuple", *elements, shape=TupleShape(tuple(e.shape for e in elements)))

    def get_tuple_element(self, x: Instruction, index: int) -> Instruction:
        """Element `index` of tuple x."""
        return self.op("get-tuple-element", x, shape=x.shape.elements[index], index=index)

    def call(self, computation: Computation, *operands: Instruction, **attrs: Any) -> Instruction:
        """call(operands), to_apply=computation."""
        return self.op("call", *operands, shape=computation.root.shape, to_apply=computation, **attrs)

    def dot(self, lhs: Instruction, rhs: Instruction, lhs_contracting: Sequence[int], rhs_contracting: Sequence[int],
            lhs_batch: Sequence[int] = (), rhs_batch: Sequence[int] = (), dtype: str | None = None) -> Instruction:
        """A dot_general with XLA's output dimension order: batch, lhs free, rhs free."""
        ls, rs = lhs.shape.dims, rhs.shape.dims
        batch = [ls[d] for d in lhs_batch]
        lfree = [d for i, d in enumerate(ls) if i not in lhs_batch and i not in lhs_contracting]
        rfree = [d for i, d in enumerate(rs) if i not in rhs_batch and i not in rhs_contracting]
        dims = tuple(batch + lfree + rfree)
        attrs: dict[str, Any] = {}
        if lhs_batch:
            attrs["lhs_batch_dims"] = tuple(lhs_batch)
        attrs["lhs_contracting_dims"] = tuple(lhs_contracting)
        if rhs_batch:
            attrs["rhs_batch_dims"] = tuple(rhs_batch)
        attrs["rhs_contracting_dims"] = tuple(rhs_contracting)
        out = Shape(dtype or lhs.shape.dtype, dims, (), default_layout(len(dims)))
        return self.op("dot", lhs, rhs, shape=out, **attrs)

    def reduce(self, x: Instruction, init: Instruction, dimensions: Sequence[int], to_apply: Computation) -> Instruction:
        """reduce(x, init) over `dimensions` with the scalar computation `to_apply`."""
        dims = tuple(d for i, d in enumerate(x.shape.dims) if i not in dimensions)
        out = Shape(x.shape.dtype, dims, (), default_layout(len(dims)))
        return self.op("reduce", x, init, shape=out, dimensions=tuple(dimensions), to_apply=to_apply)


def scalar_computation(module: Any, opcode: str, dtype: str, name: str | None = None) -> Computation:
    """A new `(a, b) -> opcode(a, b)` computation over scalars of `dtype`, added to `module`."""
    comp = Computation(module.unique_name(name or f"{opcode}_{dtype}"))
    module.add_computation(comp, before=module.computations[0] if module.computations else None)
    b = Builder(comp)
    x = b.parameter(0, Shape(dtype, ()), name=module.unique_name("x"))
    y = b.parameter(1, Shape(dtype, ()), name=module.unique_name("y"))
    comp.set_root(b.op(opcode, x, y, shape=Shape(dtype, ()), name=module.unique_name(opcode)))
    return comp
