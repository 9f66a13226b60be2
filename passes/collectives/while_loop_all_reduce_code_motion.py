"""while-loop-all-reduce-code-motion: move all-reduces out of while loops (XLA's WhileLoopAllReduceCodeMotion).

Accumulation form (SUM all-reduce, or reduce-scatter with `enable_reduce_scatter`). Before:

    %body (p: (s32[], f32[8], f32[8])) -> (s32[], f32[8], f32[8]) {
      ...
      %g = f32[8] get-tuple-element(%p), index=1
      %acc = f32[8] get-tuple-element(%p), index=2
      %ar = f32[8] all-reduce(%g), replica_groups={{0,1,2,3}}, to_apply=%sum
      %new = f32[8] add(%ar, %acc)
      ROOT %t = (s32[], f32[8], f32[8]) tuple(%next, %g, %new)
    }
    ENTRY ... {
      %init = (s32[], f32[8], f32[8]) tuple(%zero, %x, %a)
      ROOT %w = (s32[], f32[8], f32[8]) while(%init), condition=%cond, body=%body
    }

After (the loop accumulates the unreduced values from zero; one all-reduce after it):

    %body: %new = f32[8] add(%g, %acc)
    ENTRY ... {
      %constant = f32[8] constant({0, 0, 0, 0, 0, 0, 0, 0})
      %tuple = (s32[], f32[8], f32[8]) tuple(%zero, %x, %constant)
      %w = (s32[], f32[8], f32[8]) while(%tuple), condition=%cond, body=%body
      %get-tuple-element = f32[8] get-tuple-element(%w), index=2
      %all-reduce = f32[8] all-reduce(%get-tuple-element), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%sum
      %add = f32[8] add(%a, %all-reduce)
      ROOT %tuple.1 = (s32[], f32[8], f32[8]) tuple(%w.0, %w.1, %add)   (GTE users read the add directly)
    }

Converts, bitcasts, reshapes, transposes, slices, broadcasts, selects against zero and a multiply by a
broadcast scalar all-reduce may stand between the all-reduce and the add; the buffer may be a
dynamic-slice / dynamic-update-slice pair at offsets replicated within the groups. DUS form (any reduction):
an all-reduce stored each iteration with dynamic-update-slice at the induction variable of a 0-based step-1
loop is all-reduced once after the loop over the written region (slice -> convert -> all-reduce -> convert
-> dynamic-update-slice). See docs/notes/while-loop-all-reduce-code-motion.md for the exact rules, XLA's
refusals, and where hlopt refuses a move XLA would make because it changes results. hlopt also repeats the
matching until nothing moves and reassociates summed all-reduces first (options `repeat`, `reassociate`).
The replication and while-loop analyses it uses live in `hlopt.hlo.analysis`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from hlopt.hlo.analysis.hlo_replication_analysis import (
    CollectiveReplication,
    DeviceConfig,
    ReplicationAnalysis,
    device_config,
)
from hlopt.hlo.analysis.while_loop_analysis import (
    induction_variable,
    is_induction_variable,
    loop_max_value,
    scalar_int_constant,
    single_parameter,
)
from hlopt.hlo.builder import Builder
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.literal import Literal
from hlopt.hlo.shape import Shape, TupleShape, default_layout
from hlopt.passes.collectives.while_loop_all_reduce_code_motion_setup import (
    ReorderConvertReduceAdd,
    ReorderReduceTranspose,
    convert_commutes,
    reassociate_all_reduces,
    reduction_kind,
)
from hlopt.passes.framework.base import ModulePass, module_opcodes
from hlopt.passes.framework.registry import register

__all__ = [
    "WhileLoopAllReduceCodeMotion", "ReplicationAnalysis", "DeviceConfig", "device_config", "induction_variable",
    "loop_max_value",
]

_SUPPORTED_TYPES = frozenset({"bf16", "f16", "f32", "f64", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64"})
_VIEW_OPS = frozenset({"bitcast", "reshape", "transpose"})  # change the element mapping, not the values
ZERO_LITERAL_MAX_ELEMENTS = 4096  # larger zero buffers are broadcast(constant(0)) (no megabyte literals)
_MAX_MAPPING_ELEMENTS = 1 << 24


# =================================================================== small helpers
def _is_zero(inst: Instruction) -> bool:
    """A scalar zero constant, possibly broadcast (XLA's IsZero)."""
    if inst.opcode == "broadcast":
        return _is_zero(inst.operand(0))
    if inst.opcode != "constant" or inst.shape.is_tuple or inst.shape.rank:
        return False
    try:
        return inst.attrs["literal"].scalar() == 0
    except Exception:  # noqa: BLE001  (an elided or unreadable literal is not a known zero)
        return False


def _effective_scalar(inst: Instruction) -> Instruction | None:
    """The scalar of `broadcast(scalar)`, else None (XLA's GetEffectiveScalar)."""
    if inst.opcode == "broadcast" and not inst.operand(0).shape.is_tuple and inst.operand(0).shape.rank == 0:
        return inst.operand(0)
    return None


def _select_picks(sel: Instruction) -> int | None:
    """The operand (1 or 2) a select with a constant (possibly broadcast) scalar predicate picks everywhere,
    else None. A select that always picks its zero resets the scatter form's buffer every iteration."""
    pred = sel.operand(0)
    if pred.opcode == "broadcast":
        pred = pred.operand(0)
    if pred.opcode != "constant" or pred.shape.is_tuple or pred.shape.rank:
        return None
    try:
        return 1 if bool(pred.attrs["literal"].scalar()) else 2
    except Exception:  # noqa: BLE001  (an unreadable literal is not a known predicate)
        return None


def _gtes(param: Instruction, index: int) -> list[Instruction]:
    return [u for u in param.users if u.opcode == "get-tuple-element" and u.attrs["index"] == index]


def _reads_slot(comp: Computation, index: int) -> bool:
    """Whether `comp` (a while condition) may read tuple slot `index` of its parameter."""
    param = single_parameter(comp)
    if param is None:
        return True
    return any(u.opcode != "get-tuple-element" or u.attrs["index"] == index for u in param.users)


def _zeros(b: Builder, shape: Shape) -> Instruction:
    """A zero buffer: a literal constant when small (as XLA), else broadcast(constant(0))."""
    if shape.numel <= ZERO_LITERAL_MAX_ELEMENTS:
        return b.op("constant", shape=shape, literal=Literal.from_numpy(np.asarray(0), shape))
    zero = b.constant(0, shape.dtype)
    return b.op("broadcast", zero, shape=shape, dimensions=())


def _relay_control_and_remove(comp: Computation, inst: Instruction) -> None:
    """Remove an unused instruction, keeping the ordering its control edges imposed."""
    for p in inst.control_predecessors:
        for s in inst.control_successors:
            p.add_control_successor(s)
    inst.drop_control_dependencies()
    comp.remove(inst)


def _replace_with_operand(comp: Computation, inst: Instruction) -> None:
    """Every use of `inst` reads its operand instead; then `inst` is removed."""
    operand = inst.operand(0)
    inst.replace_all_uses_with(operand)
    if comp.root is inst:
        comp.set_root(operand)
    _relay_control_and_remove(comp, inst)


# =================================================================== loops
def _flat_on_control_flow(module: Module) -> bool:
    """No computation is called from more than one control-flow site (call / while / conditional)."""
    counts: dict[Computation, int] = {}
    for inst in module.instructions():
        if inst.opcode in ("call", "while", "conditional"):
            for c in inst.called_computations:
                counts[c] = counts.get(c, 0) + 1
    return all(n <= 1 for n in counts.values())


# =================================================================== matching
@dataclass
class Accumulation:
    """One place a movable collective is accumulated into loop-carried slot `slot`."""

    instruction: Instruction  # the add (or the scatter)
    buffer: Instruction
    slot: int
    dynamic_slice: Instruction | None = None
    dynamic_update_slice: Instruction | None = None


@dataclass
class UpdateSlice:
    """DUS form: the collective's values fill region offsets+dims of slot `slot`."""

    dims: list[int]
    dtype: str
    offsets: list[int]
    slot: int


@dataclass
class _Origin:
    unsupported: bool = False
    slot: int | None = None
    dynamic_slice: Instruction | None = None
    chain: list[Instruction] = field(default_factory=list)  # from the GTE (exclusive) to the buffer


@dataclass
class _Output:
    unsupported: bool = False
    slot: int | None = None
    returned: bool = False
    dynamic_update_slice: Instruction | None = None
    chain: list[Instruction] = field(default_factory=list)  # from the value (exclusive) to the root operand


class _Matcher:
    """XLA's IsAllReduceMovable for the collectives of one while body."""

    def __init__(self, pass_: WhileLoopAllReduceCodeMotion, body: Computation, loops: list[Instruction],
                 replication: CollectiveReplication):
        self.p = pass_
        self.body = body
        self.loops = loops
        self.param = single_parameter(body)
        self.rep = replication

    # ---------------------------------------------------------------- entry point
    def movable(self, ar: Instruction) -> list[Accumulation] | UpdateSlice | None:
        """The accumulations (or DUS region) of `ar` if it can move, else None; [] for a dead `ar` (XLA
        finds it movable with no accumulations and removes it, side effect or not)."""
        if self.param is None or ar.shape.is_tuple or ar.operand_count != 1:
            return None
        kind = reduction_kind(ar.attrs.get("to_apply"))
        if kind is None:
            return None
        if ar.opcode == "all-reduce":
            dus = self._update_slice(ar, kind)
            if dus is not None:
                return dus
        if ar.shape.dtype not in _SUPPORTED_TYPES or kind != "SUM":
            return None
        scatter = self._scatter(ar)
        if scatter is not None:
            return scatter or None
        if not ar.users:
            return []  # XLA: a dead collective is movable with no accumulations, and goes (even with a side effect)
        accs = self._accumulations(ar)
        if accs is None or not accs or self._buffer_used(accs, ar) or not self._slots_ok(accs):
            return None
        return accs

    # ---------------------------------------------------------------- replication
    def _replicated(self, inst: Instruction, ar: Instruction) -> bool:
        return self.rep.within_groups(inst, ar)

    # ---------------------------------------------------------------- buffer side
    def _origin(self, inst: Instruction, rs: bool) -> _Origin:
        res = _Origin()
        chain: list[Instruction] = []
        while True:
            op = inst.opcode
            if op in ("bitcast", "convert", "reshape", "transpose") and not rs:
                chain.append(inst)
                inst = inst.operand(0)
            elif op == "get-tuple-element" and res.slot is None:
                res.slot = inst.attrs["index"]
                inst = inst.operand(0)
            elif op == "dynamic-slice" and not rs and res.dynamic_slice is None:
                res.dynamic_slice = inst
                chain.append(inst)
                inst = inst.operand(0)
            elif op == "parameter":
                break
            else:
                res.unsupported = True
                return res
        res.unsupported = inst is not self.param or res.slot is None
        res.chain = list(reversed(chain))
        return res

    def _output(self, start: Instruction, rs: bool) -> _Output:
        res = _Output()
        parent: dict[Instruction, Instruction] = {}
        stack = [start]
        root = self.body.root
        while stack and not res.unsupported:
            x = stack.pop()
            for user in x.users:
                op = user.opcode
                if op in ("bitcast", "convert", "reshape", "get-tuple-element", "transpose", "slice"):
                    if rs:
                        res.unsupported = True
                    else:
                        parent[user] = x
                        stack.append(user)
                elif op == "dynamic-update-slice":
                    if res.dynamic_update_slice is not None or rs:
                        res.unsupported = True
                    else:
                        res.dynamic_update_slice = user
                        parent[user] = x
                        stack.append(user)
                elif op == "tuple" and user is root and res.slot is None:
                    if list(root.operands).count(x) != 1:  # returned at two slots: refused (XLA takes the first)
                        res.unsupported = True
                    res.slot = root.operands.index(x)
                    res.returned = True
                    chain = [x]
                    while chain[-1] in parent:
                        chain.append(parent[chain[-1]])
                    res.chain = list(reversed(chain))[1:]
                else:
                    res.unsupported = True
                if res.unsupported:
                    break
        return res

    # ---------------------------------------------------------------- accumulation DFS
    def _accumulations(self, ar: Instruction) -> list[Accumulation] | None:  # noqa: C901
        rs = ar.opcode == "reduce-scatter"
        kind = "SUM"
        found: list[Accumulation] = []
        stack = [ar]
        while stack:
            x = stack.pop()
            for user in x.users:
                op = user.opcode
                if op == "convert":
                    if rs or not convert_commutes(x.shape.dtype, user.shape.dtype, kind):
                        return None  # hlopt: float->int breaks the sum; reduce-scatter cannot widen it
                    stack.append(user)
                elif op in ("bitcast", "reshape", "get-tuple-element", "transpose", "slice", "broadcast"):
                    if rs:
                        return None
                    stack.append(user)
                elif op == "select":
                    if not self._select_ok(user, x, ar, rs):
                        return None
                    stack.append(user)
                elif op == "multiply":
                    if rs or not self._scaled_ok(user, x, ar):
                        return None
                    stack.append(user)
                elif op == "add":
                    acc = self._accumulation(user, x, ar)
                    if acc is None:
                        return None
                    found.append(acc)
                else:
                    return None
        return found

    def _select_ok(self, sel: Instruction, x: Instruction, ar: Instruction, rs: bool) -> bool:
        ops = sel.operands
        ok = (ops[1] is x and ops[2] is not x and _is_zero(ops[2])) or \
             (ops[2] is x and ops[1] is not x and _is_zero(ops[1]))
        if not ok:
            return False
        pred = ops[0]
        if rs:
            scalar = _effective_scalar(pred)
            if scalar is None or x is not ar or any(u.opcode == "select" for u in sel.users):
                return False  # XLA widens only a single select directly on the reduce-scatter
            return self._replicated(scalar, ar)
        return self._replicated(pred, ar)  # hlopt: a device-dependent predicate changes the moved sum

    def _scaled_ok(self, mul: Instruction, x: Instruction, ar: Instruction) -> bool:
        other = mul.operand(1) if mul.operand(0) is x else mul.operand(0)
        if other is x:
            return False
        unwrapped, through_broadcast = other, False
        while unwrapped.opcode in ("broadcast", "convert"):
            through_broadcast |= unwrapped.opcode == "broadcast"
            unwrapped = unwrapped.operand(0)
        if unwrapped.opcode != "all-reduce":
            return False
        if not ar.shape.rank:  # the scalar side of a scaling factor stays in the body
            return False
        if not (through_broadcast and not unwrapped.shape.is_tuple and unwrapped.shape.rank == 0):
            return False
        return self._replicated(other, ar)  # hlopt: the factor must be equal on every member of the group

    def _accumulation(self, add: Instruction, x: Instruction, ar: Instruction) -> Accumulation | None:
        rs = ar.opcode == "reduce-scatter"
        buffer = add.operand(1) if add.operand(0) is x else add.operand(0)
        if buffer is x:
            return None
        origin = self._origin(buffer, rs)
        if origin.unsupported:
            return None
        out = self._output(add, rs)
        if out.unsupported or not out.returned or out.slot != origin.slot:
            return None
        ds, dus = origin.dynamic_slice, out.dynamic_update_slice
        if (ds is None) != (dus is None):
            return None
        if ds is not None and not self._ds_dus_ok(ds, dus, add, origin, out, ar):
            return None
        if ds is None and not _maps_identity(origin.chain, out.chain, buffer, add):
            return None
        return Accumulation(add, buffer, origin.slot, ds, dus)

    def _ds_dus_ok(self, ds: Instruction, dus: Instruction, add: Instruction, origin: _Origin,
                   out: _Output, ar: Instruction) -> bool:
        if ds.operand_count + 1 != dus.operand_count:
            return False
        if any(ds.operand(i) is not dus.operand(i + 1) for i in range(1, ds.operand_count)):
            return False
        if any(not self._replicated(dus.operand(i), ar) for i in range(2, dus.operand_count)):
            return False
        # hlopt: only converts beside the DS/DUS, the DUS updates the slot's own GTE with the sum
        if any(i.opcode != "convert" for i in origin.chain if i is not ds):
            return False
        if any(i.opcode != "convert" for i in out.chain if i is not dus):
            return False
        base = dus.operand(0)
        while base.opcode == "convert":
            base = base.operand(0)
        upd = dus.operand(1)
        while upd.opcode == "convert" and upd is not add:
            upd = upd.operand(0)
        src = ds.operand(0)
        while src.opcode == "convert":
            src = src.operand(0)
        return upd is add and base is src and base.opcode == "get-tuple-element"

    # ---------------------------------------------------------------- buffer use
    def _buffer_used(self, accs: list[Accumulation], ar: Instruction) -> bool:
        rs = ar.opcode == "reduce-scatter"
        if any(u.opcode != "get-tuple-element" for u in self.param.users):
            return True
        for acc in accs:
            stack = list(_gtes(self.param, acc.slot))
            while stack:
                x = stack.pop()
                for user in x.users:
                    op = user.opcode
                    if op in ("bitcast", "convert", "reshape", "transpose"):
                        if rs:
                            return True
                        stack.append(user)
                    elif op == "select":
                        i = user.operands.index(x)
                        zero_other = (i == 1 and _is_zero(user.operand(2))) or (i == 2 and _is_zero(user.operand(1)))
                        if rs or not zero_other or not self._replicated(user.operand(0), ar):
                            return True
                        stack.append(user)
                    elif op in ("add", "scatter"):
                        if user is not acc.instruction:
                            return True
                    elif op == "dynamic-slice":
                        if user is not acc.dynamic_slice:
                            return True
                    elif op == "dynamic-update-slice":
                        if user is not acc.dynamic_update_slice:
                            return True
                    else:
                        return True
        return False

    def _slots_ok(self, accs: list[Accumulation]) -> bool:
        """hlopt: no loop condition reads an accumulator (XLA leaves this as a TODO)."""
        return not any(_reads_slot(loop.attrs["condition"], acc.slot) for acc in accs for loop in self.loops)

    # ---------------------------------------------------------------- scatter form
    def _scatter(self, ar: Instruction) -> list[Accumulation] | None:
        """XLA's scatter form: [] when it matches but may not move, the accumulation when it may, None when
        it does not match (then the ordinary forms are tried)."""
        x = ar.operand(0)
        while x.opcode in ("convert", "bitcast", "reshape", "transpose", "slice"):
            x = x.operand(0)
        if x.opcode != "scatter" or x.operand_count != 3:
            return None
        scatter, base = x, x.operand(0)
        resets = False
        while base.opcode == "select":
            z1, z2 = _is_zero(base.operand(1)), _is_zero(base.operand(2))
            if z1 and not z2:
                resets |= _select_picks(base) == 1
                base = base.operand(2)
            elif z2 and not z1:
                resets |= _select_picks(base) == 2
                base = base.operand(1)
            else:
                return None
        origin = self._origin(base, False)
        out = self._output(ar, False)
        if origin.unsupported or out.unsupported or not out.returned or origin.slot != out.slot:
            return None
        exact = resets and origin.dynamic_slice is None and self._zero_initialised(origin.slot)
        if not (self.p.unsafe_scatter_motion or exact):
            return []  # hlopt: N * buffer + updates != buffer + all updates; see the notes
        acc = Accumulation(scatter, base, origin.slot, origin.dynamic_slice, None)
        if self._buffer_used([acc], ar) or not self._slots_ok([acc]):
            return []
        return [acc]

    def _zero_initialised(self, slot: int) -> bool:
        """Every calling loop starts slot `slot` from a known zero."""
        return all(loop.operand(0).opcode == "tuple" and _is_zero(loop.operand(0).operand(slot))
                   for loop in self.loops)

    # ---------------------------------------------------------------- DUS form
    def _update_slice(self, ar: Instruction, kind: str) -> UpdateSlice | None:  # noqa: C901
        bound = self._common_bound()
        if bound is None:
            return None
        k_ivar, last = bound
        if (last + 1) * ar.shape.byte_size > self.p.dus_max_size_bytes:
            return None
        chain = self._sliced_user_path(ar)
        if chain is None:
            return None
        dims, dtype = list(ar.shape.dims), ar.shape.dtype
        prev_dtype = ar.shape.dtype
        for inst in chain[:-1]:
            if inst.opcode == "reshape":
                dims = list(inst.shape.dims)
            else:
                if not convert_commutes(prev_dtype, inst.shape.dtype, kind):
                    return None
                dtype = inst.shape.dtype
            prev_dtype = inst.shape.dtype
        prev = chain[-2] if len(chain) > 1 else ar
        hlo = chain[-1]
        offsets: list[int] | None = None
        duses: list[Instruction] = []
        while hlo.opcode == "dynamic-update-slice":
            if hlo.operand_count < 2 or hlo.operand(1) is not prev:
                return None
            rank = hlo.shape.rank
            if hlo.operand_count != 2 + rank:
                return None
            offsets = offsets or [0] * rank
            if len(offsets) != rank:
                return None
            for i in range(rank):
                idx = hlo.operand(2 + i)
                c = scalar_int_constant(idx)
                if idx.opcode == "constant" and c is not None:
                    offsets[i] += c
                elif self._is_ivar(idx, k_ivar, last) and hlo.operand(1).shape.dims[i] == 1:
                    dims[i] = last + 1
                else:
                    return None
            if hlo.user_count != 1:
                return None
            duses.append(hlo)
            prev, hlo = hlo, hlo.users[0]
        if not duses or hlo is not self.body.root or offsets is None:
            return None
        if not self._update_slice_sound(duses, k_ivar, last, offsets, dims):
            return None
        return self._dus_slot(prev, hlo, dims, dtype, offsets)

    def _dus_slot(self, dus: Instruction, root: Instruction, dims: list[int], dtype: str,
                  offsets: list[int]) -> UpdateSlice | None:
        gte = dus.operand(0)
        if gte.opcode != "get-tuple-element" or gte.operand(0) is not self.param:
            return None
        k = gte.attrs["index"]
        if [i for i, o in enumerate(root.operands) if o is dus] != [k]:
            return None
        if gte.user_count != 1 or len(_gtes(self.param, k)) != 1:
            return None
        if any(_reads_slot(loop.attrs["condition"], k) for loop in self.loops):
            return None
        return UpdateSlice(dims, dtype, offsets, k)

    def _update_slice_sound(self, duses: list[Instruction], k: int, last: int, offsets: list[int],
                            dims: list[int]) -> bool:
        """hlopt: the induction variable indexes only the DUS into the loop buffer, in one dimension, and no
        DUS would be clamped (else earlier values are overwritten or the region leaves the buffer)."""
        ivar_dims = 0
        for j, dus in enumerate(duses):
            upd_dims = dus.operand(1).shape.dims
            for i in range(dus.shape.rank):
                idx = dus.operand(2 + i)
                c = scalar_int_constant(idx)
                if idx.opcode == "constant" and c is not None:
                    if c < 0 or c + upd_dims[i] > dus.shape.dims[i]:
                        return False
                else:
                    if j != len(duses) - 1 or last + 1 > dus.shape.dims[i]:
                        return False
                    ivar_dims += 1
        buf = duses[-1].shape.dims
        in_bounds = all(0 <= o and o + d <= b for o, d, b in zip(offsets, dims, buf, strict=True))
        return ivar_dims <= 1 and in_bounds

    def _sliced_user_path(self, ar: Instruction) -> list[Instruction] | None:
        """reshape/convert users (one each) from `ar` to a dynamic-update-slice, that DUS last
        (XLA's GetSlicedUserPaths with reshape/convert as no-ops)."""
        if ar.user_count != 1:
            return None
        path = []
        cur = ar.users[0]
        while True:
            path.append(cur)
            if cur.opcode == "dynamic-update-slice":
                return path
            if cur.user_count != 1 or cur.opcode not in ("reshape", "convert"):
                return None
            cur = cur.users[0]

    def _is_ivar(self, inst: Instruction, k: int, last: int) -> bool:
        """`i` or `last - i` (XLA matches these after its simplifier folded the index; hlopt reads the
        index as an affine function of `i`, so `(N - i) - 1` from a reversed scan counts too)."""
        return is_induction_variable(inst, self.param, k, last)

    def _common_bound(self) -> tuple[int, int] | None:
        k = last = None
        for loop in self.loops:
            idx = induction_variable(loop)
            if idx is None or (k is not None and idx != k):
                return None
            m = loop_max_value(loop, idx)
            if m is None or (last is not None and m != last):
                return None
            k, last = idx, m
        return (k, last) if k is not None else None


def _maps_identity(origin: list[Instruction], output: list[Instruction], buffer: Instruction,
                   add: Instruction) -> bool:
    """hlopt: the view ops from the slot to the add and from the add back to the slot compose to the
    identity (else the loop permutes its carried value and the moved sum would land on the wrong elements)."""
    ops = [i for i in origin + [add] + output if i.opcode in _VIEW_OPS or i.opcode == "slice"]
    if not ops:
        return True
    if any(i.opcode == "slice" for i in ops):
        return False
    start = origin[0].operand(0) if origin else buffer
    shape = start.shape
    if shape.is_tuple or shape.numel > _MAX_MAPPING_ELEMENTS:
        return False
    ids = np.arange(shape.numel).reshape(shape.dims)
    cur = ids
    cur_shape = shape
    for inst in origin + output:
        if inst.opcode == "transpose":
            cur = np.transpose(cur, inst.attrs["dimensions"])
        elif inst.opcode == "reshape":
            cur = cur.reshape(inst.shape.dims)
        elif inst.opcode == "bitcast":
            cur = _bitcast(cur, cur_shape, inst.shape)
        cur_shape = inst.shape
    return cur.shape == ids.shape and bool(np.array_equal(cur, ids))


def _physical_perm(shape: Shape) -> tuple[int, ...]:
    layout = shape.layout or default_layout(shape.rank)
    return tuple(reversed(layout.minor_to_major)) if layout.minor_to_major else tuple(range(shape.rank))


def _bitcast(arr: np.ndarray, src: Shape, dst: Shape) -> np.ndarray:
    flat = np.transpose(arr, _physical_perm(src)).reshape(-1)
    perm = _physical_perm(dst)
    phys = flat.reshape([dst.dims[p] for p in perm])
    return np.transpose(phys, np.argsort(perm))


# =================================================================== rewriting
def _init_elements(b: Builder, loop: Instruction) -> list[Instruction]:
    init = loop.operand(0)
    if init.opcode == "tuple":
        return list(init.operands)
    return [b.get_tuple_element(init, i) for i in range(len(init.shape.elements))]


def _replace_loop_result(loop: Instruction, old_users: list[Instruction], elements: list[Instruction],
                         after: Builder) -> None:
    """A tuple of `elements` stands for the loop's result for `old_users`; their GTEs read the elements."""
    comp = loop.parent
    result = after.tuple(*elements)
    for u in old_users:
        u.replace_use_of(loop, result)
    if comp.root is loop:
        comp.set_root(result)
    for u in list(result.users):
        if u.opcode != "get-tuple-element" or u.parent is not comp:
            continue
        elem = elements[u.attrs["index"]]
        u.copy_control_dependencies_to(elem) if (u.control_predecessors or u.control_successors) else None
        u.replace_all_uses_with(elem)
        if comp.root is u:
            comp.set_root(elem)
        u.drop_control_dependencies()
        comp.remove(u)
    if not result.user_count and comp.root is not result:
        comp.remove(result)
        for elem in dict.fromkeys(elements):  # XLA removes the tuple with its unused operands
            if (elem.opcode == "get-tuple-element" and elem.operand(0) is loop and not elem.user_count
                    and comp.root is not elem and not elem.control_successors):
                comp.remove(elem)


class _ChannelIds:
    """Channel ids for the moved collectives of the accumulation form.

    `unique` (the default): every moved collective takes an id no instruction uses (the module's largest id
    plus one, then the next), as the pass in jaxlib 0.10.2's XLA:GPU does (after it, two gradients psum'ed with
    channel_id=1 leave the loop as channel_id=2 and channel_id=3). Otherwise the id of XLA's source and unit
    tests: the loop collective's own (or XLA's default 1) on every copy; collectives sharing an id must share a
    layout (XLA's layout assignment fails otherwise), so hlopt then takes unused ids where shapes differ."""

    def __init__(self, module: Module, default: bool, unique: bool = True):
        ids = [i.get("channel_id") for i in module.instructions()]
        self._next = max([i for i in ids if isinstance(i, int)], default=0) + 1
        self.default = default
        self.unique = unique
        self._shape_of: dict[tuple[Instruction, int], Any] = {}

    def fresh(self) -> int:
        """An id no instruction uses."""
        self._next += 1
        return self._next - 1

    def for_copy(self, old: Instruction, shape: Shape) -> int | None:
        """The id of one moved copy of `old` (None: no channel)."""
        cid = old.get("channel_id")
        if not isinstance(cid, int) and not self.default:
            return None
        if self.unique:
            return self.fresh()
        if not isinstance(cid, int):
            if (old, -1) not in self._shape_of:
                self._shape_of[(old, -1)] = (self.fresh(), shape)
            cid, first_shape = self._shape_of[(old, -1)]
        else:
            first_shape = self._shape_of.setdefault((old, cid), (cid, shape))[1]
        if first_shape.dims != shape.dims or first_shape.dtype != shape.dtype:
            return self.fresh()
        return cid


def _new_collective(after: Builder, old: Instruction, operand: Instruction, shape: Shape,
                    channels: _ChannelIds) -> Instruction:
    attrs = dict(old.attrs)
    cid = channels.for_copy(old, shape)
    if cid is not None:
        attrs = {"channel_id": cid, **{k: v for k, v in attrs.items() if k != "channel_id"}}
    if "metadata" in attrs and hasattr(attrs["metadata"], "copy"):
        attrs["metadata"] = attrs["metadata"].copy()
    if isinstance(attrs.get("frontend_attributes"), dict):
        attrs["frontend_attributes"] = dict(attrs["frontend_attributes"])
    return after.op(old.opcode, operand, shape=shape, **attrs)


def _hoist_update_slices(loop: Instruction, contexts: dict[Instruction, UpdateSlice]) -> None:
    """DUS form for one while: after it, all-reduce each written region once."""
    comp = loop.parent
    old_users = list(loop.users)
    after = Builder(comp, after=loop)
    constants: dict[int, Instruction] = {}
    new_values: dict[int, Instruction] = {}
    for ar, ctx in contexts.items():
        gte = after.get_tuple_element(loop, ctx.slot)
        operand = gte
        limits = [o + d for o, d in zip(ctx.offsets, ctx.dims, strict=True)]
        if any(o != 0 for o in ctx.offsets) or list(limits) != list(gte.shape.dims):
            operand = after.slice(gte, ctx.offsets, limits)
        if operand.shape.dtype != ar.shape.dtype:
            operand = after.convert(operand, ar.shape.dtype)
        moved = after.insert(ar.clone(name=comp.module.unique_name(ar.opcode), operands=[operand]))
        moved.set_shape(operand.shape)
        update = moved
        if update.shape.dtype != gte.shape.dtype:
            update = after.convert(update, gte.shape.dtype)
        if tuple(update.shape.dims) != tuple(gte.shape.dims) or update.shape.dtype != gte.shape.dtype:
            idx = []
            for off in ctx.offsets:
                if off not in constants:
                    constants[off] = after.constant(off, "s64")
                idx.append(constants[off])
            update = after.dynamic_update_slice(gte, update, *idx)
        new_values[ctx.slot] = update
    elements = [new_values.get(i) or after.get_tuple_element(loop, i) for i in range(len(loop.shape.elements))]
    _replace_loop_result(loop, old_users, elements, after)


def _widen_reduce_scatter(body: Computation, conds: list[Computation], rs: Instruction,
                          accs: list[Accumulation]) -> None:
    """The reduce-scatter's accumulators take its operand's (pre-scatter) shape inside the loop."""
    wide = rs.operand(0).shape
    param = single_parameter(body)
    zeros: Instruction | None = None
    for acc in accs:
        k = acc.slot
        elems = list(param.shape.elements)
        elems[k] = wide
        param.set_shape(TupleShape(tuple(elems)))
        for gte in _gtes(param, k):
            gte.set_shape(wide)
            for u in gte.users:
                u.set_shape(wide)
    for user in list(rs.users):
        if user.opcode != "select":
            continue
        b = Builder(body, before=user)
        if zeros is None:
            zeros = _zeros(b, wide)
        pred = b.op("broadcast", _effective_scalar(user.operand(0)), shape=wide.with_dtype("pred"), dimensions=())
        i = user.operands.index(rs)
        ops = [pred, rs.operand(0), zeros] if i == 1 else [pred, zeros, rs.operand(0)]
        user.replace_operands(ops)
        user.set_shape(wide)
    body.root.set_shape(TupleShape(tuple(o.shape for o in body.root.operands)))
    for cond in conds:
        cparam = single_parameter(cond)
        if cparam is not None:
            cparam.set_shape(param.shape)


def _hoist_accumulations(loop: Instruction, contexts: dict[Instruction, list[Accumulation]],
                         channels: _ChannelIds) -> None:
    """Accumulation form for one while: zero-initialised slots, one collective per slot after the loop."""
    comp = loop.parent
    old_users = list(loop.users)
    before = Builder(comp, before=loop)
    elements = _init_elements(before, loop)
    old_buffers: dict[int, Instruction] = {}
    loop_shapes = list(loop.shape.elements)
    for ar, accs in contexts.items():
        for acc in accs:
            old = elements[acc.slot]
            shape = loop_shapes[acc.slot] if ar.opcode == "all-reduce" else ar.operand(0).shape
            loop_shapes[acc.slot] = shape
            old_buffers[acc.slot] = old
            elements[acc.slot] = _zeros(before, shape)
    old_init = loop.operand(0)
    loop.replace_operands([before.tuple(*elements)])
    loop.set_shape(TupleShape(tuple(loop_shapes)))
    after = Builder(comp, after=loop)
    new_values: dict[int, Instruction] = {}
    for ar, accs in contexts.items():
        for acc in accs:
            gte = after.get_tuple_element(loop, acc.slot)
            operand = gte if gte.shape.dtype == ar.shape.dtype else after.convert(gte, ar.shape.dtype)
            shape = operand.shape if ar.opcode == "all-reduce" else ar.shape
            delta = _new_collective(after, ar, operand, shape, channels)
            old = old_buffers[acc.slot]
            if delta.shape.dtype != old.shape.dtype:
                delta = after.convert(delta, old.shape.dtype)
            new_values[acc.slot] = after.op("add", old, delta, shape=delta.shape)
    out = [new_values.get(i) or after.get_tuple_element(loop, i) for i in range(len(loop.shape.elements))]
    _replace_loop_result(loop, old_users, out, after)
    if old_init.parent is comp and not old_init.user_count and old_init is not comp.root:
        comp.remove_dead(old_init)


# =================================================================== the pass
@register
@dataclass(frozen=True)
class WhileLoopAllReduceCodeMotion(ModulePass):
    """Move all-reduces (and, optionally, reduce-scatters) whose results a while loop only accumulates
    or stores per iteration out of the loop (XLA's WhileLoopAllReduceCodeMotion; module docstring).

    Options as XLA's constructor: `enable_reduce_scatter`, `run_setup_passes`, `require_flat_control_flow`;
    `dus_max_size_bytes` is XLA's debug option `xla_while_loop_all_reduce_dus_code_motion_max_size_bytes`;
    `unsafe_scatter_motion` also moves XLA's scatter form, which changes results when a group has more than
    one member (see docs/notes/while-loop-all-reduce-code-motion.md); without it hlopt moves the scatter form
    only where it is exact: a select with a constant predicate resets the buffer to zero every iteration and
    every loop starts the buffer from zero.

    `repeat` (hlopt): after a body changed, match its collectives again (with a fresh replication analysis)
    until nothing more moves. XLA runs one round, so of chained all-reduces (`psum(psum(x))`, which jax emits
    for a psum of an already-reduced value) it moves only the last one; with `repeat` the whole chain leaves
    the loop. `repeat=false` is XLA's behaviour exactly.

    `unique_channel_ids`: each collective moved out of an accumulation takes a channel id no instruction uses,
    as jaxlib 0.10.2's XLA:GPU does; false keeps the loop collective's id on the copies (XLA's unit tests of
    later revisions, see `_ChannelIds`). The DUS form keeps the id in both cases (XLA clones the all-reduce).
    """

    name: ClassVar[str] = "while-loop-all-reduce-code-motion"
    enable_reduce_scatter: bool = False
    run_setup_passes: bool = False
    require_flat_control_flow: bool = False
    dus_max_size_bytes: int = 1 << 30
    unsafe_scatter_motion: bool = False
    repeat: bool = True
    reassociate: bool = True
    unique_channel_ids: bool = True

    def run(self, module: Module) -> bool:
        if "while" not in module_opcodes(module):
            return False  # no loop: nothing to move (the setup rewrites, too, look only at loop bodies)
        if self.require_flat_control_flow and not _flat_on_control_flow(module):
            return False
        devices = device_config(module)
        if devices.partitions > 1 and not devices.spmd:
            return False  # MPMD: channel ids may pair collectives across programs
        changed = False
        if self.run_setup_passes:
            if self.enable_reduce_scatter:
                changed |= ReorderReduceTranspose().run(module)
            changed |= ReorderConvertReduceAdd(enable_reduce_scatter=self.enable_reduce_scatter).run(module)
        replication = CollectiveReplication(module, devices)
        channels = _ChannelIds(module, default=devices.partitions == 1, unique=self.unique_channel_ids)
        whiles: dict[Computation, list[Instruction]] = {}
        for inst in module.instructions():
            if inst.opcode == "while" and inst.shape.is_tuple and isinstance(inst.attrs.get("body"), Computation):
                whiles.setdefault(inst.attrs["body"], []).append(inst)
        for comp in module.computations_post_order():
            loops = whiles.get(comp, [])
            if not loops:
                continue
            result = self._run_on_body(comp, loops, replication, channels)
            if result is None:
                return changed  # constrain_layout: XLA stops here
            changed |= result
            while result and self.repeat:
                replication = CollectiveReplication(module, devices)  # the moved values changed replication
                result = self._run_on_body(comp, loops, replication, channels)
                changed |= bool(result)
            if changed:
                replication = CollectiveReplication(module, devices)
        return changed

    def _candidates(self, body: Computation) -> list[Instruction] | None:
        out = []
        for inst in body.post_order():
            if inst.opcode == "all-reduce" or (self.enable_reduce_scatter and inst.opcode == "reduce-scatter"):
                if inst.get("constrain_layout") is True:
                    return None
                out.append(inst)
        return out

    def _run_on_body(self, body: Computation, loops: list[Instruction], replication: CollectiveReplication,
                     channels: _ChannelIds) -> bool | None:
        candidates = self._candidates(body)
        if candidates is None:
            return None
        reassociated = self.reassociate and reassociate_all_reduces(body)
        if reassociated:
            candidates = self._candidates(body)
            replication = CollectiveReplication(body.module, replication.devices)  # op(x, y) is not reduced
        matcher = _Matcher(self, body, loops, replication)
        slices: dict[Instruction, UpdateSlice] = {}
        accumulations: dict[Instruction, list[Accumulation]] = {}
        dead: list[Instruction] = []  # no users: removed, as XLA's ReplaceInstruction removes them
        for ar in candidates:
            found = matcher.movable(ar)
            if isinstance(found, UpdateSlice):
                slices[ar] = found
            elif found:
                accumulations[ar] = found
            elif found is not None:
                dead.append(ar)
        if slices:
            for loop in loops:
                _hoist_update_slices(loop, slices)
            for ar in slices:
                _replace_with_operand(body, ar)
        if accumulations:
            conds = list({loop.attrs["condition"]: None for loop in loops})
            for ar, accs in accumulations.items():
                if ar.opcode == "reduce-scatter":
                    _widen_reduce_scatter(body, conds, ar, accs)
            for loop in loops:
                _hoist_accumulations(loop, accumulations, channels)
            for ar in accumulations:
                _replace_with_operand(body, ar)
        for ar in dead:
            body.remove_with_unused_operands(ar)
        return bool(slices or accumulations or dead or reassociated)
