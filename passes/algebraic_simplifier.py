"""algebraic-simplifier: the common identities of XLA's AlgebraicSimplifier.

    add(x, 0) -> x          subtract(x, 0) -> x        multiply(x, 1) -> x        divide(x, 1) -> x
    negate(negate(x)) -> x  not(not(x)) -> x
    reshape/bitcast/convert/copy/broadcast/transpose/slice/pad/concatenate that do nothing -> operand
    reshape(reshape(x)) -> reshape(x)     transpose(transpose(x)) -> one transpose (or x)
    select(constant pred, a, b) -> a or b
    scalar constant arithmetic (add, subtract, multiply, divide (floats), maximum, minimum, negate, abs,
    compare) folded into a constant
A replacement must have the replaced instruction's shape, layout included, so results never change
type or layout. Like XLA, x + 0 -> x ignores the sign of zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hlo.builder import Builder
from hlo.ir import Computation, Instruction
from hlo.literal import Literal
from hlo.shape import DTYPES, Shape, default_layout
from passes.base import ComputationPass
from passes.match import Pat, PatternMatcher, scalar_constant_value
from passes.registry import register

__all__ = ["AlgebraicSimplifier", "SIMPLIFICATIONS"]


def _layout(shape: Shape) -> tuple:
    if shape.is_tuple:
        return ()
    return (shape.layout or default_layout(shape.rank)).minor_to_major if shape.rank else ()


def same_shape(a: Instruction, b: Instruction) -> bool:
    """Same type, dimensions and (default-filled) layout."""
    return a.shape.compatible(b.shape) and _layout(a.shape) == _layout(b.shape)


def _keep(x: Instruction, root: Instruction) -> Instruction | None:
    return x if same_shape(x, root) else None


def _reshape_of_reshape(root: Instruction, inner: Instruction, x: Instruction) -> Instruction | None:
    if x.shape.dims == root.shape.dims and same_shape(x, root):
        return x
    b = Builder(root.parent, before=root)
    return b.op("reshape", x, shape=root.shape)


def _transpose_of_transpose(root: Instruction, inner: Instruction, x: Instruction) -> Instruction | None:
    p_in, p_out = inner.attrs["dimensions"], root.attrs["dimensions"]
    combined = tuple(p_in[p] for p in p_out)
    if combined == tuple(range(len(combined))):
        return _keep(x, root)
    return Builder(root.parent, before=root).op("transpose", x, shape=root.shape, dimensions=combined)


def _identity_transpose(root: Instruction, x: Instruction) -> Instruction | None:
    dims = root.attrs.get("dimensions", ())
    return _keep(x, root) if tuple(dims) == tuple(range(len(dims))) else None


def _full_slice(root: Instruction, x: Instruction) -> Instruction | None:
    spec = root.attrs.get("slice", ())
    full = all(s == 0 and lim == d and st == 1 for (s, lim, st), d in zip(spec, x.shape.dims, strict=False))
    return _keep(x, root) if full and len(spec) == x.shape.rank else None


def _identity_broadcast(root: Instruction, x: Instruction) -> Instruction | None:
    dims = tuple(root.attrs.get("dimensions", ()))
    return _keep(x, root) if dims == tuple(range(x.shape.rank)) else None


def _zero_pad(root: Instruction, x: Instruction, v: Instruction) -> Instruction | None:
    cfg = root.attrs.get("padding")
    if cfg is None or any(any(d) for d in cfg.dims):
        return None
    return _keep(x, root)


def _select_const(root: Instruction, p: Instruction, a: Instruction, b: Instruction) -> Instruction | None:
    value = scalar_constant_value(p)
    if value is None:
        return None
    return _keep(a if value else b, root)


def _single_concat(root: Instruction, x: Instruction) -> Instruction | None:
    return _keep(x, root)


_FOLD = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
    "minimum": np.minimum, "divide": np.divide,
}
_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
            "GE": np.greater_equal}


def _scalar_const(inst: Instruction) -> np.ndarray | None:
    if inst.opcode != "constant" or inst.shape.is_tuple or inst.shape.rank != 0:
        return None
    lit = inst.attrs["literal"]
    if lit.is_elided or DTYPES[inst.shape.dtype].numpy is None:
        return None
    try:
        return lit.to_numpy()
    except ValueError:
        return None


def _fold_binary(root: Instruction, a: Instruction, b: Instruction) -> Instruction | None:
    x, y = _scalar_const(a), _scalar_const(b)
    if x is None or y is None or root.shape.is_tuple:
        return None
    dt = DTYPES[root.shape.dtype]
    if root.opcode == "compare":
        fn = _COMPARE.get(str(root.attrs.get("direction")))
        if fn is None or DTYPES[a.shape.dtype].kind == "complex":
            return None
        value = fn(x, y)
    else:
        if root.opcode == "divide" and dt.kind != "float":
            return None  # integer division semantics (rounding, x/0) differ between numpy and XLA
        if dt.kind not in ("float", "sint", "uint"):
            return None
        with np.errstate(all="ignore"):
            value = _FOLD[root.opcode](x.astype(np.float64) if dt.kind == "float" else x,
                                       y.astype(np.float64) if dt.kind == "float" else y)
        value = np.asarray(value).astype(dt.numpy)  # integers wrap, as they do in XLA
    return _constant_like(root, value)


def _fold_unary(root: Instruction, a: Instruction) -> Instruction | None:
    x = _scalar_const(a)
    dt = DTYPES[root.shape.dtype]
    if x is None or dt.kind not in ("float", "sint"):
        return None
    if dt.kind == "sint" and x == np.iinfo(x.dtype).min:
        return None
    value = -x if root.opcode == "negate" else np.abs(x)
    return _constant_like(root, np.asarray(value).astype(dt.numpy))


def _constant_like(root: Instruction, value: np.ndarray) -> Instruction:
    b = Builder(root.parent, before=root)
    return b.op("constant", shape=root.shape, literal=Literal.from_numpy(value, root.shape))


_ANY_X = Pat.any("x")

#: The rules, as (pattern, rewrite) pairs.
SIMPLIFICATIONS = PatternMatcher([
    (Pat("add", [_ANY_X, Pat.const(0)]), lambda root, x: _keep(x, root)),
    (Pat("subtract", [_ANY_X, Pat.const(0)]), lambda root, x: _keep(x, root)),
    (Pat("multiply", [_ANY_X, Pat.const(1)]), lambda root, x: _keep(x, root)),
    (Pat("divide", [_ANY_X, Pat.const(1)]), lambda root, x: _keep(x, root)),
    (Pat("negate", [Pat("negate", [_ANY_X])]), lambda root, x: _keep(x, root)),
    (Pat("not", [Pat("not", [_ANY_X])]), lambda root, x: _keep(x, root)),
    (Pat({"reshape", "bitcast", "copy"}, [_ANY_X]), lambda root, x: _keep(x, root)),
    (Pat("convert", [_ANY_X]), lambda root, x: _keep(x, root)),
    (Pat("reshape", [Pat("reshape", [_ANY_X], name="inner", predicate=lambda i: i.user_count == 1)]),
     _reshape_of_reshape),
    (Pat("transpose", [Pat("transpose", [_ANY_X], name="inner", predicate=lambda i: i.user_count == 1)]),
     _transpose_of_transpose),
    (Pat("transpose", [_ANY_X]), _identity_transpose),
    (Pat("broadcast", [_ANY_X]), _identity_broadcast),
    (Pat("slice", [_ANY_X]), _full_slice),
    (Pat("pad", [_ANY_X, Pat.any("v")]), _zero_pad),
    (Pat("concatenate", [_ANY_X]), _single_concat),
    (Pat("select", [Pat.any("p"), Pat.any("a"), Pat.any("b")]), _select_const),
    (Pat(set(_FOLD) | {"compare"}, [Pat("constant", name="a"), Pat("constant", name="b")], commutative=False),
     _fold_binary),
    (Pat({"negate", "abs"}, [Pat("constant", name="a")]), _fold_unary),
])


def _forwards_parameter(inst: Instruction) -> bool:
    return any(op.opcode == "parameter" for op in inst.operands)


@register
@dataclass(frozen=True)
class AlgebraicSimplifier(ComputationPass):
    """Apply the algebraic identities and scalar constant folding listed in the module docstring."""

    name: ClassVar[str] = "algebraic-simplifier"

    def run_on_computation(self, computation: Computation) -> bool:
        changed = False
        for inst in list(computation.instructions):
            if (inst.parent is not computation or inst.has_side_effect or inst.control_predecessors
                    or inst.control_successors):
                continue
            if inst is computation.root and computation.is_entry and _forwards_parameter(inst):
                continue  # the entry's result must stay distinct from its parameters
            new = SIMPLIFICATIONS.rewrite(inst)
            if new is None or new is inst:
                continue
            inst.replace_all_uses_with(new)
            if computation.root is inst:
                computation.root = new
            if not inst.user_count and inst is not computation.root:
                computation.remove_dead(inst)
            changed = True
        return changed
