"""Shared fusion machinery: XLA:GPU's fusibility rules and budgets, fusion kinds, the cost-model adapter,
and building fusion instructions / fused computations the way XLA prints them.

Rules follow openxla/xla gpu_fusible.cc, instruction_fusion.cc and priority_fusion.cc (see
docs/notes/priority-fusion.md). A fused computation is named `fused_computation[.N]`, its parameters
`param_<n>[.N]`, the fusion instruction `fusion[.N]`, with `kind=kLoop` or `kind=kInput`.

Every instruction gets a `Profile` (flops, per-operand utilization and times-emitted, output bytes,
IR size, budget counters), computed from the fused computation with XLA's "elementwise use roots"
propagation (GpuHloCostAnalysis), so a producer/consumer pair can be costed without building it.
"""

from __future__ import annotations

import functools
import math
import warnings
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.opcodes import ELEMENTWISE, UNARY_ELEMENTWISE
from hlopt.hlo.shape import Shape, TupleShape
from hlopt.passes.base import ModulePass, PassResult

__all__ = [
    "MAX_OPERANDS_AND_OUTPUTS", "MAX_UNNESTED_REDUCTIONS", "MAX_IR_SIZE", "MAX_BASIC_BLOCK_SPLITS",
    "SHARED_MEMORY_PER_BLOCK", "Profile", "FusionCostModel", "_FusionCostModel", "profile_of",
    "is_fusible", "is_elementwise", "is_unnested_reduction", "is_tiled_transpose", "fusion_kind",
    "fusion_roots", "find_hero", "fusible_computations", "wrap_in_fusion", "fuse_producer",
    "fuse_into_multi_output", "merge_into_multi_output", "budget_refusal", "merged_too_large",
    "creates_heavy_computation", "in_place_refusal", "scatter_refusal", "is_multi_output",
    "Explanation", "keeps_reduction_hero", "Budgets", "DEFAULT_BUDGETS", "FusionPass", "unique", "remove_fusion",
    "FusionRun", "instruction_flops", "merge_profiles", "fuse_into_new_fusion",
    "is_strength_reducible_dot", "strength_reduce_dot", "is_gemm_dot", "is_gemm_epilogue",
    "can_expand_select_and_scatter", "expand_select_and_scatter",
]

#: XLA's MaxOperandsAndOutputsPerFusion().
MAX_OPERANDS_AND_OUTPUTS = 96
#: XLA's kMaxUnnestedReductionOutputsPerFusion.
MAX_UNNESTED_REDUCTIONS = 8
#: GpuHloCostAnalysis::kMaxIRSize and kMaxBasicBlockSplitsPerFusion (the code-size limit).
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
_SPLITS_BLOCKS = frozenset({"concatenate", "dot", "dynamic-update-slice", "pad", "reduce", "reduce-window"})
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
    side effects), no control dependencies, no custom fusions."""
    op = inst.opcode
    if op not in EW and op not in _OTHER_FUSIBLE:
        return False
    if inst.has_control_dependencies:
        return False
    if op == "fusion":
        return str(inst.attrs.get("kind")) in FUSIBLE_KINDS
    if op == "add" and is_gemm_epilogue(inst):
        return False
    if op == "gather":
        return _is_simplified_gather(inst)
    if op == "scatter":
        return _is_simplified_scatter(inst)
    return True


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


def _is_simplified_scatter(inst: Instruction) -> bool:
    """ScatterSimplifier's canonical form (indices [N, k], index_vector_dim 1, identity dims map,
    no inserted or batching dims, update window dims 1..n), which XLA:GPU's scatter emitter expects."""
    a = inst.attrs
    n = inst.operand_count // 2
    idx = inst.operand(n).shape
    window = tuple(a.get("update_window_dims", ()))
    dims = tuple(a.get("scatter_dims_to_operand_dims", ()))
    return (idx.rank == 2 and a.get("index_vector_dim") == 1 and dims == tuple(range(len(dims)))
            and not a.get("inserted_window_dims") and not a.get("input_batching_dims")
            and window == tuple(range(1, len(window) + 1)))


# ----------------------------------------------------------------------------- shapes and heroes


def _laid_out(shape: Shape | TupleShape) -> Shape | TupleShape:
    """`shape` with a row-major layout wherever it has none (XLA:GPU requires layouts)."""
    if shape.is_tuple:
        return TupleShape(tuple(_laid_out(e) for e in shape.elements))
    if shape.layout is None and shape.rank and shape.dtype not in ("token", "opaque"):
        return shape.with_default_layout()
    return shape


def _numel(shape: Shape | TupleShape) -> int:
    return sum(s.numel for s in shape.leaves()) if shape.is_tuple else shape.numel


def _bytes(shape: Shape | TupleShape) -> int:
    return max(shape.byte_size, 0)


def _physical_dims(shape: Shape) -> list[int]:
    """Dimension numbers from major to minor."""
    if shape.layout is not None and len(shape.layout.minor_to_major) == shape.rank:
        return list(reversed(shape.layout.minor_to_major))
    return list(range(shape.rank))


def _reduction_groups(inst: Instruction) -> list[tuple[bool, int]] | None:
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
    groups = _reduction_groups(inst)
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


def _is_row_reduction(inst: Instruction) -> bool:
    groups = _reduction_groups(inst)
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


def fusion_kind(comp: Computation) -> str:
    """The kind XLA's PriorityFusion::ChooseKind gives this fused computation (from its emitter):
    kInput for reduction, tiled-transpose, scatter and concatenate emitters, kLoop otherwise."""
    roots = fusion_roots(comp)
    for r in roots:
        hero = find_hero(r)
        if is_unnested_reduction(hero) or is_tiled_transpose(hero):
            return "kInput"
    if len(roots) == 1:
        if roots[0].opcode == "scatter":
            return "kInput"
        hero = find_hero(roots[0])
        if hero.opcode == "concatenate" and hero.operand_count <= 4:
            return "kInput"
    return "kLoop"


def _reduction_hero(comp: Computation) -> Instruction | None:
    for r in fusion_roots(comp):
        hero = find_hero(r)
        if is_unnested_reduction(hero):
            return hero
    return None


# ----------------------------------------------------------------------------- profiles


def _operand_utilization(inst: Instruction, i: int) -> float:
    """Elements of operand i read per element of the operand, to compute the whole output once."""
    op = inst.opcode
    operand = inst.operand(i).shape
    n_in = max(_numel(operand), 1)
    if op == "broadcast":
        return _numel(inst.shape) / n_in
    if op in ("slice", "dynamic-slice", "gather") and i == 0:
        return _numel(inst.shape) / n_in
    if op == "reduce-window" and i < inst.operand_count // 2:
        window = inst.attrs.get("window")
        size = math.prod(d.size for d in window.dims) if window is not None else 1
        out = inst.shape.leaves()[0] if inst.shape.is_tuple else inst.shape
        return out.numel * size / n_in
    return 1.0


def _expensive_to_repeat(inst: Instruction) -> bool:
    """XLA's IsExpensiveToRepeat: a nested reduce of more than 10 inputs per output, a big window."""
    if inst.opcode == "reduce" and not inst.shape.is_tuple and not is_unnested_reduction(inst):
        return inst.operand(0).shape.numel / max(inst.shape.numel, 1) > 10
    if inst.opcode == "reduce-window":
        window = inst.attrs.get("window")
        return window is not None and math.prod(d.size for d in window.dims) > 10
    return False


def _reads_elements_multiple_times(inst: Instruction) -> bool:
    """XLA's IfFusedReadsElementsMultipleTimes."""
    if inst.opcode in ("gather", "broadcast"):
        return _numel(inst.shape) > _numel(inst.operand(0).shape)
    if inst.opcode == "reduce-window":
        window = inst.attrs.get("window")
        return window is not None and any(d.size > d.stride for d in window.dims)
    return False


def _shared_memory(inst: Instruction) -> int:
    """XLA's SharedMemoryUsage of one unfused instruction."""
    if inst.opcode == "reduce" and is_unnested_reduction(inst):
        n = max(inst.operand_count // 2, 1)
        elem = sum(max(inst.operand(i).shape.element_type.bits // 8, 1) for i in range(n))
        return 32 * elem if _is_row_reduction(inst) else 32 * (4 * 32 + 1) * elem
    if is_tiled_transpose(inst):
        return 32 * 33 * max(inst.shape.element_type.bits // 8, 1)
    return 0


@dataclass(slots=True)
class Profile:
    """What fusion needs to know about one instruction (a fusion: about its fused computation).

    `util[i]` / `emitted[i]`: elements of operand i read per element, times operand i's value is
    emitted in the kernel (XLA's utilization and IR size of the fused parameter).
    """

    flops: float
    transcendentals: float
    util: list[float]
    emitted: list[float]
    out_bytes: float
    inplace: int | None  # operand number updated in place (a DUS / scatter on a parameter)
    ir_size: float
    bb_splits: float
    instructions: int
    unnested_reductions: int
    shared_memory: int
    significant_reduce: bool
    reduction_hero: bool
    expensive_to_repeat: bool
    kind: str
    op_bytes: list[float] = field(default_factory=list)
    compute: float = 0.0  # FP32-op equivalents (XLA:GPU's per-op costs), weighted by utilization
    blocks: int = 1 << 30  # thread blocks the kernel's emitter launches (few blocks: idle SMs, less bandwidth)
    threads: int = 128  # threads per block (fewer than an SM's FP32 lanes leave lanes idle)
    param_reads_multiple: list[bool] | None = field(default=None)


#: FP32-op equivalents per element of the ops XLA:GPU's default model finds expensive (F32, H100),
#: measured through ../shared/tools/xla_gpu_compile.py on 10-op chains over 256K elements; other
#: transcendentals count 4 (the cost model's quarter rate), other elementwise ops 1.
XLA_OP_COST = {
    "exponential": 64.0, "rsqrt": 59.0, "sqrt": 59.0, "log": 151.0, "tanh": 452.0, "sine": 963.0,
    "cosine": 963.0, "cbrt": 164.0, "exponential-minus-one": 174.0, "log-plus-one": 215.0, "power": 486.0,
    "atan2": 409.0,
}
#: Elements a loop kernel needs to keep every FP32 lane of an H100 busy (132 SMs x 128 lanes).
FULL_DEVICE_THREADS = 132 * 128


def instruction_flops(inst: Instruction, gpu_flops: Callable[[Instruction], float] | None = None
                      ) -> tuple[float, float, float]:
    """(flops, transcendentals, compute) of one instruction: the cost model's HloCostAnalysis counts,
    and the compute fusion weighs, in FP32-op equivalents: the model's XLA:GPU flops (`gpu_flops`,
    measured cycles per element) when it has them, else XLA_OP_COST per element for the expensive ops
    and the model's quarter rate for other transcendentals. `FusionRun.flops_of` caches it per run."""
    from hlopt.cost_model import instruction_cost

    c = instruction_cost(inst, count_bytes=False)
    compute = None
    if gpu_flops is not None and inst.opcode not in ("parameter", "fusion"):
        try:
            compute = float(gpu_flops(inst))
        except Exception:  # noqa: BLE001 - an op the model cannot weigh falls back to the table
            compute = None
    if compute is None:
        per = XLA_OP_COST.get(inst.opcode)
        compute = per * _numel(inst.shape) if per is not None else c.flops + 4.0 * c.transcendentals
    return c.flops, c.transcendentals, compute


def _blocks(hero: Instruction | None, out_elements: int) -> int:
    """Thread blocks the kernel's emitter launches (fitted on XLA:GPU's default model, H100): a column
    reduction one per 64 kept minor columns (times the kept major extent), a row reduction one per
    clamp(4096 / row length, 1, 8) rows, a loop one per 128 output elements (512 once it unrolls)."""
    if hero is not None and hero.opcode == "reduce":
        groups = _reduction_groups(hero) or []
        if groups and not groups[-1][0]:
            major = groups[0][1] if len(groups) == 3 else 1
            return major * math.ceil(groups[-1][1] / 64)
        length = groups[-1][1] if groups else 1
        rows = max(hero.operand(0).shape.numel // max(length, 1), 1)
        return math.ceil(rows / min(max(4096 // max(length, 1), 1), 8))
    n = max(out_elements, 1)
    return math.ceil(n / (512 if n >= 270336 else 128))


#: FP32 lanes per SM of the H100 (the adapter reads the model's DeviceSpec).
_LANES = 128


def _threads(hero: Instruction | None, out_elements: int) -> int:
    """Threads per block of the kernel's emitter, as XLA's launch dimensions count them for compute: a
    loop kernel runs one thread per output element, up to 128 per block (the reduction emitter keeps
    its lanes busy: a full block)."""
    if hero is not None and hero.opcode == "reduce":
        return _LANES
    return max(min(out_elements, _LANES), 1)


def _significant_reduce(inst: Instruction) -> bool:
    return (inst.opcode == "reduce" and not inst.shape.is_tuple
            and inst.operand(0).shape.numel / max(inst.shape.numel, 1) >= SIGNIFICANT_REDUCE)


def _single_profile(inst: Instruction, run: FusionRun) -> Profile:
    flops, trans, compute = run.flops_of(inst)
    n = inst.operand_count
    util = [_operand_utilization(inst, i) for i in range(n)]
    out_bytes = float(_bytes(inst.shape))
    inplace = None
    if inst.opcode in ("dynamic-update-slice", "scatter") and not inst.shape.is_tuple:
        inplace = 0
        util[0] = 0.0
        update = inst.operand(1 if inst.opcode == "dynamic-update-slice" else 2).shape
        out_bytes = float(_bytes(update))
    hero = inst.opcode == "reduce" and is_unnested_reduction(inst)
    kind = "kInput" if hero or is_tiled_transpose(inst) or inst.opcode == "scatter" or (
        inst.opcode == "concatenate" and n <= 4) else "kLoop"
    return Profile(
        flops=flops, transcendentals=trans, util=util, emitted=[1.0] * n, out_bytes=out_bytes, inplace=inplace,
        ir_size=1.0, bb_splits=float(inst.opcode in _SPLITS_BLOCKS), instructions=1,
        unnested_reductions=int(hero), shared_memory=_shared_memory(inst),
        significant_reduce=_significant_reduce(inst), reduction_hero=hero,
        expensive_to_repeat=_expensive_to_repeat(inst), kind=kind,
        op_bytes=[float(_bytes(op.shape)) for op in inst.operands], compute=compute,
        blocks=_blocks(inst if hero else None, _numel(inst.shape)),
        threads=_threads(inst if hero else None, _numel(inst.shape)),
    )


def _propagate(comp: Computation) -> tuple[dict[Instruction, float], dict[Instruction, float]]:
    """Utilization and times-emitted of every fused instruction (XLA's FusionCalculateUtilizations):
    elementwise users pass their "use roots" on; other users make the operand a root of its own."""
    root = comp.root
    roots: dict[Instruction, set[Instruction]] = {root: {root}}
    root_util: dict[Instruction, float] = {root: 1.0}
    root_ir: dict[Instruction, float] = {root: 1.0}
    util: dict[Instruction, float] = {}
    emitted: dict[Instruction, float] = {}
    for inst in reversed(comp.instructions):
        mine = roots.get(inst)
        if not mine:
            util[inst] = emitted[inst] = 0.0
            continue
        u = util[inst] = sum(root_util.get(r, 0.0) for r in mine)
        e = emitted[inst] = sum(root_ir.get(r, 0.0) for r in mine)
        passthrough = inst.opcode in EW or inst.opcode in ("tuple", "get-tuple-element")
        for i, op in enumerate(inst.operands):
            if passthrough:
                roots.setdefault(op, set()).update(mine)
            else:
                roots.setdefault(op, set()).add(op)
                root_util[op] = root_util.get(op, 0.0) + u * _operand_utilization(inst, i)
                root_ir[op] = root_ir.get(op, 0.0) + e
    return util, emitted


def _fusion_profile(fusion: Instruction, run: FusionRun) -> Profile:
    comp: Computation = fusion.attrs["calls"]
    util, emitted = _propagate(comp)
    hero = _reduction_hero(comp)
    flops = trans = compute = ir = splits = 0.0
    count = reductions = shmem = 0
    significant = expensive = False
    for inst in comp.instructions:
        if inst.opcode == "parameter":
            continue
        count += 1
        f, t, c = run.flops_of(inst)
        u = util[inst]
        flops += f * u
        trans += t * u
        compute += c * u
        ir += emitted[inst]
        if inst.opcode in _SPLITS_BLOCKS:
            splits += emitted[inst]
        if inst.opcode == "reduce" and is_unnested_reduction(inst):
            reductions += 1
        shmem += _shared_memory(inst)
        significant |= _significant_reduce(inst)
        expensive |= _expensive_to_repeat(inst)
    n = fusion.operand_count
    params = [comp.parameter(i) for i in range(n)]
    p_util = [util.get(p, 0.0) for p in params]
    out_bytes = float(_bytes(fusion.shape))
    inplace = None
    root = comp.root
    if root.opcode in ("dynamic-update-slice", "scatter") and root.operand(0).opcode == "parameter":
        inplace = root.operand(0).attrs["parameter_number"]
        if root.operand(0).user_count == 1:
            p_util[inplace] = 0.0
            update = root.operand(1 if root.opcode == "dynamic-update-slice" else 2).shape
            out_bytes = float(_bytes(update))
    return Profile(
        flops=flops, transcendentals=trans, util=p_util, emitted=[max(emitted.get(p, 0.0), 1.0) for p in params],
        out_bytes=out_bytes, inplace=inplace, ir_size=max(ir, 1.0), bb_splits=splits, instructions=count,
        unnested_reductions=reductions, shared_memory=shmem, significant_reduce=significant,
        reduction_hero=hero is not None, expensive_to_repeat=expensive, kind=fusion_kind(comp),
        op_bytes=[float(_bytes(op.shape)) for op in fusion.operands], compute=compute,
        blocks=_blocks(hero, _numel(fusion_roots(comp)[0].shape)),
        threads=_threads(hero, _numel(fusion_roots(comp)[0].shape)),
    )


def _inplace_of(fusion: Instruction) -> tuple[int | None, float]:
    """(in-place operand number, output bytes) of a fusion whose root updates a parameter in place."""
    root = fusion.attrs["calls"].root
    if root.opcode in ("dynamic-update-slice", "scatter") and root.operand(0).opcode == "parameter" \
            and root.operand(0).user_count == 1:
        update = root.operand(1 if root.opcode == "dynamic-update-slice" else 2).shape
        return root.operand(0).attrs["parameter_number"], float(_bytes(update))
    return None, float(_bytes(fusion.shape))


def merge_profiles(fusion: Instruction, producer: Instruction, producer_operands: Sequence[Instruction],
                   p: Profile, consumer_operands: Sequence[Instruction], c: Profile) -> Profile:
    """The Profile of `fusion` right after `producer` (with those operands and profile `p`) was fused
    into the consumer (operands and profile `c`), without walking the fused computation again."""
    u = 0.0
    rep = 1.0
    per: dict[int, list[float]] = {}  # operand uid -> [utilization, times emitted, bytes]
    for i, op in enumerate(consumer_operands):
        cu, ce = c.util[i], c.emitted[i]
        if op is producer:
            u += (cu if cu > 1.0 else 1.0) if c.inplace == i else cu
            rep = ce if ce > rep else rep
            continue
        got = per.get(op.id)
        if got is None:
            per[op.id] = [cu, ce, c.op_bytes[i]]
        else:
            got[0] += cu
            got[1] = ce if ce > got[1] else got[1]
    for i, op in enumerate(producer_operands):
        pu, pe = p.util[i] * u, p.emitted[i] * rep
        got = per.get(op.id)
        if got is None:
            per[op.id] = [pu, pe, p.op_bytes[i]]
        else:
            got[0] += pu
            got[1] = pe if pe > got[1] else got[1]
    comp = fusion.attrs["calls"]
    hero = _reduction_hero(comp)
    inplace, out_bytes = _inplace_of(fusion)
    rows = [per.get(op.id) or [1.0, 1.0, float(_bytes(op.shape))] for op in fusion.operands]
    op_util = [r[0] for r in rows]
    if inplace is not None:
        op_util[inplace] = 0.0
    return Profile(
        flops=c.flops + p.flops * u, transcendentals=c.transcendentals + p.transcendentals * u, util=op_util,
        compute=c.compute + p.compute * u, blocks=_blocks(hero, _numel(fusion_roots(comp)[0].shape)),
        threads=_threads(hero, _numel(fusion_roots(comp)[0].shape)),
        emitted=[r[1] if r[1] > 1.0 else 1.0 for r in rows], out_bytes=out_bytes, inplace=inplace,
        ir_size=c.ir_size + p.ir_size * rep, bb_splits=c.bb_splits + p.bb_splits * rep,
        instructions=c.instructions + p.instructions, unnested_reductions=c.unnested_reductions + p.unnested_reductions,
        shared_memory=c.shared_memory + p.shared_memory, significant_reduce=c.significant_reduce or p.significant_reduce,
        reduction_hero=hero is not None, expensive_to_repeat=c.expensive_to_repeat or p.expensive_to_repeat,
        kind=str(fusion.attrs.get("kind")), op_bytes=[r[2] for r in rows],
    )


def profile_of(inst: Instruction, cache: dict | None = None, run: FusionRun | None = None) -> Profile:
    """The instruction's Profile (cached in `cache` by id when given; drop the entry when a fusion changes).
    `run` is the fusion pass's per-run state (its cost model's flops, cached); without one, the H100 model's."""
    if cache is not None:
        got = cache.get(inst.id)
        if got is not None:
            return got
    run = run if run is not None else FusionRun(None)
    prof = _fusion_profile(inst, run) if inst.opcode == "fusion" else _single_profile(inst, run)
    if cache is not None:
        cache[inst.id] = prof
    return prof


def _param_reads_multiple(fusion: Instruction, prof: Profile) -> list[bool]:
    """Per operand: is there a path from its parameter to an op that reads elements several times."""
    if prof.param_reads_multiple is not None:
        return prof.param_reads_multiple
    comp = fusion.attrs["calls"]
    out = []
    for i in range(fusion.operand_count):
        seen: set[Instruction] = set()
        work = [comp.parameter(i)]
        hit = False
        while work and not hit:
            x = work.pop()
            if x in seen:
                continue
            seen.add(x)
            hit = _reads_elements_multiple_times(x)
            work.extend(x.users)
        out.append(hit)
    prof.param_reads_multiple = out
    return out


# ----------------------------------------------------------------------------- the cost model adapter


class FusionCostModel:
    """Fusion's view of `cost_model`: a kernel's time, a producer+consumer fusion's time, in us.

    Every fusible kernel, real (an instruction, a fusion) or hypothetical (a producer fused into a
    consumer), is timed the same way from its Profile, so that unfused and fused times compare:
    compute = the model's XLA:GPU flops per instruction (`gpu_flops`; without them, HloCostAnalysis
    flops from `instruction_cost` with XLA_OP_COST for the expensive ops), weighted by utilization and
    scaled up when the emitter launches fewer blocks than SMs; bytes = each distinct external
    operand once up to its utilization, plus the output, scaled up when the blocks cannot issue enough
    memory transactions (32 B per SM per clock) to reach HBM bandwidth. The time is the model's roofline,
    `weighted_kernel_time_us(compute, bytes)` (compute and memory overlapped, launch overhead included),
    or without it max(compute, memory) + launch on the model's DeviceSpec. Without `cost_model` at all
    the fallback is an H100 roofline (3.35 TB/s, 67 TFLOP/s FP32, 1 us launch).
    """

    H100_FALLBACK = {"hbm_bandwidth": 3.35232e12, "fp32_flops": 2 * 132 * 128 * 1.98e9, "kernel_launch_us": 1.0}

    def __init__(self, device: str = "h100"):
        self.device_name = device
        try:
            from hlopt.cost_model import get_cost_model

            self.model = get_cost_model(device)
            spec = getattr(self.model, "device", None)
            if spec is None:  # a user model (cost_model.register_cost_model) without a DeviceSpec
                spec = get_cost_model("h100").device
            self.bandwidth = float(spec.hbm_bandwidth)
            self.fp32_flops = float(spec.fp32_flops)
            self.launch_us = float(spec.kernel_launch_us)
            self.sms = float(spec.sm_count)
            self.clock_hz = float(spec.clock_ghz) * 1e9
            self.lanes = float(getattr(spec, "fp32_lanes_per_sm", _LANES))
        except ImportError:  # pragma: no cover - cost_model is part of hlopt
            self.model = None
            self.bandwidth = self.H100_FALLBACK["hbm_bandwidth"]
            self.fp32_flops = self.H100_FALLBACK["fp32_flops"]
            self.launch_us = self.H100_FALLBACK["kernel_launch_us"]
            self.sms, self.clock_hz, self.lanes = 132.0, 1.98e9, float(_LANES)
        self._weighted = getattr(self.model, "weighted_kernel_time_us", None)
        #: the model's per-instruction XLA:GPU flops (`gpu_flops(inst)`), when it has them
        self.gpu_flops = getattr(self.model, "gpu_flops", None) if self._weighted is not None else None
        self.times: dict[int, float] = {}

    def kernel_time_us(self, compute: float, transcendentals: float, nbytes: float) -> float:
        """Roofline time of one kernel from its compute (FP32-op equivalents, see `instruction_flops`; plus
        transcendentals at a quarter of the FP32 rate) and bytes, launch overhead included: the model's
        `weighted_kernel_time_us` when it has one, else max(compute, memory) + launch."""
        compute = compute + 4.0 * transcendentals
        if self._weighted is not None:
            return float(self._weighted(compute, nbytes))
        return max(compute / self.fp32_flops, nbytes / self.bandwidth) * 1e6 + self.launch_us

    def emitter_time_us(self, compute: float, nbytes: float, blocks: int, threads: int = _LANES) -> float:
        """`kernel_time_us` of a kernel launching `blocks` thread blocks of `threads` threads: compute
        slows down when fewer blocks than SMs run or fewer threads than an SM's FP32 lanes (XLA's
        ComputeTime), bandwidth when the blocks cannot issue 32 B per SM per clock for HBM."""
        blocks = max(blocks, 1)
        compute_factor = self.sms / blocks if blocks < self.sms else 1.0
        if threads < self.lanes:
            compute_factor *= self.lanes / max(threads, 1)
        issue = blocks * 32.0 * self.clock_hz
        bytes_factor = self.bandwidth / issue if issue < self.bandwidth else 1.0
        return self.kernel_time_us(compute * compute_factor, 0.0, nbytes * bytes_factor)

    def time_us(self, inst: Instruction, prof: Profile) -> float:
        """Modeled time of `inst` as it is now (cached; `forget` it when it changes)."""
        t = self.times.get(inst.id)
        if t is None:
            t = self.times[inst.id] = self.emitter_time_us(
                prof.compute, self.read_bytes(inst, prof) + prof.out_bytes, prof.blocks, prof.threads)
        return t

    def forget(self, inst: Instruction) -> None:
        """Drop the cached time of a changed instruction."""
        self.times.pop(inst.id, None)

    @staticmethod
    def read_bytes(inst: Instruction, prof: Profile) -> float:
        """HBM bytes an instruction reads: each distinct operand once, up to its utilization."""
        per: dict[int, list[float]] = {}
        for op, u, b in zip(inst.operands, prof.util, prof.op_bytes, strict=False):
            k = op.id
            if k in per:
                per[k][0] += u
            else:
                per[k] = [u, b]
        return sum(b * min(u, 1.0) for u, b in per.values())

    def fused_time_us(self, producer: Instruction, p: Profile, consumer: Instruction, c: Profile,
                      multi_output: bool = False) -> float:
        """Modeled time of the one kernel computing `consumer` with `producer` fused in (and, for a
        multi-output fusion, also writing the producer's value)."""
        u = 0.0
        per: dict[int, list[float]] = {}
        for op, cu, b in zip(consumer.operands, c.util, c.op_bytes, strict=False):
            k = op.id
            if op is producer:
                u += cu
            elif k in per:
                per[k][0] += cu
            else:
                per[k] = [cu, b]
        out_bytes = c.out_bytes
        if c.inplace is not None and consumer.operands[c.inplace] is producer:
            out_bytes = float(_bytes(consumer.shape))
            u = max(u, 1.0)
        for op, pu, b in zip(producer.operands, p.util, p.op_bytes, strict=False):
            k = op.id
            if k in per:
                per[k][0] += pu * u
            else:
                per[k] = [pu * u, b]
        nbytes = out_bytes
        for x, b in per.values():
            nbytes += b * (x if x < 1.0 else 1.0)
        if multi_output:
            nbytes += p.out_bytes
            u = max(u, 1.0)
        grid = p if p.reduction_hero and not c.reduction_hero else c
        return self.emitter_time_us(c.compute + p.compute * u, nbytes, grid.blocks, grid.threads)


#: The adapter under the name the design notes use.
_FusionCostModel = FusionCostModel


# ----------------------------------------------------------------------------- rules


@dataclass(frozen=True, slots=True)
class Budgets:
    """XLA:GPU's limits on one fusion (the passes' options)."""

    max_operands_and_outputs: int = MAX_OPERANDS_AND_OUTPUTS
    max_unnested_reductions: int = MAX_UNNESTED_REDUCTIONS
    max_ir_size: int = MAX_IR_SIZE
    max_basic_block_splits: int = MAX_BASIC_BLOCK_SPLITS
    shared_memory_per_block: int = SHARED_MEMORY_PER_BLOCK


DEFAULT_BUDGETS = Budgets()


@dataclass(frozen=True)
class FusionPass(ModulePass):
    """What the fusion passes share: their options (the device whose cost model decides, XLA:GPU's
    budgets) and their runs: `fuse(module, run)` does the work with the per-run state of a `FusionRun`;
    `run_with_result` returns the explanation of every decision in its `PassResult` (and the pipeline in
    its `PipelineResult`)."""

    device: str = "h100"
    max_operands_and_outputs: int = MAX_OPERANDS_AND_OUTPUTS
    max_unnested_reductions: int = MAX_UNNESTED_REDUCTIONS
    max_ir_size: int = MAX_IR_SIZE
    max_basic_block_splits: int = MAX_BASIC_BLOCK_SPLITS
    shared_memory_per_block: int = SHARED_MEMORY_PER_BLOCK

    def budgets(self) -> Budgets:
        """The budget options as one object."""
        return Budgets(self.max_operands_and_outputs, self.max_unnested_reductions, self.max_ir_size,
                       self.max_basic_block_splits, self.shared_memory_per_block)

    @abstractmethod
    def fuse(self, module: Module, run: FusionRun) -> bool:
        """Fuse in `module` with the per-run state `run` (explanations go to `run.explain`); True iff changed."""

    def run_with_result(self, module: Module) -> PassResult:
        """Run on `module`; the result carries the explanation of every decision."""
        run = FusionRun(module, self.name, self.device)
        changed = self.fuse(module, run)
        run.finish()
        return PassResult(changed, run.explanations)

    def run(self, module: Module) -> bool:
        """Run on `module` (the explanations of this call stay readable through the deprecated
        `explanations` / `explain_lines()`; prefer `run_with_result`)."""
        result = self.run_with_result(module)
        object.__setattr__(self, "_deprecated_last_result", result)  # read only by the deprecated accessors
        return result.changed

    @property
    def explanations(self) -> list[Explanation]:
        """Deprecated: the explanations of this object's last direct `run()` call (runs inside a pipeline
        leave none here). Use `run_with_result(module).explanations` or the `PipelineResult`."""
        warnings.warn(f"{type(self).__name__}.explanations is deprecated: use run_with_result(module).explanations "
                      "or PipelineResult.explanations", DeprecationWarning, stacklevel=2)
        last = self.__dict__.get("_deprecated_last_result")
        return list(last.explanations) if last is not None else []

    def explain_lines(self) -> list[str]:
        """Deprecated: the lines of this object's last direct `run()` call. Use
        `run_with_result(module).explain_lines()` or `PipelineResult.explain_lines()`."""
        warnings.warn(f"{type(self).__name__}.explain_lines() is deprecated: use "
                      "run_with_result(module).explain_lines() or PipelineResult.explain_lines()",
                      DeprecationWarning, stacklevel=2)
        last = self.__dict__.get("_deprecated_last_result")
        return last.explain_lines() if last is not None else []


def budget_refusal(consumer: Instruction, c: Profile, producer: Instruction, p: Profile,
                   producer_consumer: bool = True, budgets: Budgets = DEFAULT_BUDGETS) -> str | None:
    """XLA's FusionFitsInBudget: shared memory, at most 8 unnested reductions, at most 96 operands
    and outputs (counted exactly only when the quick bound fails)."""
    if c.shared_memory + p.shared_memory > budgets.shared_memory_per_block:
        return f"shared memory would exceed {budgets.shared_memory_per_block} B"
    if c.unnested_reductions + p.unnested_reductions > budgets.max_unnested_reductions:
        return f"over {budgets.max_unnested_reductions} unnested reductions in one fusion"
    limit = budgets.max_operands_and_outputs
    outputs = _outputs(consumer) + _outputs(producer)
    if consumer.operand_count + producer.operand_count - 1 + outputs <= limit:
        return None
    operands = set(consumer.operands) | set(producer.operands)
    operands.discard(consumer)
    operands.discard(producer)
    if producer_consumer and len(operands) <= consumer.operand_count:
        return None
    if len(operands) + outputs > limit:
        return f"{len(operands)} operands + {outputs} outputs > {limit}"
    return None


def _outputs(inst: Instruction) -> int:
    return len(inst.shape.leaves()) if inst.shape.is_tuple else 1


def merged_too_large(producer: Instruction, p: Profile, consumer: Instruction, c: Profile,
                     budgets: Budgets = DEFAULT_BUDGETS) -> str | None:
    """GpuHloCostAnalysis::ProducerConsumerMergedTooLarge: the producer's code is replicated as often
    as the consumer emits its parameter; each block-splitting op doubles the code."""
    rep = 1.0
    if consumer.opcode == "fusion":
        rep = max((e for op, e in zip(consumer.operands, c.emitted, strict=False) if op is producer), default=1.0)
    splits = rep * p.bb_splits + c.bb_splits
    if splits > budgets.max_basic_block_splits:
        return f"code size: {splits:.0f} basic-block splits > {budgets.max_basic_block_splits}"
    size = (p.ir_size * rep + c.ir_size) * (2 ** splits)
    if size > budgets.max_ir_size:
        return f"code size: IR size {size:.0f} > {budgets.max_ir_size}"
    return None


def creates_heavy_computation(producer: Instruction, p: Profile, consumer: Instruction, c: Profile) -> bool:
    """XLA's CreatesHeavyComputation: an expensive-to-repeat producer into a consumer that reads its
    elements several times (broadcast, gather, overlapping windows) would be recomputed per read."""
    if not p.expensive_to_repeat:
        return False
    if consumer.opcode != "fusion":
        return _reads_elements_multiple_times(consumer)
    reads = _param_reads_multiple(consumer, c)
    return any(reads[i] for i, op in enumerate(consumer.operands) if op is producer)


def _inplace_root(inst: Instruction) -> Instruction | None:
    if inst.opcode in ("dynamic-update-slice", "scatter"):
        return inst
    if inst.opcode == "fusion":
        root = inst.attrs["calls"].root
        if root is not None and root.opcode in ("dynamic-update-slice", "scatter") \
                and root.operand(0).opcode == "parameter":
            return root
    return None


def _inplace_operand(inst: Instruction) -> Instruction | None:
    root = _inplace_root(inst)
    if root is None:
        return None
    if inst.opcode == "fusion":
        return inst.operand(root.operand(0).attrs["parameter_number"])
    return inst.operand(0)


def in_place_refusal(producer: Instruction, consumer: Instruction) -> str | None:
    """XLA's ShouldFuseInPlaceOp: the consumer updates a buffer in place; no other operand may alias it,
    and a non-elementwise producer may not read it (it would see the update)."""
    buf = _inplace_operand(consumer)
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
    buf = _inplace_operand(consumer)
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
    for inst in module.instructions():
        called = inst.called_computations
        if not called:
            continue
        if inst.opcode == "fusion":
            fused.update(called)
        elif inst.opcode not in _NOT_FUSED_CALLERS:
            excluded.update(called)
    return [c for c in module.computations_post_order()
            if c not in fused and c not in excluded and c.module is module]


# ----------------------------------------------------------------------------- building fusions

T = TypeVar("T")


class FusionRun:
    """The state of one run of a fusion pass, made by the run and dropped after it: nothing is kept
    between runs, neither in the pass object nor in this module, so one pass object may run on several
    modules at once (the hook's threads).

    It holds the cost model (made on first use), per-instruction flops keyed by instruction id, the fused
    computations made and dropped (put into `module.computations` at once by `finish`: inserting into a
    list of thousands one by one is quadratic), and the explanation of every decision.
    """

    def __init__(self, module: Module | None, pass_name: str = "", device: str = "h100"):
        self.module = module
        self.pass_name = pass_name
        self.device = device
        self.explanations: list[Explanation] = []
        #: new fused computation -> the computation calling it (in the module from `finish` on)
        self.new: dict[Computation, Computation] = {}
        self.dead: set[Computation] = set()
        #: fused computations whose parameters changed (renamed `param_<n>` at `finish`)
        self.touched: dict[Computation, None] = {}
        #: fused computations whose parameters already come first
        self.params_first: set[Computation] = set()
        self._cost: FusionCostModel | None = None
        self._flops: dict[int, tuple[float, float, float]] = {}

    @property
    def cost(self) -> FusionCostModel:
        """The cost model of this run's device."""
        if self._cost is None:
            self._cost = FusionCostModel(self.device)
        return self._cost

    def flops_of(self, inst: Instruction) -> tuple[float, float, float]:
        """`instruction_flops` with this run's cost model, cached by instruction id for the run."""
        got = self._flops.get(inst.id)
        if got is None:
            got = self._flops[inst.id] = instruction_flops(inst, self.cost.gpu_flops)
        return got

    def explain(self, computation: str, producer: str, consumers: tuple[str, ...], taken: bool, reason: str,
                gain_us: float | None = None) -> None:
        """Record one decision of this run."""
        self.explanations.append(Explanation(self.pass_name, computation, producer, consumers, taken, reason,
                                             gain_us))

    def finish(self) -> None:
        """Put the fused computations made in this run into `module.computations` (each before the
        computation that calls it), take out the dropped ones and name touched parameters `param_<n>`.
        Every fusion run ends with it; calling it again does nothing."""
        module = self.module
        if module is None or not (self.new or self.dead or self.touched):
            return
        for comp in self.new:
            comp.module = module
        for comp in self.touched:
            if comp.module is module:
                _name_parameters(comp, module)
        module.update_computations(self.new, self.dead)
        self.new, self.dead, self.touched = {}, set(), {}


def _edits_applied(build: Callable[..., T]) -> Callable[..., T]:
    """A fusion builder called without `run` gets a run of its own, finished before it returns (the new
    fused computations are in the module at once)."""

    @functools.wraps(build)
    def wrapper(*args: Any, run: FusionRun | None = None, **kwargs: Any) -> T:
        if run is not None:
            return build(*args, run=run, **kwargs)
        own = FusionRun(args[0].parent.module)
        out = build(*args, run=own, **kwargs)
        own.finish()
        return out

    return wrapper


def _fresh_name(module: Module, prefix: str) -> str:
    """`module.unique_name(prefix)` (kept as the name fusion code calls)."""
    return module.unique_name(prefix)


def _new_fused_computation(module: Module, caller: Computation, run: FusionRun) -> Computation:
    comp = Computation(_fresh_name(module, "fused_computation"))
    run.params_first.add(comp)  # its `module` is set at `finish`: names are noted once, by unique_name
    run.new[comp] = caller
    return comp


def _drop_computation(module: Module, comp: Computation, run: FusionRun) -> None:
    if run.new.pop(comp, None) is None and comp.module is module:
        run.dead.add(comp)
    comp.module = None


def _name_parameters(comp: Computation, module: Module) -> None:
    """Parameter n is called `param_n` (uniquified), as in XLA's fused computations."""
    for p in comp.parameters:
        n = p.attrs["parameter_number"]
        if p.name != f"param_{n}" and not p.name.startswith(f"param_{n}."):
            p.name = module.unique_name(f"param_{n}")


def _new_parameter(fused: Computation, number: int, shape: Shape | TupleShape, module: Module) -> Instruction:
    p = Instruction("parameter", _laid_out(shape), name=_fresh_name(module, f"param_{number}"),
                    parameter_number=number)
    first = fused.first_instruction
    fused.add(p, before=_first_non_parameter(fused) if first is not None else None)
    return p


def _first_non_parameter(fused: Computation) -> Instruction | None:
    x = fused.first_instruction
    while x is not None and x.opcode == "parameter":
        x = x.next_instruction
    return x


def _parameters_first(fused: Computation, run: FusionRun) -> None:
    """Put the parameters ahead of everything (XLA's own fused computations interleave them)."""
    if fused in run.params_first:
        return
    run.params_first.add(fused)
    x = _first_non_parameter(fused)
    while x is not None and x.opcode != "parameter":
        x = x.next_instruction
    if x is not None:
        order = fused.instructions
        fused.instructions = [i for i in order if i.opcode == "parameter"] + \
            [i for i in order if i.opcode != "parameter"]


def _clone_into(fused: Computation, inst: Instruction, operands: Sequence[Instruction], module: Module,
                before: Instruction | None, keep_name: bool) -> Instruction:
    name = inst.name if keep_name else _fresh_name(module, inst.name)
    clone = inst.clone(name=name, operands=operands)
    clone.shape = _laid_out(clone.shape)
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
    body = inst.clone(name=inst.name, operands=[params[o] for o in inst.operands])
    body.shape = _laid_out(body.shape)
    fused.add(body)
    fused.set_root(body)
    fusion = Instruction("fusion", _laid_out(inst.shape), list(params), name=module.unique_name("fusion"),
                         kind=fusion_kind(fused), calls=fused)
    if inst.metadata is not None:
        fusion.metadata = inst.metadata.copy()
    comp.add(fusion, before=inst)
    inst.replace_all_uses_with(fusion)
    comp.remove(inst)
    return fusion


@_edits_applied
def fuse_into_new_fusion(producer: Instruction, consumer: Instruction, last_use: bool,
                         constants: bool = False, *, run: FusionRun) -> Instruction:
    """Replace the lone `consumer` by a new fusion computing it with `producer` fused in (what
    `wrap_in_fusion` then `fuse_producer` do, without making and dropping the producer's parameter)."""
    comp = consumer.parent
    module = comp.module
    fused = _new_fused_computation(module, comp, run)
    fusion = Instruction("fusion", _laid_out(consumer.shape), (), name=_fresh_name(module, "fusion"),
                         kind="kLoop", calls=fused)
    comp.add(fusion, before=consumer)
    for op in consumer.operands:
        if op is not producer:
            _parameter_for(fusion, op)
    value = _inline_producer(fusion, producer, run, keep_name=last_use, constants=constants)
    ops = [value if op is producer else _parameter_for(fusion, op) for op in consumer.operands]
    body = consumer.clone(name=consumer.name, operands=ops)
    body.shape = _laid_out(body.shape)
    fused.add(body)
    fused.set_root(body)
    fusion.attrs["kind"] = fusion_kind(fused)
    if consumer.metadata is not None:
        fusion.metadata = consumer.metadata.copy()
    consumer.replace_all_uses_with(fusion)
    comp.remove(consumer)
    return fusion


def _parameter_for(fusion: Instruction, value: Instruction) -> Instruction:
    """The fused parameter bound to `value`, added if missing."""
    fused: Computation = fusion.attrs["calls"]
    for i, op in enumerate(fusion.operands):
        if op is value:
            return fused.parameter(i)
    n = fusion.operand_count
    p = _new_parameter(fused, n, value.shape, fusion.parent.module)
    fusion.add_operand(value)
    return p


def _remove_parameter(fusion: Instruction, index: int, run: FusionRun) -> None:
    """Drop an unused fused parameter and renumber the ones after it."""
    fused: Computation = fusion.attrs["calls"]
    fused.remove_parameter(index)
    fusion.remove_operand(index)
    run.touched[fused] = None


def _is_small_constant(inst: Instruction) -> bool:
    """XLA's IsSmallConstant: an array constant of at most one element."""
    return inst.opcode == "constant" and not inst.shape.is_tuple and inst.shape.numel <= 1


def _operand_value(fusion: Instruction, op: Instruction, anchor: Instruction | None, module: Module,
                   constants: dict[int, Instruction] | None) -> Instruction:
    """Inside `fusion`: a clone of `op` if it is a small constant (XLA fuses those into every fusible
    user anyway; `constants` holds the clones made so far), else the parameter bound to it."""
    if constants is not None and _is_small_constant(op) and op not in fusion.operands \
            and _inplace_operand(fusion) is not op:
        clone = constants.get(op.id)
        if clone is None:
            clone = constants[op.id] = op.clone(name=_fresh_name(module, op.name), operands=())
            fusion.attrs["calls"].add(clone, before=anchor)
        return clone
    return _parameter_for(fusion, op)


def _inline_producer(fusion: Instruction, producer: Instruction, run: FusionRun, keep_name: bool,
                     constants: bool = False) -> Instruction:
    """Clone `producer` (or merge its fused computation) into `fusion`; return the value it computes.
    New instructions go ahead of the fused computation's body, in order."""
    fused: Computation = fusion.attrs["calls"]
    module = fusion.parent.module
    _parameters_first(fused, run)
    anchor = _first_non_parameter(fused)
    clones: dict[int, Instruction] | None = {} if constants else None
    if producer.opcode != "fusion":
        ops = [_operand_value(fusion, op, anchor, module, clones) for op in producer.operands]
        return _clone_into(fused, producer, ops, module, anchor, keep_name)
    inner: Computation = producer.attrs["calls"]
    mapping: dict[Instruction, Instruction] = {}
    for inst in inner.instructions:
        if inst.opcode == "parameter":
            outer = producer.operand(inst.attrs["parameter_number"])
            mapping[inst] = _operand_value(fusion, outer, anchor, module, clones)
    if keep_name and inner in run.new:  # made by this run: called by one fusion alone, never shared
        return _move_body(inner, fused, mapping, anchor)
    for inst in inner.instructions:
        if inst.opcode != "parameter":
            mapping[inst] = _clone_into(fused, inst, [mapping[o] for o in inst.operands], module, anchor, keep_name)
    return mapping[inner.root]


def _move_body(inner: Computation, fused: Computation, params: dict[Instruction, Instruction],
               anchor: Instruction | None) -> Instruction:
    """Move the body of `inner` (a fused computation about to be dropped) into `fused` ahead of
    `anchor`, its parameters replaced by `params`; returns what its root computes. A producer's last
    use takes its instructions as they are instead of cloning them (same names, same result)."""
    body = [inst for inst in inner.instructions if inst.opcode != "parameter"]
    for inst in body:
        inner.move_to(inst, fused, before=anchor)
        if any(op in params for op in inst.operands):
            inst.replace_operands([params.get(op, op) for op in inst.operands])
    return params.get(inner.root, inner.root)


def _finish(fusion: Instruction) -> None:
    fusion.attrs["kind"] = fusion_kind(fusion.attrs["calls"])


@_edits_applied
def fuse_producer(fusion: Instruction, producer: Instruction, last_use: bool, constants: bool = False, *,
                  run: FusionRun) -> None:
    """Fuse `producer` into `fusion` (one of its users): the fusion computes the producer itself instead
    of reading it; a producer that is a fusion has its computation merged in. The producer stays in
    its computation (the caller removes it when unused); `last_use` keeps its instruction names;
    `constants` clones the producer's small-constant operands in instead of passing them in."""
    value = _inline_producer(fusion, producer, run, keep_name=last_use, constants=constants)
    fused: Computation = fusion.attrs["calls"]
    for i in range(fusion.operand_count - 1, -1, -1):
        if fusion.operand(i) is producer:
            param = fused.parameter(i)
            param.replace_all_uses_with(value)
            _remove_parameter(fusion, i, run)
    _finish(fusion)


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
    fused: Computation = fusion.attrs["calls"]
    for i in range(fusion.operand_count - 1, -1, -1):
        if fusion.operand(i) is producer:
            param = fused.parameter(i)
            param.replace_all_uses_with(value)
            _remove_parameter(fusion, i, run)
    if producer.shape.is_tuple:
        outs = {k: _add_output(fusion, value.operand(k)) for k in range(len(producer.shape.elements))}
        fused.remove(value) if value.user_count == 0 and value is not fused.root else None
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
def remove_fusion(inst: Instruction, *, run: FusionRun) -> None:
    """Remove an unused instruction; a fusion's computation goes with it."""
    comp = inst.parent
    called = inst.attrs.get("calls") if inst.opcode == "fusion" else None
    module = comp.module
    comp.remove(inst)
    if called is not None:
        _drop_computation(module, called, run)


# ----------------------------------------------------------------------------- explanations


@dataclass(slots=True)
class Explanation:
    """One fusion decision: a candidate taken or refused, with the rule or the modeled gain."""

    pass_name: str
    computation: str
    producer: str
    consumers: tuple[str, ...]
    taken: bool
    reason: str
    gain_us: float | None = None

    def __str__(self) -> str:
        into = f" into {', '.join('%' + c for c in self.consumers)}" if self.consumers else ""
        verb = "fused" if self.taken else "refused"
        gain = f"; modeled gain {self.gain_us:+.3f} us" if self.gain_us is not None else ""
        return f"[{self.pass_name}] {self.computation}: {verb} %{self.producer}{into}: {self.reason}{gain}"


def unique(xs: Iterable[Instruction]) -> list[Instruction]:
    """Distinct instructions, first occurrence order."""
    return list(dict.fromkeys(xs))


# ----------------------------------------------------------------------------- dot strength reduction

#: XLA:GPU's GpuAlgebraicSimplifier strength-reduces a dot with a vector operand when the unbatched
#: operand matrices hold fewer elements than this (IsMatrixMultiplicationTooSmallForRewriting).
DOT_STRENGTH_REDUCTION_THRESHOLD = 10_000_000
#: Result types reduced exactly as the dot accumulates (16-bit floats would need an f32 accumulator).
_REDUCIBLE_DOT_TYPES = frozenset({"f32", "f64", "s32", "s64", "u32", "u64"})


def _dot_dims(dot: Instruction) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    a = dot.attrs
    return (tuple(a.get("lhs_batch_dims", ())), tuple(a.get("lhs_contracting_dims", ())),
            tuple(a.get("rhs_batch_dims", ())), tuple(a.get("rhs_contracting_dims", ())))


def is_strength_reducible_dot(dot: Instruction) -> bool:
    """XLA:GPU's ShouldStrengthReduceDotToReduce: a dot one of whose operands has only batch and
    contracting dimensions (a vector per batch), and either both are vectors or the unbatched operand
    matrices are small (< 10M elements); XLA rewrites it into multiply + reduce before fusion."""
    if dot.opcode != "dot" or dot.shape.is_tuple or dot.operand_count != 2 or dot.attrs.get("sparsity"):
        return False
    if dot.has_control_dependencies:
        return False
    lhs, rhs = dot.operand(0).shape, dot.operand(1).shape
    if lhs.is_tuple or rhs.is_tuple or dot.shape.dtype not in _REDUCIBLE_DOT_TYPES:
        return False
    lb, lc, rb, rc = _dot_dims(dot)
    lhs_vector = len(lb) + len(lc) == lhs.rank
    rhs_vector = len(rb) + len(rc) == rhs.rank
    if not (lhs_vector or rhs_vector):
        return False
    if lhs_vector and rhs_vector:
        return True
    k = math.prod(lhs.dims[d] for d in lc)
    lhs_free = math.prod(s for i, s in enumerate(lhs.dims) if i not in lb and i not in lc)
    rhs_free = math.prod(s for i, s in enumerate(rhs.dims) if i not in rb and i not in rc)
    return (lhs_free + rhs_free) * k < DOT_STRENGTH_REDUCTION_THRESHOLD


def _add_computation(module: Module, dtype: str, before: Computation) -> Computation:
    """A new scalar `add` computation for the reduce that replaces a dot."""
    comp = Computation(module.unique_name(f"scalar_add_{dtype}"))
    module.add_computation(comp, before=before)
    x = comp.add(Instruction("parameter", Shape(dtype, ()), name=module.unique_name("lhs"), parameter_number=0))
    y = comp.add(Instruction("parameter", Shape(dtype, ()), name=module.unique_name("rhs"), parameter_number=1))
    comp.set_root(comp.add(Instruction("add", Shape(dtype, ()), [x, y], name=module.unique_name("add"))))
    return comp


def _transposed(comp: Computation, value: Instruction, perm: list[int], before: Instruction,
                module: Module) -> Instruction:
    """`value` with its dimensions permuted (`perm[i]` = operand dimension of output dimension i)."""
    if perm == sorted(perm):
        return value
    dims = tuple(value.shape.dims[i] for i in perm)
    return comp.add(Instruction("transpose", Shape(value.shape.dtype, dims).with_default_layout(), [value],
                                name=module.unique_name("transpose"), dimensions=tuple(perm)), before=before)


def _converted(comp: Computation, value: Instruction, dtype: str, before: Instruction, module: Module) -> Instruction:
    if value.shape.dtype == dtype:
        return value
    return comp.add(Instruction("convert", value.shape.with_dtype(dtype), [value],
                                name=module.unique_name("convert")), before=before)


def strength_reduce_dot(dot: Instruction) -> Instruction:
    """Replace a strength-reducible dot by reduce(multiply(broadcast(vector), matrix)) over the
    contracting dimensions, keeping the matrix operand's dimension order (what XLA's AlgebraicSimplifier
    does before XLA:GPU fuses); a transpose restores the dot's output order when needed. Returns the
    instruction that replaces the dot."""
    from hlopt.hlo.literal import Literal

    comp = dot.parent
    module = comp.module
    lb, lc, rb, rc = _dot_dims(dot)
    lhs_vector = len(lb) + len(lc) == dot.operand(0).shape.rank
    rhs_vector = len(rb) + len(rc) == dot.operand(1).shape.rank
    if lhs_vector and not rhs_vector:  # the matrix side keeps its order; the vector is broadcast
        vec, mat, vb, vc, mb, mc = dot.operand(0), dot.operand(1), lb, lc, rb, rc
    else:
        vec, mat, vb, vc, mb, mc = dot.operand(1), dot.operand(0), rb, rc, lb, lc
    dtype = dot.shape.dtype
    targets = {**dict(zip(vb, mb, strict=True)), **dict(zip(vc, mc, strict=True))}  # vector dim -> matrix dim
    order = sorted(range(vec.shape.rank), key=lambda d: targets[d])
    v = _converted(comp, _transposed(comp, vec, order, dot, module), dtype, dot, module)
    bcast = comp.add(Instruction("broadcast", mat.shape.with_dtype(dtype).with_default_layout(), [v],
                                 name=module.unique_name("broadcast"),
                                 dimensions=tuple(sorted(targets.values()))), before=dot)
    m = _converted(comp, mat, dtype, dot, module)
    a, b = (bcast, m) if vec is dot.operand(0) else (m, bcast)
    mul = comp.add(Instruction("multiply", bcast.shape, [a, b], name=module.unique_name("multiply")), before=dot)
    zero = comp.add(Instruction("constant", Shape(dtype, ()), name=module.unique_name("constant"),
                                literal=Literal("0", Shape(dtype, ()))), before=dot)
    kept = [d for d in range(mat.shape.rank) if d not in mc]
    out = Shape(dtype, tuple(mat.shape.dims[d] for d in kept)).with_default_layout()
    value = comp.add(Instruction("reduce", out, [mul, zero], name=module.unique_name("reduce"),
                                 dimensions=tuple(sorted(mc)), to_apply=_add_computation(module, dtype, comp)),
                     before=dot)
    wanted = list(mb) + [d for d in kept if d not in mb]  # the dot's order: batch, then free dimensions
    value = _transposed(comp, value, [kept.index(d) for d in wanted], dot, module)
    value.shape = dot.shape
    if dot.metadata is not None:
        value.metadata = dot.metadata.copy()
    dot.replace_all_uses_with(value)
    comp.remove(dot)
    return value


# ----------------------------------------------------------------------------- select-and-scatter


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
    """Replace select-and-scatter by what XLA:GPU's SelectAndScatterExpander makes of it before fusion:
    a variadic reduce-window over (operand, one iota per dimension) picking each window's selected
    element and its index, the indices concatenated into [N, rank], and a scatter (ScatterSimplifier's
    canonical form) of the source into a broadcast of the init value. Returns the scatter."""
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
    sas.replace_all_uses_with(scatter)
    comp.remove(sas)
    return scatter
