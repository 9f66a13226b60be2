"""collective-pipeliner: move a loop's collectives across iterations (XLA's CollectivePipeliner).

A scanned layer stack all-gathers each layer's weights right before the layer's first matmul, and reduce-
scatters (or all-reduces) each layer's gradient right after it is computed: inside one iteration nothing can
overlap them. Pipelining moves them into the neighbouring iteration, where they overlap a whole layer.

Forward (all-reduce / reduce-scatter results stored by dynamic-update-slice into a loop-carried buffer):
the first iteration is peeled before the loop without its collective; each iteration then reduces and stores
the previous iteration's value while computing its own; after the loop the last value is reduced and stored.

    %body (p: (s32[], f32[4,8], f32[4,2])) {                     # before
      %i = s32[] get-tuple-element(%p), index=0
      %g = f32[8] ...compute(%i)...
      %rs = f32[2] reduce-scatter(%g), dimensions={0}, ...
      %r = f32[1,2] reshape(%rs)
      %dus = f32[4,2] dynamic-update-slice(%buf, %r, %i, %zero)
      ROOT %t = tuple(%i1, ..., %dus)
    }

    %peeled_g = f32[8] ...compute(0)...                          # after: iteration 0, no collective
    %w = while(tuple(1, ..., %buf0, /*index*/ 0, /*value*/ %peeled_g))
    %body: %rs = reduce-scatter(gte(p, value)); %r = reshape(%rs)
           %dus = dynamic-update-slice(%buf, %r, gte(p, index), %zero)   # the previous iteration's store
           %g = ...compute(%i)...                                         # overlaps the reduce-scatter
           ROOT tuple(%i1, ..., %dus, %i, %g)
    %last = dynamic-update-slice(gte(w, buf), reshape(reduce-scatter(gte(w, value))), gte(w, index), 0)

Backward (all-gathers whose operands are loop-invariant slices read through dynamic-slice at the induction
variable: the prefetch): the next iteration's all-gather is computed in the current one; the loop runs one
iteration less; the first all-gather runs before the loop and the last iteration is peeled after it.

    %body: %ds = dynamic-slice(%w_stack, %i, ...); %ag = all-gather(reshape(%ds)); %y = dot(%x, %ag)  # before

    %ag0 = all-gather(reshape(dynamic-slice(%w_stack, 0, ...)))                                     # after
    %w = while(tuple(0, ..., %ag0)), condition: i < N-1
    %body: %y = dot(%x, gte(p, ag)); %ag_next = all-gather(reshape(dynamic-slice(%w_stack, %i + 1, ...)))
           ROOT tuple(%i + 1, ..., %ag_next)
    ...the body once more after the loop, with gte(w, ag) for the all-gather...

Forward-sink: collectives (all-reduce, reduce-scatter, all-gather, all-to-all, collective-permute) whose
per-iteration results, through formatting ops, fill buffers of trip-count slices (one per iteration, at an
index the loop's range proves covers each slice once) leave the loop entirely: the loop stacks the collectives'
operands and the loop-variant operands of the formatting ops (loop-invariant ones are carried once, constants
copied), and after the loop the collectives and the formatting run once on the stacks, each op with the stack
dimension in front (elementwise ops with `pipeline_use_tree`, broadcast, reduce, slice, dynamic-slice, pad,
transpose, reshape, convert, collectives; XLA's TransformLoopForwardSink). Collectives sharing a store (or a
formatting op) are sunk together; rounds repeat until nothing changes, as XLA runs them.

Store indices (forward and forward-sink) must be affine in the induction variable as XLA's range analysis
proves it: jax's wrap-around of a negative index, `select(i < 0, i + N, i)`, is `i` in a loop whose `i` never
goes below 0 (`loop_index_affine`).

Multi-level runs (`last_run`, `level_to_operate_on`, see the class): a run that is not the last marks what
it moved with custom-calls; a later forward run at the next level pipelines the marked stores one iteration
further; the last run removes the markers. Peeled copies of a collective-permute get their
`_xla_send_recv_validation` rewritten for the iterations they run, as XLA's UpdateSendRecvValidation.

Loops must have a known trip count above one (`hlopt.hlo.analysis.while_loop_analysis`), a tuple state whose
parameter is read only through get-tuple-element, and results read only through get-tuple-element, as XLA
requires. Chains may pass through an optimization barrier (`gte(opt-barrier(tuple(...)))`, what remat
emits): the pipelined value is threaded through the barrier as an extra element, so consumers that were
ordered after the barrier still are. Every copy of a collective gets a fresh channel id.

With `cost_model` set (a device name: `h100`, ...), a collective is pipelined only where hlopt's cost model
says it pays: its time is not already hidden by the independent work of its iteration, and the one
exposed copy before or after the loop costs less than the overlap gained in the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

from annotated_types import Ge
from hlopt.hlo.analysis.while_loop_analysis import (
    LoopRange,
    affine_in_induction_variable,
    induction_variable,
    loop_range,
    scalar_int_constant,
    single_parameter,
)
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import DTYPES
from hlopt.passes.collectives import collective_pipeliner_transform as transform
from hlopt.passes.framework.base import ModulePass, module_opcodes
from hlopt.passes.framework.registry import PassOptionError, register

__all__ = ["CollectivePipeliner", "LoopInfo", "ForwardMove", "BackwardMove", "SinkMove",
           "INSERTED_BY_PREVIOUS_STEP", "SUNK_BY_PREVIOUS_STEP", "marker_level"]

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")
#: XLA's marker custom-calls (CollectivePipeliner::kInsertedByPreviousStep / kSunkByPreviousStep): a run that is
#: not the last one marks what it moved so that a later run (`level_to_operate_on`) can find it again
INSERTED_BY_PREVIOUS_STEP = "InsertedByPreviousStep"
SUNK_BY_PREVIOUS_STEP = "SunkByPreviousStep"

#: Users XLA accepts between a forward-pipelined collective and its dynamic-update-slice
#: (CheckStoreIntoSliceIsCompatible); elementwise ops too with `pipeline_use_tree`.
_FORMATTING = frozenset({
    "slice", "dynamic-slice", "pad", "collective-permute", "convert", "reshape", "all-reduce", "transpose",
    "broadcast", "all-gather", "reduce", "get-tuple-element", "concatenate", "reduce-scatter", "bitcast",
})
_ELEMENTWISE = frozenset({
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs", "exponential", "log",
    "sqrt", "rsqrt", "tanh", "select", "clamp", "and", "or", "xor", "not", "compare", "power", "sign",
    "floor", "ceil", "round-nearest-even", "round-nearest-afz", "logistic", "cosine", "sine",
})
#: Collectives whose stacked form is known: the same collective on the stack, its dimension one further
#: (all-reduce and collective-permute act on every element alike: XLA clones them onto the stack unchanged).
_SINKABLE = frozenset({"all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute"})
SEND_RECV_VALIDATION = transform.SEND_RECV_VALIDATION
#: Formatting a forward-sunk collective may pass through (XLA's list less concatenate, get-tuple-element and
#: reduce-scatter, which XLA cannot give a stack dimension either); elementwise ops with `pipeline_use_tree`.
_SINK_FORMATTING = frozenset({"reshape", "bitcast", "convert", "transpose", "broadcast", "slice", "dynamic-slice",
                              "pad", "all-reduce", "collective-permute", "all-gather"})


@dataclass(frozen=True)
class LoopInfo:
    """A while loop the pipeliner can peel: its induction variable slot and range."""

    loop: Instruction
    body: Computation
    param: Instruction
    iv_slot: int
    range: LoopRange

    @property
    def invariant_slots(self) -> frozenset[int]:
        """Slots the body passes through unchanged (root operand k is gte(param, k))."""
        root = self.body.root
        return frozenset(k for k, op in enumerate(root.operands)
                         if op.opcode == "get-tuple-element" and op.operand(0) is self.param
                         and op.attrs["index"] == k)


@dataclass
class ForwardMove:
    """A collective whose formatted result one dynamic-update-slice stores into loop slot `slot`."""

    collective: Instruction
    formatting: list[Instruction]
    dus: Instruction
    slot: int
    sliced_dim: int
    dependencies: list[Instruction] = field(default_factory=list)
    #: store the unreduced value in the buffer itself (XLA's reuse_pipelined_op_buffer)
    reuse: bool = False


@dataclass
class BackwardMove:
    """An all-gather (or other collective) computed from loop-invariant data and the induction variable."""

    collective: Instruction
    chain: list[Instruction]
    #: (barrier's get-tuple-element, the tuple element it reads) pairs the chain looked through
    barriers: list[tuple[Instruction, Instruction]] = field(default_factory=list)


@dataclass
class SinkMove:
    """Collectives whose results, through formatting ops, fill every slice of one or more loop slots, one
    slice per iteration (a group: collectives sharing a store are sunk together, as XLA merges them)."""

    collectives: list[Instruction]
    #: the ops between the collectives and the stores, in body order
    formatting: list[Instruction]
    #: (dynamic-update-slice, the root slot it fills)
    stores: list[tuple[Instruction, int]]
    #: operands of the formatting ops from outside the chain: how each reaches the code after the loop
    #: (`constant`: copied there; `invariant`: carried once; `stacked`: one slice per iteration)
    dependencies: dict[Instruction, str] = field(default_factory=dict)

    @property
    def index(self) -> Instruction:
        """The stores' index along dimension 0 (the same value for every store of the group)."""
        return self.stores[0][0].operand(2)


# --------------------------------------------------------------------------- loop analysis
def analyze_loop(loop: Instruction) -> LoopInfo | None:
    """The loop's induction variable and range when the pipeliner can peel it (XLA's ComputeLoopStatistics,
    plus the tuple-state requirements of CollectCollectivesToMove); None otherwise."""
    body, cond = loop.attrs.get("body"), loop.attrs.get("condition")
    if not isinstance(body, Computation) or not isinstance(cond, Computation) or not loop.shape.is_tuple:
        return None
    param = single_parameter(body)
    if param is None or body.root is None or body.root.opcode != "tuple" or single_parameter(cond) is None:
        return None
    if any(u.opcode != "get-tuple-element" for u in param.users):
        return None  # the state escapes: a replacement would not reach every reader
    if any(u.opcode != "get-tuple-element" for u in loop.users):
        return None
    if loop.has_control_dependencies or not _validations_readable(body):
        return None
    k = induction_variable(loop)
    if k is None or DTYPES[loop.shape.elements[k].dtype].kind not in ("sint", "uint"):
        return None
    rng = loop_range(loop, k)
    if rng is None or rng.trip_count <= 1:
        return None  # XLA pipelines only loops known to run more than once
    return LoopInfo(loop, body, param, k, rng)


def is_marker(inst: Instruction, target: str) -> bool:
    """Whether `inst` is one of XLA's pipeliner marker custom-calls with custom_call_target `target`."""
    return inst.opcode == "custom-call" and inst.attrs.get("custom_call_target") == target


def marker_level(inst: Instruction) -> int | None:
    """The level an InsertedByPreviousStep marker names (its constant operand 1; XLA's
    GetLevelFromCustomCall); None for anything else."""
    if not is_marker(inst, INSERTED_BY_PREVIOUS_STEP) or inst.operand_count != 2:
        return None
    return scalar_int_constant(inst.operand(1))


def _validations_readable(body: Computation) -> bool:
    """Whether every send/recv validation in the body can be rewritten for the peeled copies (XLA fails the
    pass on one it cannot parse; hlopt leaves such a loop alone)."""
    try:
        for inst in body.instructions:
            transform.send_recv_validation(inst)
    except ValueError:
        return False
    return True


def _processed(inst: Instruction, kinds: tuple[str, ...]) -> bool:
    """Whether the pass processes `inst` (XLA's should_process): its opcode is one of `kinds`, or it is a
    custom-call whose target `kinds` names as `custom-call=TARGET`."""
    if inst.opcode == "custom-call":
        return f"custom-call={inst.attrs.get('custom_call_target')}" in kinds
    return inst.opcode in kinds


def _is_param_slot(inst: Instruction, param: Instruction) -> bool:
    return inst.opcode == "get-tuple-element" and inst.operand(0) is param


def _effective_scalar(inst: Instruction) -> bool:
    return not inst.shape.is_tuple and inst.shape.numel == 1


# --------------------------------------------------------------------------- store indices
_COMPARISONS = {"LT": lambda a, b: a < b, "LE": lambda a, b: a <= b, "GT": lambda a, b: a > b,
                "GE": lambda a, b: a >= b}


def _iv_values(info: LoopInfo) -> tuple[int, int]:
    """The first and the last value the induction variable takes in the body."""
    rng = info.range
    return rng.start, rng.start + (rng.trip_count - 1) * rng.step


def _affine_bounds(affine: tuple[int, int], info: LoopInfo) -> tuple[int, int]:
    """The smallest and the largest value of `scale * i + offset` over the loop's iterations."""
    first, last = _iv_values(info)
    a, b = affine[0] * first + affine[1], affine[0] * last + affine[1]
    return min(a, b), max(a, b)


def _decided(cmp: Instruction, info: LoopInfo) -> bool | None:
    """The value of integer comparison `cmp` when it is the same in every iteration; None otherwise."""
    if cmp.opcode != "compare" or cmp.attrs.get("direction") not in _COMPARISONS:
        return None
    lhs, rhs = (loop_index_affine(cmp.operand(k), info) for k in (0, 1))
    if lhs is None or rhs is None:
        return None
    test = _COMPARISONS[cmp.attrs["direction"]]
    diff = (lhs[0] - rhs[0], lhs[1] - rhs[1])  # lhs - rhs, compared with 0
    low, high = _affine_bounds(diff, info)
    if test(low, 0) and test(high, 0):
        return True
    if not test(low, 0) and not test(high, 0):
        return False
    return None


def loop_index_affine(inst: Instruction, info: LoopInfo) -> tuple[int, int] | None:
    """(scale, offset) when integer scalar `inst` equals `scale * i + offset` in every iteration of the loop (i
    its induction variable), as XLA's range analysis (RecursivelyIdentifyRange) proves it: constants, add,
    subtract, negate, multiply by a constant, copy, integer converts that keep every value, and a select
    whose condition (an integer comparison) is the same in every iteration; jax's wrap-around of a negative
    index, `select(i < 0, i + N, i)`, is `i` in a loop whose `i` never goes below 0."""
    if inst.shape.is_tuple or inst.shape.numel != 1 or DTYPES[inst.shape.dtype].kind not in ("sint", "uint"):
        return None
    if inst.opcode == "select":
        decided = _decided(inst.operand(0), info)
        return None if decided is None else loop_index_affine(inst.operand(1 if decided else 2), info)
    if inst.opcode in ("convert", "copy", "negate"):
        inner = loop_index_affine(inst.operand(0), info)
        if inner is None:
            return None
        if inst.opcode == "negate":
            return (-inner[0], -inner[1])
        if inst.opcode == "convert" and not _fits(_affine_bounds(inner, info), inst.shape.dtype):
            return None
        return inner
    if inst.opcode in ("add", "subtract", "multiply") and inst.operand_count == 2:
        a, b = (loop_index_affine(inst.operand(k), info) for k in (0, 1))
        if a is None or b is None:
            return None
        if inst.opcode == "add":
            return (a[0] + b[0], a[1] + b[1])
        if inst.opcode == "subtract":
            return (a[0] - b[0], a[1] - b[1])
        if a[0] and b[0]:
            return None  # i * i is not affine
        return (a[0] * b[1] + b[0] * a[1], a[1] * b[1])
    return affine_in_induction_variable(inst, info.param, info.iv_slot)


def _fits(bounds: tuple[int, int], dtype: str) -> bool:
    """Whether every integer in `bounds` is a value of integer type `dtype`."""
    t = DTYPES[dtype]
    low, high = (-(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1) if t.kind == "sint" else (0, (1 << t.bits) - 1)
    return low <= bounds[0] and bounds[1] <= high


# --------------------------------------------------------------------------- forward matching
def _sliced_dimension(dus: Instruction) -> int | None:
    """The one dimension a dynamic-update-slice indexes with a non-constant; the others must be constant 0."""
    sliced = None
    for d, idx in enumerate(dus.operands[2:]):
        value = scalar_int_constant(idx)
        if value is None:
            if sliced is not None:
                return None
            sliced = d
        elif value != 0:
            return None
    return sliced


def _buffer_through_barriers(buffer: Instruction, dus: Instruction) -> Instruction | None:
    """The loop slot a store writes into, looking through `gte(opt-barrier(tuple(..., x, ...)))` (remat puts
    the carried buffer through a barrier): each step must be read only by the next one, so that no one
    else in the body reads the buffer (a delayed store would be missing for them); None otherwise."""
    reader = dus
    while True:
        if buffer.users != (reader,):
            return None  # the buffer is read elsewhere in the body: the store cannot be delayed
        if not (buffer.opcode == "get-tuple-element" and buffer.operand(0).opcode == "opt-barrier"
                and buffer.operand(0).operand(0).opcode == "tuple"):
            return buffer
        barrier = buffer.operand(0)
        index = buffer.attrs["index"]
        if sum(1 for g in barrier.users if g.opcode != "get-tuple-element" or g.attrs["index"] == index) != 1:
            return None
        elements = barrier.operand(0)
        if elements.users != (barrier,) or list(elements.operands).count(elements.operand(index)) != 1:
            return None
        reader, buffer = elements, elements.operand(index)


def _output_index(dus: Instruction, root: Instruction) -> int | None:
    """The root slot a store reaches through a chain of single-user dynamic-update-slices (XLA's
    FindOutputIndexForDynamicUpdateSlice); None when it reaches none, or several slots."""
    while dus.opcode == "dynamic-update-slice":
        if dus.user_count != 1:
            return None
        if dus.users[0] is root:
            slots = [k for k, op in enumerate(root.operands) if op is dus]
            return slots[0] if len(slots) == 1 else None
        dus = dus.users[0]
    return None


class _ForwardMatcher:
    """Finds forward (and forward-sink) moves in one loop (XLA's CheckStoreIntoSliceIsCompatible and
    IsSupportedDynamicUpdateSlice). At level 0 the store feeds the body's root; at a level L above 0 it is
    a store whose index an earlier run marked with an InsertedByPreviousStep custom-call of level L."""

    def __init__(self, info: LoopInfo, use_tree: bool, sink: bool, level: int = 0,
                 excludes: tuple[str, ...] = ()):
        self.info = info
        self.excludes = excludes
        self.use_tree = use_tree
        self.sink = sink
        self.level = level
        self.gtes: dict[int, int] = {}
        for u in info.param.users:
            self.gtes[u.attrs["index"]] = self.gtes.get(u.attrs["index"], 0) + 1

    def acceptable(self, inst: Instruction, c: Instruction) -> bool:
        """Whether `inst` may stand between collective `c` and its store (XLA's is_acceptable_user: a
        collective with a channel is accepted whatever its side effect; a custom-call only without one)."""
        if inst.has_control_dependencies or (inst.has_side_effect and inst.opcode not in COLLECTIVES):
            return False
        if inst.opcode in self.excludes:
            return False
        if self.sink:  # XLA: what forward-sink can give a stack dimension
            if inst.opcode == "reduce":
                n = c.operand(0).shape.numel
                return inst.operand_count == 2 and not inst.shape.is_tuple and (inst.shape.numel == n or n < 1024)
            if is_marker(inst, SUNK_BY_PREVIOUS_STEP) or is_marker(inst, INSERTED_BY_PREVIOUS_STEP):
                return True
            return inst.opcode in _SINK_FORMATTING or (self.use_tree and inst.opcode in _ELEMENTWISE)
        if inst.opcode == "custom-call":  # XLA: a custom-call without side effect (markers included)
            return True
        if inst.opcode == "reduce":  # XLA: a reduce that keeps the size, or of a small collective
            n = c.operand(0).shape.numel
            return not inst.shape.is_tuple and (inst.shape.numel == n or n < 1024)
        return inst.opcode in _FORMATTING or (self.use_tree and inst.opcode in _ELEMENTWISE)

    def is_final(self, inst: Instruction) -> bool:
        if inst.opcode != "dynamic-update-slice" or inst.user_count != 1:
            return False
        if self.level == 0:
            return inst.users[0] is self.info.body.root
        return any(marker_level(idx) == self.level for idx in inst.operands[2:])

    def store_chain(self, c: Instruction) -> tuple[list[Instruction], Instruction] | None:
        """(formatting ops in body order, the final dynamic-update-slice) of collective `c`."""
        if (not self.use_tree and c.user_count != 1) or c.operand_count != 1 or c.has_control_dependencies:
            return None
        order = {inst: n for n, inst in enumerate(self.info.body.instructions)}
        formatting: set[Instruction] = set()
        final: Instruction | None = None
        work = [c]
        while work:
            node = work.pop()
            for user in node.users:
                if self.is_final(user):
                    if user.operand(1) is not node or (final is not None and final is not user):
                        return None
                    final = user
                elif self.acceptable(user, c):
                    if user not in formatting:
                        formatting.add(user)
                        work.append(user)
                else:
                    return None
        if final is None:
            return None
        return sorted(formatting, key=order.__getitem__), final

    def dus_slot(self, dus: Instruction) -> tuple[int, int] | None:
        """(slot, sliced dimension) when the store is one XLA pipelines; None otherwise."""
        info = self.info
        sliced = _sliced_dimension(dus)
        if sliced is None:
            return None
        if self.level > 0:  # XLA: the earlier run checked the buffer and the index of this store
            slot = _output_index(dus, info.body.root)
            return None if slot is None else (slot, sliced)
        buffer = _buffer_through_barriers(dus.operand(0), dus)
        if buffer is None or not _is_param_slot(buffer, info.param) or self.gtes.get(buffer.attrs["index"]) != 1:
            return None
        slot = buffer.attrs["index"]
        root = info.body.root
        if [k for k, op in enumerate(root.operands) if op is dus] != [slot]:
            return None  # stored back into another slot: peeling would lose the buffer
        index = dus.operand(2 + sliced)
        affine = loop_index_affine(index, info)
        if affine is None or affine[0] == 0:
            return None  # XLA's CheckIndexIsMonotonic
        return slot, sliced

    def dependencies(self, c: Instruction, formatting: list[Instruction]) -> list[Instruction]:
        """Operands of the formatting ops outside the chain (XLA's CollectDependenciesToPipeline)."""
        inside = {c, *formatting}
        out: list[Instruction] = []
        for op in formatting:
            for x in op.operands:
                if x not in inside:
                    inside.add(x)
                    out.append(x)
        return out


def forward_moves(info: LoopInfo, kinds: tuple[str, ...], use_tree: bool, different_sized: bool,
                  limit: int, reuse_buffer: bool = False, level: int = 0,
                  excludes: tuple[str, ...] = ()) -> list[ForwardMove]:
    """The forward moves of a loop at nesting `level` (XLA's level_to_operate_on), at most `limit`
    (0: no limit), in body post order; `excludes`: opcodes refused as formatting."""
    matcher = _ForwardMatcher(info, use_tree, sink=False, level=level, excludes=excludes)
    moves: list[ForwardMove] = []
    claimed: dict[Instruction, ForwardMove] = {}
    for c in info.body.post_order():
        if not _processed(c, kinds):
            continue
        chain = matcher.store_chain(c)
        if chain is None:
            continue
        formatting, dus = chain
        if dus in claimed:
            continue  # already inside the formatting of an earlier collective (XLA merges it there)
        where = matcher.dus_slot(dus)
        if where is None:
            continue
        deps = matcher.dependencies(c, formatting)
        if not different_sized and (c.operand(0).shape != (formatting[-1].shape if formatting else c.shape)
                                    or any(_effective_scalar(d) for d in deps)):
            continue
        stored, operand = dus.operand(1).shape, c.operand(0).shape
        reuse = reuse_buffer and stored.dims == operand.dims and stored.dtype == operand.dtype
        move = ForwardMove(c, formatting, dus, where[0], where[1], deps, reuse)
        claimed[dus] = move
        moves.append(move)
        if limit and len(moves) >= limit:
            break
    return moves


def _sinkable(c: Instruction) -> bool:
    """Whether the stacked form of collective `c` is known: one array operand; an all-to-all with a split
    dimension; a collective-permute whose pairs run in every iteration (no send/recv validation)."""
    if c.opcode not in _SINKABLE or c.shape.is_tuple or c.operand_count != 1:
        return False
    if c.opcode == "all-to-all" and not c.attrs.get("dimensions"):
        return False
    return not (c.opcode == "collective-permute" and SEND_RECV_VALIDATION in c.frontend_attributes)


def sink_chain(matcher: _ForwardMatcher, c: Instruction) -> tuple[set[Instruction], list[Instruction]] | None:
    """(formatting ops, stores) of collective `c` for forward-sink: every user path ends in a
    dynamic-update-slice feeding the body's root (several stores allowed, XLA's kForwardSink)."""
    if (not matcher.use_tree and c.user_count != 1) or c.operand_count != 1 or c.has_control_dependencies:
        return None
    formatting: set[Instruction] = set()
    stores: list[Instruction] = []
    work = [c]
    while work:
        node = work.pop()
        for user in node.users:
            if matcher.is_final(user):
                if user.operand(1) is not node or user.operand(0) is node:
                    return None
                if user not in stores:
                    stores.append(user)
            elif matcher.acceptable(user, c):
                if user not in formatting:
                    formatting.add(user)
                    work.append(user)
            else:
                return None
    return (formatting, stores) if stores else None


#: operands that stay scalars when a formatting op gets its stack dimension (reduce's init, dynamic-slice's
#: indices, pad's value): they must be constants
def plain_operands(op: Instruction) -> tuple[int, ...]:
    if op.opcode == "reduce":
        return (1,)
    if op.opcode == "pad":
        return (1,)
    if op.opcode == "dynamic-slice":
        return tuple(range(1, op.operand_count))
    return ()


def _lift_broadcasts(formatting: set[Instruction], c: Instruction) -> None:
    """Take the broadcasts the formatting ops read into the formatting (XLA's CollectSimpleDependencies): the
    loop then stacks the broadcast's operand, not its broadcast result."""
    work = list(formatting)
    while work:
        op = work.pop()
        for x in op.operands:
            if (x.opcode == "broadcast" and x not in formatting and x is not c and not transform.from_constants(x)
                    and not x.has_side_effect):
                formatting.add(x)
                work.append(x)


def _sink_dependencies(info: LoopInfo, formatting: list[Instruction], collectives: set[Instruction],
                       invariant: set[Instruction]) -> dict | None:
    """How each operand of the formatting ops (in body order: the order of the loop's new elements) from outside
    the chain reaches the code after the loop; None when one cannot (a non-constant reduce init, dynamic-slice
    index or padding value)."""
    deps: dict[Instruction, str] = {}
    for op in formatting:
        plain = plain_operands(op)
        for k, x in enumerate(op.operands):
            if x in formatting or x in collectives:
                continue
            constant = transform.from_constants(x)
            if k in plain:
                if not constant:
                    return None
                continue
            deps[x] = "constant" if constant else "invariant" if x in invariant else "stacked"
    return deps


def sink_moves(info: LoopInfo, kinds: tuple[str, ...], limit: int, use_tree: bool = False,
               excludes: tuple[str, ...] = ()) -> list[SinkMove]:
    """Forward-sink groups: each store fills dimension 0 of a buffer of trip-count slices, one slice per
    iteration (its index `i - start` or `N-1 - (i - start)` up to the forms XLA's range analysis proves);
    collectives sharing a store are one group (XLA's MergeIntoExistingCollectivesForwardSink)."""
    n = info.range.trip_count
    matcher = _ForwardMatcher(info, use_tree, sink=True, excludes=excludes)
    invariant = _invariant_instructions(info)
    groups: list[SinkMove] = []
    by_store: dict[Instruction, SinkMove] = {}
    body_order = info.body.post_order()
    order = {inst: k for k, inst in enumerate(body_order)}
    for c in body_order:
        if c.opcode not in kinds or not _sinkable(c):
            continue
        found = sink_chain(matcher, c)
        if found is None:
            continue
        formatting, dus_list = found
        stores = []
        for dus in dus_list:
            where = matcher.dus_slot(dus)
            if where is None or where[1] != 0 or dus.shape.dims[0] != n or dus.operand(1).shape.dims[0] != 1:
                break
            affine = loop_index_affine(dus.operand(2), info)
            if affine is None or abs(affine[0]) != 1 or _affine_bounds(affine, info) != (0, n - 1):
                break
            stores.append((dus, where[0]))
        else:
            _lift_broadcasts(formatting, c)
            merged = [g for g in groups
                      if any(by_store.get(d) is g for d, _ in stores) or formatting & set(g.formatting)]
            formatting_all = set(formatting).union(*(g.formatting for g in merged))
            collectives = [x for g in merged for x in g.collectives] + [c]
            collectives = [x for x in dict.fromkeys(collectives) if x not in formatting_all]
            stores = [*(s for g in merged for s in g.stores), *stores]
            stores = list(dict.fromkeys(stores))
            if len({loop_index_affine(d.operand(2), info) for d, _ in stores}) != 1:
                continue  # the stores of a group must fill the same slice in each iteration
            formatting_in_order = sorted(formatting_all, key=order.__getitem__)
            deps = _sink_dependencies(info, formatting_in_order, set(collectives), invariant)
            if deps is None:
                continue
            for g in merged:
                groups.remove(g)
            group = SinkMove(sorted(collectives, key=order.__getitem__), formatting_in_order, stores, deps)
            groups.append(group)
            for d, _ in stores:
                by_store[d] = group
            if limit and len(groups) >= limit:
                break
    return groups


# --------------------------------------------------------------------------- backward matching
def _invariant_instructions(info: LoopInfo) -> set[Instruction]:
    """Body instructions computed only from constants and invariant slots (XLA's ExtractLoopInvariantOps)."""
    slots = info.invariant_slots
    out: set[Instruction] = set()
    for inst in info.body.post_order():
        if inst.has_side_effect or inst.opcode == "parameter":
            continue
        if _is_param_slot(inst, info.param):
            if inst.attrs["index"] in slots:
                out.add(inst)
            continue
        if all(op in out for op in inst.operands):
            out.add(inst)
    return out


def backward_move(info: LoopInfo, c: Instruction, invariant: set[Instruction], add_invariant: bool = True,
                  allow_variant: bool = False) -> BackwardMove | None:
    """The operand chain of `c` when it depends only on invariant slots, constants and the induction
    variable (XLA's CollectIndependentOperandChain), looking through optimization barriers. `add_invariant`
    (XLA's should_add_loop_invariant_op_in_chain, on in XLA:GPU's backward configuration): a loop-invariant
    op of the chain may have users outside it. `allow_variant` (should_allow_loop_variant_parameter_in_chain):
    the chain may read loop-variant slots (the copy computed one iteration early reads their values then)."""
    if c.has_control_dependencies or c.operand_count != 1:
        return None
    slots = info.invariant_slots
    visited: set[Instruction] = {c}
    chain: list[Instruction] = []
    barriers: list[tuple[Instruction, Instruction]] = []
    looked_through: set[Instruction] = set()

    def through_barrier(x: Instruction) -> Instruction:
        while (x.opcode == "get-tuple-element" and x.operand(0).opcode == "opt-barrier"
               and x.operand(0).operand(0).opcode == "tuple"):
            inner = x.operand(0).operand(0).operand(x.attrs["index"])
            barriers.append((x, inner))
            looked_through.add(x.operand(0).operand(0))
            x = inner
        return x

    stack: list[tuple[Instruction, int]] = [(c, 0)]
    while stack:
        node, i = stack.pop()
        if i == node.operand_count:
            if node is not c:
                chain.append(node)
            continue
        stack.append((node, i + 1))
        x = through_barrier(node.operand(i))
        if x.opcode == "parameter":
            continue
        if (_is_param_slot(x, info.param) and x.attrs["index"] != info.iv_slot and x.attrs["index"] not in slots
                and not allow_variant):
            return None  # a loop-variant value: the next iteration's value is not known yet
        if x.has_side_effect or x.opcode in ("recv-done", "send-done", "rng", "while"):
            return None
        if x not in visited:
            visited.add(x)
            stack.append((x, 0))
    for inst in chain:
        extra = [u for u in inst.users if u not in visited and u not in looked_through]
        if extra and not (_effective_scalar(inst) or (add_invariant and inst in invariant)
                          or (_is_param_slot(inst, info.param) and (allow_variant or inst in invariant))):
            return None  # used outside the chain: it would have to be computed twice per iteration
    return BackwardMove(c, chain, barriers)


def backward_moves(info: LoopInfo, kinds: tuple[str, ...], limit: int, add_invariant: bool = True,
                   allow_variant: bool = False) -> list[BackwardMove]:
    """The backward moves of a loop, at most `limit` (0: no limit)."""
    invariant = _invariant_instructions(info)
    moves = []
    for c in info.body.post_order():
        if _processed(c, kinds):
            move = backward_move(info, c, invariant, add_invariant, allow_variant)
            if move is not None:
                moves.append(move)
                if limit and len(moves) >= limit:
                    break
    return moves


#: forward-sink rounds of one run at most (XLA: until nothing changes; each round sinks one level of a chain)
_MAX_SINK_ROUNDS = 64


def _disjoint(groups: list[SinkMove]) -> list[SinkMove]:
    """The groups, less any that reads or writes what an earlier kept group moves (each group's values must
    stay in the loop or leave it whole)."""
    kept: list[SinkMove] = []
    moved: set[Instruction] = set()
    read: set[Instruction] = set()
    for g in groups:
        own = {*g.collectives, *g.formatting, *(d for d, _ in g.stores)}
        reads = {*g.dependencies, *(c.operand(0) for c in g.collectives)}
        if own & moved or reads & moved or own & read:
            continue
        kept.append(g)
        moved |= own
        read |= reads
    return kept


def remove_inserted_markers(module: Module) -> bool:
    """Replace every InsertedByPreviousStep marker by its operand and drop it (what XLA's last run does, so
    that no marker reaches a backend); True if there was one."""
    markers = [i for c in module.computations for i in c.instructions if is_marker(i, INSERTED_BY_PREVIOUS_STEP)]
    for inst in markers:
        inst.replace_all_uses_with(inst.operand(0))
        inst.parent.remove_with_unused_operands(inst)
    return bool(markers)


# --------------------------------------------------------------------------- the pass
@register
@dataclass(frozen=True)
class CollectivePipeliner(ModulePass):
    """Pipeline a loop's collectives across iterations (XLA's CollectivePipeliner; module docstring).

    Options are XLA's Config: `direction` (`forward`, `backward`, `forward-sink`), `op` (the collective
    kinds to process, XLA's `should_process`; colon-separated; `custom-call=TARGET` adds the custom-calls of
    that target, such as XLA's host-offloading `MoveToDevice`), `max_pipelining_per_loop` (0: no limit,
    XLA:GPU's INT64_MAX), `pipeline_use_tree` (elementwise formatting between the collective and its
    store), `process_different_sized_ops` (XLA:GPU: true). XLA:GPU's configurations:
    `{direction=forward,op=all-reduce}`, `{direction=backward,op=all-gather}`,
    `{direction=forward,op=reduce-scatter}` (flags `xla_gpu_enable_pipelined_all_reduce`, `_all_gather`,
    `_reduce_scatter`). `reuse_pipelined_op_buffer` (XLA:GPU: false): when the stored value has the shape of
    the collective's operand, keep the unreduced value in the buffer itself instead of the loop state.

    Multi-level pipelining, as XLA: `last_run=false` marks what a forward run moved, the collective (inside
    and after the loop) and the carried store index (inside) with `custom-call(x, s64[] constant(L+1)),
    custom_call_target="InsertedByPreviousStep"` (L = `level_to_operate_on`), and the operands a
    forward-sink run stacks with `custom_call_target="SunkByPreviousStep"`. A later forward run with
    `level_to_operate_on=L+1` pipelines collectives stored by a dynamic-update-slice indexed by a marker of
    level L+1 (the store need not feed the root: it reaches a root slot through single-user
    dynamic-update-slices), one iteration further. A run with `last_run=true` (the default) removes every
    InsertedByPreviousStep marker of the module, whatever it moved; markers are not runnable, so a module
    reaches a backend only after a last run. SunkByPreviousStep markers go when the loop is sunk again, as
    in XLA. Backward runs and level 0 runs need no marker; forward-sink works at level 0 only (its store must
    provably fill slice i or N-1-i).

    `formatting_excludes` (XLA's acceptable_formatting, as opcodes it refuses; colon-separated): ops that may
    not stand between a collective and its store. `collective_size_threshold_to_stop_sinking` (0: none): a
    forward-sink round stops at a loop holding a store an earlier round sank of that many elements or more.
    Forward-sink runs rounds until one changes nothing, as XLA. `annotated_only`: process only collectives
    whose scheduling annotation (`_scheduling_group_id="G:I"`) asks for this direction (I = 1 forward, -1
    backward; the predicate XLA's explicit-pipelining tests give `should_process`).

    Backward chains: `add_loop_invariant_op_in_chain` (XLA's should_add_loop_invariant_op_in_chain; hlopt's
    default true, XLA:GPU's backward configuration): a loop-invariant op of the chain may also have users
    outside it; `allow_loop_variant_parameter_in_chain` (XLA's predicate, as one flag): the chain may read
    loop-variant slots.

    Scheduling annotations of copies, as XLA: the peeled iteration's copies get new group ids (one per old
    group; a copy with an iteration id loses its annotation), the copies of the moved collectives outside the
    loop lose theirs.

    `cost_model` (hlopt): a device name; pipeline only what the cost model says pays.
    """

    name: ClassVar[str] = "collective-pipeliner"
    direction: Literal["forward", "backward", "forward-sink"] = "forward"
    op: tuple[str, ...] = ("all-reduce",)
    max_pipelining_per_loop: Annotated[int, Ge(0)] = 0
    pipeline_use_tree: bool = False
    process_different_sized_ops: bool = True
    reuse_pipelined_op_buffer: bool = False
    level_to_operate_on: Annotated[int, Ge(0)] = 0
    last_run: bool = True
    formatting_excludes: tuple[str, ...] = ()
    annotated_only: bool = False
    add_loop_invariant_op_in_chain: bool = True
    allow_loop_variant_parameter_in_chain: bool = False
    collective_size_threshold_to_stop_sinking: Annotated[int, Ge(0)] = 0
    cost_model: str = ""

    def __post_init__(self) -> None:
        bad = [k for k in self.op if k not in COLLECTIVES and not k.startswith("custom-call=")]
        if bad or not self.op:
            raise PassOptionError(f"collective-pipeliner: op={':'.join(self.op)!r} is not a list of "
                                  f"collectives ({', '.join(COLLECTIVES)}) or custom-call=TARGET")
        if self.direction not in ("forward", "backward", "forward-sink"):
            raise PassOptionError(f"collective-pipeliner: direction={self.direction!r} is not one of "
                                  "forward, backward, forward-sink")
        if self.cost_model:
            from hlopt.cost_model import get_cost_model

            try:
                get_cost_model(self.cost_model)
            except ValueError as e:
                raise PassOptionError(f"collective-pipeliner: cost_model={self.cost_model!r}: {e}") from None

    def run(self, module: Module) -> bool:
        if module_opcodes(module).isdisjoint(("while", "custom-call")):
            return False  # no loop to pipeline, no marker to remove
        channels = transform.ChannelIds(module)
        marker = None if self.last_run else self.level_to_operate_on + 1
        changed = self._run_once(module, channels, marker)
        # XLA: forward-sink runs again until nothing changes; each round sinks the collectives that have no
        # sinkable collective below them
        rounds = 1
        while changed and self.direction == "forward-sink" and rounds < _MAX_SINK_ROUNDS:
            rounds += 1
            if not self._run_once(module, channels, marker):
                break
        if self.last_run:
            changed |= remove_inserted_markers(module)
        return changed

    def _run_once(self, module: Module, channels: transform.ChannelIds, marker: int | None) -> bool:
        """One pass over the module's loops."""
        loops = [inst for comp in module.computations_post_order() for inst in comp.post_order()
                 if inst.opcode == "while"]
        changed = False
        for loop in loops:
            if loop.parent is None or loop.parent.module is not module:
                continue  # in a body an earlier rewrite replaced
            if not any(_processed(i, self.op) for i in loop.attrs["body"].instructions):
                continue
            if len(module.callers(loop.attrs["body"])) != 1 or len(module.callers(loop.attrs["condition"])) != 1:
                continue  # a body shared by several loops would change for all of them
            info = analyze_loop(loop)
            if info is None:
                continue
            changed |= self._run_on_loop(module, info, channels, marker)
        return changed

    def _run_on_loop(self, module: Module, info: LoopInfo, channels: transform.ChannelIds,
                     marker: int | None) -> bool:
        limit = self.max_pipelining_per_loop
        if self.direction == "forward":
            moves = forward_moves(info, self.op, self.pipeline_use_tree, self.process_different_sized_ops, limit,
                                  self.reuse_pipelined_op_buffer, self.level_to_operate_on, self.formatting_excludes)
            moves = self._profitable(info, self._wanted(moves), forward=True)
            if moves:
                transform.pipeline_forward(module, info, moves, channels, marker)
        elif self.direction == "backward":  # XLA: backward chains do not depend on the level
            moves = backward_moves(info, self.op, limit, self.add_loop_invariant_op_in_chain,
                                   self.allow_loop_variant_parameter_in_chain)
            moves = self._profitable(info, self._wanted(moves), forward=False)
            if moves:
                transform.pipeline_backward(module, info, moves, channels)
        else:
            moves = []
            if self.level_to_operate_on == 0 and self._sink_feasible(info):
                moves = _disjoint(sink_moves(info, self.op, limit, self.pipeline_use_tree, self.formatting_excludes))
            if moves:
                transform.sink_forward(module, info, moves, channels, mark=marker is not None)
        return bool(moves)

    def _wanted(self, moves: list) -> list:
        """The moves whose collectives `annotated_only` lets through."""
        if not self.annotated_only or self.direction == "forward-sink":
            return [] if self.annotated_only else moves
        want = 1 if self.direction == "forward" else -1
        out = []
        for m in moves:
            annotation = transform.scheduling_annotation(m.collective)
            if annotation is not None and annotation[1] == want:
                out.append(m)
        return out

    def _sink_feasible(self, info: LoopInfo) -> bool:
        """XLA's IsForwardSinkIterationFeasible: no store of an earlier sink round of `threshold` elements or
        more (its SunkByPreviousStep marker) is in the loop."""
        threshold = self.collective_size_threshold_to_stop_sinking
        if not threshold:
            return True
        for op in info.body.root.operands:
            if (op.opcode == "dynamic-update-slice" and is_marker(op.operand(1), SUNK_BY_PREVIOUS_STEP)
                    and op.operand(1).shape.numel >= threshold):
                return False
        return True

    def _profitable(self, info: LoopInfo, moves: list, forward: bool) -> list:
        """The moves the cost model keeps (all of them without `cost_model`)."""
        if not self.cost_model or not moves:
            return moves
        from hlopt.passes.collectives.collective_pipeliner_cost import profitable_collectives

        keep = profitable_collectives(info, [m.collective for m in moves], self.cost_model, forward)
        return [m for m in moves if m.collective in keep]
