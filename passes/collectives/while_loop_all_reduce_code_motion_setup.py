"""Setup rewrites run by while-loop-all-reduce-code-motion (XLA's while_loop_all_reduce_code_motion_setup).

They bring an accumulation into the `add(collective(x), gte(param))` form the code motion recognises:

    reorder-reduce-transpose:     add(transpose([convert](reduce-scatter(x))), gte)
                               -> add(reduce-scatter'(transpose([convert'](x))), gte)
    reorder-convert-reduce-add:   add(convert(all-reduce|reduce-scatter(x)), gte)
                               -> add(all-reduce'|reduce-scatter'(convert'(x)), gte)

Both only touch while bodies. The new collective reduces in the converted type (its reduction computation
is re-typed when needed, as XLA's test expects). A float -> integer/pred convert does not commute with a
SUM/PRODUCT reduction, so that case is left alone (XLA would rewrite it).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.builder import Builder
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import Shape
from hlopt.passes.framework.base import ExpanderPass
from hlopt.passes.framework.registry import register

__all__ = [
    "ReorderReduceTranspose", "ReorderConvertReduceAdd", "reduction_kind", "retyped_reduction", "while_bodies",
    "convert_commutes", "reassociate_all_reduces",
]

_KIND_OF_ROOT = {"add": "SUM", "multiply": "PRODUCT", "minimum": "MIN", "maximum": "MAX", "and": "MIN", "or": "MAX"}


def reduction_kind(comp: Computation | None) -> str | None:
    """SUM / PRODUCT / MIN / MAX when `comp` is that binary op of its two scalar parameters (XLA's
    MatchReductionComputation), else None."""
    if comp is None or comp.root is None:
        return None
    params = comp.parameters
    root = comp.root
    if len(params) != 2 or root.opcode not in _KIND_OF_ROOT or root.operand_count != 2:
        return None
    if set(root.operands) != set(params) or root.operand(0) is root.operand(1):
        return None
    if root.opcode in ("and", "or") and root.shape.dtype != "pred":
        return None
    return _KIND_OF_ROOT[root.opcode]


def retyped_reduction(module: Module, comp: Computation, dtype: str) -> Computation | None:
    """`comp` if it already reduces `dtype`, else a new copy of the same binary reduction over `dtype`
    (added to `module`); None when `comp` is not a plain binary reduction."""
    if reduction_kind(comp) is None:
        return None
    if all(p.shape.dtype == dtype for p in comp.parameters) and comp.root.shape.dtype == dtype:
        return comp
    for other in module.computations:  # reuse one made earlier
        if other.name.startswith(comp.name + "_" + dtype) and reduction_kind(other) == reduction_kind(comp) \
                and other.root.opcode == comp.root.opcode and other.root.shape.dtype == dtype:
            return other
    new = Computation(module.unique_name(f"{comp.name}_{dtype}"))
    module.add_computation(new, before=comp if comp in module.computations else None)
    b = Builder(new)
    x = b.parameter(0, Shape(dtype, ()))
    y = b.parameter(1, Shape(dtype, ()))
    new.set_root(b.op(comp.root.opcode, x, y, shape=Shape(dtype, ())))
    return new


def while_bodies(module: Module) -> set[Computation]:
    """Computations that are the body of some while."""
    return {i.attrs["body"] for i in module.instructions() if i.opcode == "while" and "body" in i.attrs}


def convert_commutes(src: str, dst: str, kind: str | None) -> bool:
    """Whether convert(src -> dst) commutes with a reduction of `kind` closely enough to move it
    (float -> float only changes rounding; float -> integer/pred truncates and breaks SUM/PRODUCT)."""
    from hlopt.hlo.shape import DTYPES

    if kind in ("MIN", "MAX"):
        return True  # every convert is monotone
    s, d = DTYPES[src].kind, DTYPES[dst].kind
    return not (s in ("float", "complex") and d in ("sint", "uint", "pred")) and d != "pred"


_KIND_OF_OP = {"add": "SUM", "multiply": "PRODUCT", "minimum": "MIN", "maximum": "MAX"}
_KEY_ATTRS = ("replica_groups", "use_global_device_ids")


def _all_reduce_through_views(inst: Instruction, op: Instruction) -> Instruction | None:
    """The all-reduce reached from `inst` (an operand of `op`) through reshapes and slices, each (and the
    all-reduce) used once; it must reduce with `op`'s kind (XLA's LookThroughForAllReduce, without pads)."""
    user = op
    while inst.opcode in ("reshape", "slice"):
        if inst.users != (user,):
            return None
        user, inst = inst, inst.operand(0)
    if inst.opcode != "all-reduce" or inst.operand_count != 1 or inst.shape.is_tuple or inst.users != (user,):
        return None
    if inst.get("constrain_layout") is True:
        return None
    return inst if reduction_kind(inst.attrs.get("to_apply")) == _KIND_OF_OP[op.opcode] else None


def _compatible(a: Instruction, b: Instruction) -> bool:
    """Same groups, channel-ness, global ids and element type (XLA's AllReduceKey, no converts)."""
    same_attrs = all(str(a.get(k)) == str(b.get(k)) for k in _KEY_ATTRS)
    channels = isinstance(a.get("channel_id"), int) == isinstance(b.get("channel_id"), int)
    return same_attrs and channels and a.shape.dtype == b.shape.dtype


def reassociate_all_reduces(comp: Computation) -> bool:
    """op(all-reduce(x), all-reduce(y)) -> all-reduce(op(x, y)) in `comp`, for op the all-reduces' own reduction
    (add/multiply/minimum/maximum), reshapes and slices allowed between, everything used once, equal groups and
    types: XLA's AllReduceReassociate without pads and converts. XLA:GPU runs it just before
    while-loop-all-reduce-code-motion; here it runs on while bodies, where it lets the sum move out."""
    changed = False
    for op in comp.post_order():
        if op.opcode not in _KIND_OF_OP or op.operand_count != 2 or op.shape.is_tuple:
            continue
        a = _all_reduce_through_views(op.operand(0), op)
        b = _all_reduce_through_views(op.operand(1), op)
        if a is None or b is None or not _compatible(a, b) or a.shape.dtype != op.shape.dtype:
            continue
        if (a.shape.numel + (b.shape.numel if b is not a else 0)) < op.shape.numel:
            continue  # XLA's ReassociateAllReduceIsProfitable
        users = list(op.users)
        for ar in {a, b}:
            ar.replace_all_uses_with(ar.operand(0))
        moved = Builder(comp, after=op).insert(a.clone(name=comp.module.unique_name(a.name), operands=[op]))
        moved.set_shape(op.shape)
        for user in users:
            user.replace_use_of(op, moved)
        if comp.root is op:
            comp.set_root(moved)
        for ar in {a, b}:
            comp.remove(ar)
        changed = True
    return changed


def _copy_collective_attrs(old: Instruction, to_apply: Computation, **overrides: object) -> dict:
    attrs = {k: v for k, v in old.attrs.items() if k not in ("sharding",)}
    attrs["to_apply"] = to_apply
    attrs.update(overrides)
    return attrs


@dataclass(frozen=True)
class _WhileBodyExpander(ExpanderPass):
    """An expander that only looks at instructions of while bodies (`run` matches only there; a direct
    `instruction_matches` call checks `in_while_body` itself)."""

    def computations(self, module: Module) -> list[Computation]:
        """The while bodies among the non-fusion computations, callees first."""
        bodies = while_bodies(module)
        return [c for c in super().computations(module) if c in bodies]

    def in_while_body(self, inst: Instruction) -> bool:
        """Whether `inst` lies in a while body."""
        return inst.parent in while_bodies(inst.parent.module)

    def instruction_matches(self, inst: Instruction) -> bool:
        """The pattern, in a while body."""
        return self.pattern_matches(inst) and self.in_while_body(inst)

    def matches_while_running(self, inst: Instruction) -> bool:
        """`run` looks only at while bodies: the pattern alone."""
        return self.pattern_matches(inst)

    @abstractmethod
    def pattern_matches(self, inst: Instruction) -> bool:
        """Whether `inst` is one this pass rewrites, wherever it lies."""


@register
@dataclass(frozen=True)
class ReorderReduceTranspose(_WhileBodyExpander):
    """transpose([convert](reduce-scatter(x))) feeding an accumulation -> reduce-scatter(transpose([convert](x))).

    Before:  %rs = f32[1024,1024] reduce-scatter(f32[4096,1024] %x), dimensions={0}
             %t = f32[1024,1024] transpose(%rs), dimensions={1,0}
             %acc = add(%t, %gte)
    After:   %t2 = f32[1024,4096] transpose(%x), dimensions={1,0}
             %rs2 = f32[1024,1024] reduce-scatter(%t2), dimensions={1}
             %acc = add(%rs2, %gte)
    """

    name: ClassVar[str] = "reorder-reduce-transpose"

    def pattern_matches(self, inst: Instruction) -> bool:
        """A transpose of a reduce-scatter (through a convert) feeding an accumulation."""
        if inst.opcode != "transpose":
            return False
        rs = inst.operand(0)
        if rs.opcode == "convert":
            rs = rs.operand(0)
        if rs.opcode != "reduce-scatter" or rs.operand_count != 1 or rs.shape.is_tuple or not inst.users:
            return False
        first = inst.users[0]
        if first.opcode == "reshape":
            return bool(first.users) and first.users[0].opcode == "dynamic-update-slice"
        if first.opcode != "add":
            return False
        other = first.operand(0) if first.operand(0).opcode == "get-tuple-element" else first.operand(1)
        return other.opcode == "get-tuple-element" and other.operand(0).opcode == "parameter"

    def expand(self, inst: Instruction) -> Instruction | None:
        conv = inst.operand(0) if inst.operand(0).opcode == "convert" else None
        rs = conv.operand(0) if conv is not None else inst.operand(0)
        dtype = inst.shape.dtype
        to_apply = retyped_reduction(inst.parent.module, rs.attrs["to_apply"], dtype)
        kind = reduction_kind(rs.attrs["to_apply"])
        if to_apply is None or (conv is not None and not convert_commutes(rs.shape.dtype, dtype, kind)):
            return None
        b = Builder(inst.parent, before=inst)
        x = rs.operand(0)
        if conv is not None:
            x = b.convert(x, dtype)
        perm = tuple(inst.attrs["dimensions"])
        t = b.transpose(x, perm)
        scatter_dim = rs.attrs["dimensions"][0]
        new_dim = perm.index(scatter_dim)
        attrs = _copy_collective_attrs(rs, to_apply, dimensions=(new_dim,))
        return b.op("reduce-scatter", t, shape=inst.shape, **attrs)


@register
@dataclass(frozen=True)
class ReorderConvertReduceAdd(_WhileBodyExpander):
    """add(convert(all-reduce(x)), gte(param)) -> add(all-reduce(convert(x)), gte(param)) in while bodies.

    Before:  %ar = bf16[8] all-reduce(bf16[8] %x), to_apply=%sum_bf16
             %c = f32[8] convert(%ar)
             %acc = f32[8] add(%c, %gte)
    After:   %c2 = f32[8] convert(%x)
             %ar2 = f32[8] all-reduce(%c2), to_apply=%sum_bf16_f32
             %acc = f32[8] add(%ar2, %gte)
    """

    name: ClassVar[str] = "reorder-convert-reduce-add"
    enable_reduce_scatter: bool = False

    def _parts(self, inst: Instruction) -> tuple[Instruction, Instruction] | None:
        conv = other = gte = None
        for op in inst.operands:
            if op.opcode == "convert":
                conv = op
            else:
                other = op
                if op.opcode == "get-tuple-element":
                    gte = op
        if conv is None or gte is None or other is None:
            return None
        return conv, other

    def pattern_matches(self, inst: Instruction) -> bool:
        """An add of a converted all-reduce / reduce-scatter and a loop-carried accumulator."""
        if inst.opcode != "add":
            return False
        parts = self._parts(inst)
        if parts is None:
            return False
        conv, other = parts
        red = conv.operand(0)
        if red.opcode not in ("all-reduce", "reduce-scatter") or red.operand_count != 1 or red.shape.is_tuple:
            return False
        if red.opcode == "reduce-scatter" and not self.enable_reduce_scatter:
            return False
        return other.operand(0).opcode == "parameter"

    def expand(self, inst: Instruction) -> Instruction | None:
        conv, other = self._parts(inst)
        red = conv.operand(0)
        dtype = conv.shape.dtype
        kind = reduction_kind(red.attrs["to_apply"])
        to_apply = retyped_reduction(inst.parent.module, red.attrs["to_apply"], dtype)
        if to_apply is None or not convert_commutes(red.shape.dtype, dtype, kind):
            return None
        b = Builder(inst.parent, before=inst)
        x = b.convert(red.operand(0), dtype)
        new_red = b.op(red.opcode, x, shape=red.shape.with_dtype(dtype), **_copy_collective_attrs(red, to_apply))
        return b.op("add", new_red, other, shape=inst.shape)
