"""Fusion legality: XLA:GPU's fusibility rules (what may fuse at all, heroes, kinds, in-place and scatter
rules) and which computations are fused, from openxla/xla gpu_fusible.cc, instruction_fusion.cc and
priority_fusion.cc (see docs/notes/priority-fusion.md). Nothing here needs a cost model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from hlopt.cost_model.analysis import transpose_is_bitcast
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.opcodes import ELEMENTWISE, UNARY_ELEMENTWISE
from hlopt.hlo.shape import DTYPES, Shape, TupleShape
from hlopt.passes.dot_strength_reduction import is_strength_reducible_dot
from hlopt.passes.framework.base import call_graph, post_order

__all__ = [
    "MAX_OPERANDS_AND_OUTPUTS", "MAX_UNNESTED_REDUCTIONS", "MAX_IR_SIZE", "MAX_BASIC_BLOCK_SPLITS",
    "SHARED_MEMORY_PER_BLOCK", "SIGNIFICANT_REDUCE", "WARP", "EW", "SPLITS_BLOCKS", "FUSIBLE_KINDS",
    "is_elementwise", "is_multi_output", "is_fusible", "keeps_bit_width", "GEMM_REWRITE_SIZE_THRESHOLD", "is_gemm_dot",
    "is_gemm_epilogue", "with_layouts", "element_count", "byte_size", "reduction_groups",
    "is_unnested_reduction", "is_row_reduction", "is_tiled_transpose", "find_hero", "non_trivial_hero", "keeps_reduction_hero",
    "fusion_roots", "fusion_kind", "reduction_hero", "in_place_operand", "in_place_refusal", "scatter_refusal",
    "fusible_computations", "unique",
]

MAX_OPERANDS_AND_OUTPUTS = 96
#: XLA's kMaxUnnestedReductionOutputsPerFusion.
MAX_UNNESTED_REDUCTIONS = 8
#: GpuHloCostAnalysis::kMaxIRSize (the code-size limit) and the legacy emitters' kMaxBasicBlockSplitsPerFusion
#: (only checked when a pass sets max_basic_block_splits: XLA:GPU's MLIR emitters have no such limit).
MAX_IR_SIZE = 10000
MAX_BASIC_BLOCK_SPLITS = 10
#: shared_memory_per_block of XLA's H100/H200/B200/A100 specs (bytes).
SHARED_MEMORY_PER_BLOCK = 49152
#: A reduce reading at least this many elements per output is "significant" (no reduce into reduce).
SIGNIFICANT_REDUCE = 16
WARP = 32

#: Opcodes XLA treats as elementwise for fusion (map is left out: its to_apply would be nested).
EW = frozenset(ELEMENTWISE - {"map"})
_OTHER_FUSIBLE = frozenset({
    "fusion", "copy", "iota", "constant", "reduce", "bitcast", "broadcast", "concatenate", "dynamic-slice",
    "dynamic-update-slice", "gather", "pad", "reduce-window", "reshape", "reverse", "scatter", "slice",
    "transpose",
})
#: ElementalIrEmitter::OpInvalidatesCache: ops that split basic blocks in emitted code.
SPLITS_BLOCKS = frozenset({"concatenate", "dot", "dynamic-update-slice", "pad", "reduce", "reduce-window"})
#: Ops that look through to their operand when finding a fusion's hero (XLA's IsIntermediate).
_INTERMEDIATE = frozenset(UNARY_ELEMENTWISE | {"bitcast", "reshape"})
#: Fusion kinds that other fusions may merge with (kCustom never).
FUSIBLE_KINDS = frozenset({"kLoop", "kInput", "kOutput"})
_NOT_FUSED_CALLERS = frozenset({"while", "conditional", "call", "fusion"})


def is_elementwise(inst: Instruction) -> bool:
    """XLA's IsElementwise for unfused instructions."""
    return inst.opcode in EW


def is_multi_output(inst: Instruction) -> bool:
    """A fusion whose root is a tuple (XLA's IsMultiOutputFusion)."""
    return inst.opcode == "fusion" and inst.attrs["calls"].root.opcode == "tuple"


def is_fusible(inst: Instruction) -> bool:
    """XLA's IsFusible (priority fusion): elementwise or a fusible data-movement op (none of which has
    side effects), no control dependencies, no custom fusions, no bitcast that changes the element bit width
    (it stays a free view outside fusions; inside one it would change the indexing). Any scatter is fusible,
    as in XLA, whose ScatterSimplifier has put them in canonical form before (hlopt's `scatter-simplifier`,
    in the `fusion` pipeline); gathers only in GatherSimplifier's form (hlopt has no gather simplifier)."""
    op = inst.opcode
    if op not in EW and op not in _OTHER_FUSIBLE:
        return False
    if inst.has_control_dependencies:
        return False
    if op == "fusion":
        return str(inst.attrs.get("kind")) in FUSIBLE_KINDS
    if op == "bitcast":
        return keeps_bit_width(inst)
    if op == "add" and is_gemm_epilogue(inst):
        return False
    if op == "gather":
        return _is_simplified_gather(inst)
    return True


def keeps_bit_width(inst: Instruction) -> bool:
    """XLA's KeepsBitwidth: every operand's element type is as wide as the output's."""
    if inst.shape.is_tuple:
        return True
    bits = DTYPES[inst.shape.dtype].bits
    return all(not op.shape.is_tuple and DTYPES[op.shape.dtype].bits == bits for op in inst.operands)


#: XLA's xla_gpu_gemm_rewrite_size_threshold: smaller dots stay dots (the loop emitter computes them).
GEMM_REWRITE_SIZE_THRESHOLD = 100
#: Output types whose bias add cuBLAS(Lt) takes as a GEMM epilogue (SupportsEpilogueFusion).
_EPILOGUE_TYPES = frozenset({"f8e4m3fn", "f8e5m2", "f16", "bf16", "f32", "f64"})


def _free_size(shape: Shape, batch: Sequence[int], contracting: Sequence[int]) -> tuple[int, int]:
    """(number, product) of a dot operand's non-batch, non-contracting dimensions."""
    free = [s for i, s in enumerate(shape.dims) if i not in batch and i not in contracting]
    return len(free), math.prod(free)


def is_gemm_dot(dot: Instruction) -> bool:
    """XLA:GPU's GemmRewriter makes this dot a cuBLAS call: not a vector dot (those are strength-reduced)
    and not too small (IsMatrixMultiplicationTooSmallForRewriting: (m + n) * k >= 100)."""
    if dot.opcode != "dot" or dot.shape.is_tuple or is_strength_reducible_dot(dot):
        return False
    a = dot.attrs
    lhs, rhs = dot.operand(0).shape, dot.operand(1).shape
    lb, lc = tuple(a.get("lhs_batch_dims", ())), tuple(a.get("lhs_contracting_dims", ()))
    rb, rc = tuple(a.get("rhs_batch_dims", ())), tuple(a.get("rhs_contracting_dims", ()))
    k = math.prod(lhs.dims[d] for d in lc)
    return (_free_size(lhs, lb, lc)[1] + _free_size(rhs, rb, rc)[1]) * k >= GEMM_REWRITE_SIZE_THRESHOLD


def is_gemm_epilogue(add: Instruction) -> bool:
    """XLA:GPU's GemmRewriter folds `add(dot, bias)` into the cuBLAS(Lt) call before fusion (beta = 1 for
    a matrix bias, the BIAS epilogue for a vector broadcast along the output's minor dimension), when the
    dot is a GEMM whose only user is this add and the types allow an epilogue. Such an add is left
    unfused so that XLA makes it the GEMM's epilogue, as in its own pipeline."""
    if add.opcode != "add" or add.operand_count != 2 or add.shape.is_tuple:
        return False
    if add.shape.dtype not in _EPILOGUE_TYPES:
        return False
    for gemm, bias in ((add.operand(0), add.operand(1)), (add.operand(1), add.operand(0))):
        if gemm.opcode != "dot" or gemm.user_count != 1 or gemm is bias or gemm.shape.dtype != add.shape.dtype:
            continue
        if not is_gemm_dot(gemm):
            continue
        if bias.opcode != "broadcast":
            return True
        if _vector_bias(gemm, bias):
            return True
    return False


def _vector_bias(gemm: Instruction, bias: Instruction) -> bool:
    """A broadcast of a vector along the GEMM output's minor (column) dimension (FuseVectorBiasAdd)."""
    a = gemm.attrs
    n_cols, _ = _free_size(gemm.operand(1).shape, tuple(a.get("rhs_batch_dims", ())),
                           tuple(a.get("rhs_contracting_dims", ())))
    rank = gemm.shape.rank
    return (n_cols == 1 and bias.operand(0).shape.rank == 1
            and tuple(bias.attrs.get("dimensions", ())) == (rank - 1,))


def _is_simplified_gather(inst: Instruction) -> bool:
    """XLA:GPU fuses gathers only in GatherSimplifier's canonical form (indices [N, k], index_vector_dim
    1, start_index_map 0..k-1, no collapsed or batching dims, offset dims 1..n)."""
    a = inst.attrs
    idx = inst.operand(1).shape
    offsets = tuple(a.get("offset_dims", ()))
    return (idx.rank == 2 and a.get("index_vector_dim") == 1
            and tuple(a.get("start_index_map", ())) == tuple(range(len(a.get("start_index_map", ()))))
            and not a.get("collapsed_slice_dims") and not a.get("operand_batching_dims")
            and offsets == tuple(range(1, len(offsets) + 1)))


# ----------------------------------------------------------------------------- shapes and heroes


def with_layouts(shape: Shape | TupleShape) -> Shape | TupleShape:
    """`shape` with a row-major layout wherever it has none (XLA:GPU requires layouts)."""
    if shape.is_tuple:
        return TupleShape(tuple(with_layouts(e) for e in shape.elements))
    if shape.layout is None and shape.rank and shape.dtype not in ("token", "opaque"):
        return shape.with_default_layout()
    return shape


def element_count(shape: Shape | TupleShape) -> int:
    return sum(s.numel for s in shape.leaves()) if shape.is_tuple else shape.numel


def byte_size(shape: Shape | TupleShape) -> int:
    return max(shape.byte_size, 0)


def _physical_dims(shape: Shape) -> list[int]:
    """Dimension numbers from major to minor."""
    if shape.layout is not None and len(shape.layout.minor_to_major) == shape.rank:
        return list(reversed(shape.layout.minor_to_major))
    return list(range(shape.rank))


def reduction_groups(inst: Instruction) -> list[tuple[bool, int]] | None:
    """The reduce's input as (reduced?, size) groups from major to minor, size-1 dims dropped."""
    if inst.opcode != "reduce":
        return None
    shape = inst.operand(0).shape
    if shape.is_tuple:
        return None
    reduced = set(inst.attrs.get("dimensions", ()))
    groups: list[tuple[bool, int]] = []
    for d in _physical_dims(shape):
        size = shape.dims[d]
        if size == 1:
            continue
        flag = d in reduced
        if groups and groups[-1][0] == flag:
            groups[-1] = (flag, groups[-1][1] * size)
        else:
            groups.append((flag, size))
    return groups


def is_unnested_reduction(inst: Instruction) -> bool:
    """XLA's IsReductionFromOrToContiguousDimensions and faster than the elemental emitter: a row
    reduction ([R,] K, R with R >= 32 or dividing 32) or a column reduction ([K,] R, K, large enough)."""
    if inst.opcode != "reduce":
        return False
    groups = reduction_groups(inst)
    if not groups:
        return False
    flags = [g[0] for g in groups]
    if flags[-1]:  # row reduction: the minor-most dimension is reduced
        if flags not in ([True], [False, True], [True, False, True]):
            return False
        minor = groups[-1][1]
        return minor >= WARP or WARP % minor == 0
    if flags not in ([True, False], [False, True, False]):
        return False
    major, minor = groups[-2][1], groups[-1][1]
    elemental = (major < WARP or (major < 2 * WARP and minor < WARP) or (major < 4 * WARP and minor < 8)
                 or (major < 8 * WARP and minor < 3))
    return not elemental


def is_row_reduction(inst: Instruction) -> bool:
    groups = reduction_groups(inst)
    return bool(groups) and groups[-1][0]


def _transpose_minor_sizes(inst: Instruction) -> tuple[int, int] | None:
    """(input minor size, output minor size) of a transpose/copy that moves the minor dimension."""
    if inst.opcode == "transpose":
        src = inst.operand(0).shape
        perm = tuple(inst.attrs.get("dimensions", ()))
        out = inst.shape
        if src.is_tuple or len(perm) != src.rank:
            return None
        keep = [d for d in range(out.rank) if out.dims[d] != 1]
        if len(keep) < 2:
            return None
        in_minor = [d for d in _physical_dims(src) if src.dims[d] != 1][-1]
        out_minor = [d for d in _physical_dims(out) if out.dims[d] != 1][-1]
        if perm[out_minor] == in_minor:
            return None
        return src.dims[in_minor], out.dims[out_minor]
    if inst.opcode == "copy":
        src, out = inst.operand(0).shape, inst.shape
        if src.is_tuple or src.layout is None or out.layout is None or src.layout == out.layout:
            return None
        in_minor = [d for d in _physical_dims(src) if src.dims[d] != 1]
        out_minor = [d for d in _physical_dims(out) if out.dims[d] != 1]
        if not in_minor or in_minor[-1] == out_minor[-1]:
            return None
        return src.dims[in_minor[-1]], out.dims[out_minor[-1]]
    return None


def is_tiled_transpose(inst: Instruction) -> bool:
    """XLA's GetDescriptionForTiledTransposeEmitter: a transpose of the minor dimension, large enough."""
    sizes = _transpose_minor_sizes(inst)
    if sizes is None:
        return False
    a, b = sizes
    return (a >= 16 and b >= 16) or (a >= 8 and b >= 8 and a * b >= 64 * 128)


def find_hero(inst: Instruction) -> Instruction:
    """The non-trivial hero of a fusion root: walk up unary elementwise ops, bitcasts and reshapes
    (each with a single user) to the op that decides the emitter."""
    x = inst
    while x.opcode in _INTERMEDIATE and x.operand_count == 1:
        op = x.operand(0)
        if op.opcode == "parameter" or op.user_count != 1:
            break
        x = op
    return x


def keeps_reduction_hero(producer: Instruction, consumer: Instruction) -> bool:
    """Fusing a reduction `producer` into `consumer` keeps the reduction emitter only when the consumer
    is an epilogue of unary ops along its root chain (else XLA refuses: it would become a loop fusion)."""
    if consumer.opcode != "fusion":
        return consumer.opcode in _INTERMEDIATE and consumer.operand_count == 1
    x = consumer.attrs["calls"].root
    while True:
        if x.opcode == "parameter":
            return consumer.operand(x.attrs["parameter_number"]) is producer
        if x.opcode not in _INTERMEDIATE or x.operand_count != 1:
            return False
        op = x.operand(0)
        if op.opcode != "parameter" and op.user_count != 1:
            return False
        x = op


def fusion_roots(comp: Computation) -> list[Instruction]:
    """The outputs of a fused computation (the tuple's operands for a multi-output fusion)."""
    root = comp.root
    return list(root.operands) if root.opcode == "tuple" else [root]


def _is_intermediate(inst: Instruction, allowed_operands: int) -> bool:
    """XLA's IsIntermediate: an op with 1..`allowed_operands` operands that a hero is looked for through:
    elementwise (a copy only when it keeps the layout), a bitcast, a reshape, a transpose that is a bitcast."""
    if not 0 < inst.operand_count <= allowed_operands:
        return False
    op = inst.opcode
    if op == "copy":
        return inst.shape == inst.operand(0).shape
    if op in EW or op in ("bitcast", "reshape"):
        return True
    return op == "transpose" and transpose_is_bitcast(inst)


def _find_hero_by(start: Instruction, wanted: Callable[[Instruction], bool]) -> Instruction | None:
    """XLA's FindHero: the one op `wanted` picks among what `start` reads through intermediate ops of up to
    three operands (None when there are several, or none), and only when nothing but intermediate ops reads
    its value on the way to the fusion's outputs."""
    hero = None
    seen = {start}
    work = [start]
    while work:
        inst = work.pop(0)
        if wanted(inst):
            if hero is not None:
                return None
            hero = inst
            continue
        if not _is_intermediate(inst, 3):
            continue
        for op in inst.operands:
            if op not in seen:
                seen.add(op)
                work.append(op)
    if hero is None or not _only_intermediate_users(hero):
        return None
    return hero


def _is_concatenate(inst: Instruction) -> bool:
    return inst.opcode == "concatenate"


def non_trivial_hero(root: Instruction) -> Instruction:
    """XLA's FindNonTrivialHero for a fusion root: a tiled transpose or a concatenate that the root reads
    through elementwise ops (of up to three operands), bitcasts and reshapes; else the reduce at the end of
    the root's chain of unary ops; else the root itself."""
    hero = find_hero(root)
    found = _transpose_or_concatenate_hero(hero)
    if found is not None:
        return found
    return hero if hero.opcode == "reduce" else root


#: The opcodes `_transpose_or_concatenate_hero` stops at (a tiled transpose is a transpose or a copy).
_HERO_OPCODES = frozenset({"transpose", "copy", "concatenate"})


def _transpose_or_concatenate_hero(start: Instruction) -> Instruction | None:
    """`_find_hero_by(start, is_tiled_transpose)`, else `_find_hero_by(start, _is_concatenate)`, in one walk:
    neither a tiled transpose nor a concatenate is an intermediate op, so both searches visit the same
    instructions (the two searches run as written where one is)."""
    transposes: list[Instruction] = []
    concatenates: list[Instruction] = []
    seen = {start}
    work = [start]
    i = 0
    while i < len(work):
        inst = work[i]
        i += 1
        op = inst.opcode
        intermediate = _is_intermediate(inst, 3)
        if op == "concatenate" or ((op == "transpose" or op == "copy") and is_tiled_transpose(inst)):
            if intermediate:  # not so for any op XLA has: the searches would differ, run them as written
                found = _find_hero_by(start, is_tiled_transpose)
                return found if found is not None else _find_hero_by(start, _is_concatenate)
            (concatenates if op == "concatenate" else transposes).append(inst)
            continue
        if not intermediate:
            continue
        for o in inst.operands:
            if o not in seen:
                seen.add(o)
                work.append(o)
    for found in (transposes, concatenates):
        if len(found) == 1 and _only_intermediate_users(found[0]):
            return found[0]
    return None


def _only_intermediate_users(hero: Instruction) -> bool:
    """Whether nothing but intermediate ops reads `hero`'s value on the way to the fusion's outputs (the
    second half of `_find_hero_by`)."""
    seen: set[Instruction] = set()
    work = list(hero.users)
    while work:
        inst = work.pop()
        if inst in seen:
            continue
        seen.add(inst)
        if inst.opcode not in ("tuple", "parameter") and not _is_intermediate(inst, 3):
            return False
        work.extend(inst.users)
    return True


def _consistent_transpose(roots: Sequence[Instruction], heroes: Sequence[Instruction]) -> bool:
    """XLA's FindConsistentTransposeHero: the tiled transpose heroes are alike and every other root has as
    many elements as the transpose's input (a bitcast of it)."""
    transposes = [h for h in heroes if h.opcode == "transpose" and is_tiled_transpose(h)]
    if not transposes:
        return False
    first = transposes[0]
    like = (first.shape.dims, tuple(first.attrs.get("dimensions", ())))
    if any((t.shape.dims, tuple(t.attrs.get("dimensions", ()))) != like for t in transposes):
        return False
    size = first.operand(0).shape.numel
    return all(h in transposes or r.shape.numel == size for r, h in zip(roots, heroes, strict=True))


def fusion_kind(comp: Computation) -> str:
    """The kind XLA's PriorityFusion::ChooseKind gives this fused computation (from its emitter, with the
    roots' heroes as XLA's FindNonTrivialHero finds them): kInput for reduction, tiled-transpose, scatter and
    concatenate emitters, kLoop otherwise."""
    roots = fusion_roots(comp)
    if any(i.opcode in _HERO_OPCODES for i in comp.instructions):
        heroes = [non_trivial_hero(r) for r in roots]
    else:  # no transpose or concatenate hero to find (a scan of opcodes costs less than the walk)
        heroes = [h if h.opcode == "reduce" else r for r, h in ((r, find_hero(r)) for r in roots)]
    if any(is_unnested_reduction(h) for h in heroes):
        return "kInput"
    if _consistent_transpose(roots, heroes):
        return "kInput"
    if len(roots) == 1:
        if roots[0].opcode == "scatter":
            return "kInput"
        if heroes[0].opcode == "concatenate" and heroes[0].operand_count <= 4:
            return "kInput"
    return "kLoop"


def reduction_hero(comp: Computation) -> Instruction | None:
    for r in fusion_roots(comp):
        hero = find_hero(r)
        if is_unnested_reduction(hero):
            return hero
    return None


def _inplace_root(inst: Instruction) -> Instruction | None:
    if inst.opcode in ("dynamic-update-slice", "scatter"):
        return inst
    if inst.opcode == "fusion":
        root = inst.attrs["calls"].root
        if root is not None and root.opcode in ("dynamic-update-slice", "scatter") \
                and root.operand(0).opcode == "parameter":
            return root
    return None


def in_place_operand(inst: Instruction) -> Instruction | None:
    root = _inplace_root(inst)
    if root is None:
        return None
    if inst.opcode == "fusion":
        return inst.operand(root.operand(0).attrs["parameter_number"])
    return inst.operand(0)


def in_place_refusal(producer: Instruction, consumer: Instruction) -> str | None:
    """XLA's ShouldFuseInPlaceOp: the consumer updates a buffer in place; no other operand may alias it,
    and a non-elementwise producer may not read it (it would see the update)."""
    buf = in_place_operand(consumer)
    if buf is None:
        return None
    if sum(op is buf for op in consumer.operands) > 1:
        return "the in-place consumer reads its in-place buffer twice"
    elementwise = producer.opcode in EW or (
        producer.opcode == "fusion" and all(i.opcode in EW or i.opcode == "parameter"
                                            for i in producer.attrs["calls"].instructions))
    if not elementwise and any(op is buf for op in producer.operands):
        return "the producer reads the buffer the consumer updates in place"
    return None


def scatter_refusal(producer: Instruction, consumer: Instruction) -> str | None:
    """XLA's CanEmitInputFusedScatter."""
    if _is_scatter(producer):
        return "nothing fuses into the output of a scatter"
    if not _is_scatter(consumer):
        return None
    buf = in_place_operand(consumer)
    if buf is producer:
        return "the producer is the scatter's in-place operand"
    if buf is not None and any(op is buf for op in producer.operands):
        return "the producer reads the scatter's in-place operand"
    return None


def _is_scatter(inst: Instruction) -> bool:
    return inst.opcode == "scatter" or (inst.opcode == "fusion" and inst.attrs["calls"].root.opcode == "scatter")


def fusible_computations(module: Module) -> list[Computation]:
    """XLA's GetFusibleComputations, callees first: not fusion bodies, not computations applied by
    reduce/sort/scatter/map/all-reduce/custom-call/async ops; bodies of while/conditional/call are fused."""
    excluded: set[Computation] = set()
    fused: set[Computation] = set()
    callees, calls = call_graph(module)  # one scan of the instructions, fused ones included
    for opcode, called in calls:
        if opcode == "fusion":
            fused.update(called)
        elif opcode not in _NOT_FUSED_CALLERS:
            excluded.update(called)
    return [c for c in post_order(module, callees)
            if c not in fused and c not in excluded and c.module is module]


def unique(xs: Iterable[Instruction]) -> list[Instruction]:
    """Distinct instructions, first occurrence order."""
    return list(dict.fromkeys(xs))
