"""How many thread blocks and threads per block XLA:GPU launches for a kernel.

The roofline needs the grid: a kernel with few blocks cannot use every SM or saturate HBM. These follow
XLA:GPU's emitters (xla/backends/gpu/codegen/emitters: loop, reduction, transpose, concatenate, scatter,
in-place dynamic-update-slice; Triton fusions from their block-level config), simplified where the exact
choice depends on vectorization details. `emitter_kind` classifies a fusion (or an unfused instruction,
treated as a one-instruction kernel) the way XLA's HloFusionAnalysis does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hlopt.cost_model.analysis import elements, is_elementwise, transpose_is_bitcast
from hlopt.cost_model.devices import DeviceSpec
from hlopt.hlo.ir import Computation, Instruction
from hlopt.hlo.shape import Shape, TupleShape

__all__ = ["LaunchDims", "emitter_kind", "transpose_tiling", "normalized_transpose", "launch_dims", "roots_of", "reduction_dims", "backend_kind",
           "GEMM_KINDS", "is_gemm_kernel", "ceil_div", "loop_dims"]

#: Fusion backend kinds that are GEMMs (Triton or library calls).
GEMM_KINDS = frozenset({"__triton_gemm", "__triton_nested_gemm_fusion", "__triton_scaled_dot_fusion",
                        "__cudnn$fusion", "__cublas"})
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cudnn$conv", "__cudnn$fusion")
#: XLA's xla_gpu_gemm_rewrite_size_threshold: smaller dots stay with the elemental (loop) emitter.
GEMM_REWRITE_SIZE_THRESHOLD = 100
#: XLA's MinThreadsXRowReduction: 1024 threads reduce a row (512 only with a ptxas older than 12.2; the CUDA 12
#: plugin's deviceless compiles rate a 16384-element row reduction as one block of 1024 threads, not two of 512).
_ROW_MAX_THREADS = 1024
#: XLA's RowReductionFusion: minor reduced elements per thread (kMinorReducedElementsPerThread).
_ROW_ELEMENTS_PER_THREAD = 16
_TILE = 32
#: XLA's transpose emitters: threads per block (8 rows of 32), kMinDimensionToTransposeTiled,
#: kMaxBitsInMostMinorDimension, shared-memory banks and their width.
_TRANSPOSE_THREADS = 256
_TILED_MIN = 16
_MAX_MINOR_BITS = 64
_SHMEM_BANKS = 32
_BANK_BITS = 32


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for positive b."""
    return -(-a // b)


@dataclass(frozen=True)
class LaunchDims:
    """A kernel's grid and the emitter that chose it."""

    blocks: int
    threads_per_block: int
    emitter: str

    @property
    def threads(self) -> int:
        """Threads in the grid."""
        return self.blocks * self.threads_per_block


def backend_kind(inst: Instruction) -> str:
    """`fusion_backend_config.kind` of a fusion's backend config ('' when none)."""
    cfg = _config(inst)
    return str(cfg.get("fusion_backend_config", {}).get("kind", ""))


def _config(inst: Instruction) -> dict:
    return inst.backend_config_dict()


def roots_of(comp: Computation) -> list[Instruction]:
    """The fusion roots: the root, or the operands of a tuple root."""
    root = comp.root
    return list(root.operands) if root.opcode == "tuple" else [root]


def _first_array(shape: Shape | TupleShape) -> Shape:
    while shape.is_tuple:
        shape = shape.elements[0]
    return shape


def _dot_is_gemm(dot: Instruction) -> bool:
    """XLA rewrites a dot into a GEMM unless its non-batch operand elements are below the threshold."""
    total = 0
    for i, batch in enumerate(("lhs_batch_dims", "rhs_batch_dims")):
        shape = dot.operand(i).shape
        skip = set(dot.attrs.get(batch, ()))
        total += math.prod(d for j, d in enumerate(shape.dims) if j not in skip)
    return total >= GEMM_REWRITE_SIZE_THRESHOLD


def is_gemm_kernel(inst: Instruction) -> bool:
    """A GEMM or convolution that runs on tensor cores (Triton/cuBLAS/cuDNN, or a large-enough dot)."""
    op = inst.opcode
    if op == "fusion":
        return backend_kind(inst) in GEMM_KINDS
    if op == "custom-call":
        return str(inst.attrs.get("custom_call_target", "")).startswith(_GEMM_TARGETS)
    if op == "dot":
        return _dot_is_gemm(inst)
    return op == "convolution"


# ------------------------------------------------------------------------------------ classification


def reduction_dims(reduce: Instruction) -> tuple[bool, tuple[int, int, int]]:
    """XLA's ReductionDimensions: (is_row_reduction, 3 sizes). Row: [major reduced, kept, minor reduced];
    column: [major kept, reduced, minor kept]. Dimensions are taken in physical (layout) order."""
    shape = reduce.operand(0).shape
    reduced = set(reduce.attrs.get("dimensions", ()))
    order = _physical_major_to_minor(shape)
    kept = [d for d in order if d not in reduced and shape.dims[d] != 1]
    if not kept:
        return True, (1, 1, shape.numel)
    groups: list[tuple[bool, int]] = []  # (is_reduced, size) runs, major to minor
    for d in order:
        if shape.dims[d] == 1:
            continue
        is_red = d in reduced
        if groups and groups[-1][0] == is_red:
            groups[-1] = (is_red, groups[-1][1] * shape.dims[d])
        else:
            groups.append((is_red, shape.dims[d]))
    if len([g for g in groups if not g[0]]) == 1:
        major = groups[0][1] if groups[0][0] else 1
        minor = groups[-1][1] if groups[-1][0] else 1
        kept_size = next(g[1] for g in groups if not g[0])
        if minor == 1:
            return False, (1, major, kept_size)
        return True, (major, kept_size, minor)
    # kept dims on both sides of the reduced ones: a column reduction
    first_red = next(i for i, g in enumerate(groups) if g[0])
    major = math.prod(g[1] for g in groups[:first_red])
    red = math.prod(g[1] for g in groups[first_red:] if g[0])
    minor = math.prod(g[1] for g in groups[first_red:] if not g[0])
    return False, (major, red, minor)


def _physical_major_to_minor(shape: Shape) -> list[int]:
    if shape.layout is not None and len(shape.layout.minor_to_major) == shape.rank:
        return list(reversed(shape.layout.minor_to_major))
    return list(range(shape.rank))


def _is_real_reduction(reduce: Instruction, device: DeviceSpec) -> bool:
    """XLA's IsRealReductionHero: the tiled reduction emitter beats the elemental one."""
    row, dims = reduction_dims(reduce)
    warp = device.threads_per_warp
    if row:
        return dims[2] >= warp or warp % dims[2] == 0
    major, minor = dims[1], dims[2]
    elemental = (major < warp or (major < 2 * warp and minor < warp) or (major < 4 * warp and minor < 8)
                 or (major < 8 * warp and minor < 3))
    return not elemental


def _root_hero_candidates(comp: Computation) -> set[Instruction]:
    """What XLA may take for the heroes of the fusion's roots (FindNonTrivialHero): the roots and what they read
    through elementwise ops, bitcasts and reshapes. A transpose behind a concatenate, a pad, a slice or a reduce
    is no root's hero: XLA's tiled transpose emitter does not run for it (the concatenate or loop emitter reads
    it, uncoalesced)."""
    seen: set[Instruction] = set()
    work = list(roots_of(comp))
    while work:
        inst = work.pop()
        if inst in seen:
            continue
        seen.add(inst)
        if inst.opcode in ("bitcast", "reshape", "tuple") or (is_elementwise(inst) and inst.opcode != "fusion"):
            work.extend(inst.operands)
    return seen


def _tiled_transpose(comp: Computation) -> Instruction | None:
    """A transpose (or layout-changing copy) XLA's transpose emitter tiles (`transpose_tiling`), a root's hero."""
    heroes = _root_hero_candidates(comp)
    for inst in comp.instructions:
        if inst.opcode == "transpose" and inst in heroes and not transpose_is_bitcast(inst) \
                and transpose_tiling(inst) is not None:
            return inst
    return None


def normalized_transpose(transpose: Instruction) -> tuple[list[int], list[int]]:
    """XLA's GetNormalizedLogicalTransposeShape, in physical (layout) order: the output's dimensions with the
    size-1 ones dropped and each run of output dimensions that stay adjacent in the input merged into one,
    and the permutation (output dimension i reads input dimension perm[i]) over those. A [32,3,3,3] ->
    [3,3,3,32] transpose is [27,32] <- [32,27]: a 2-D transpose of 27 and 32, not of 3 and 32."""
    src, out = transpose.operand(0).shape, transpose.shape
    perm = tuple(transpose.attrs.get("dimensions", ()))
    in_pos = {d: i for i, d in enumerate(_physical_major_to_minor(src))}
    phys = [(out.dims[d], in_pos[perm[d]]) for d in _physical_major_to_minor(out) if out.dims[d] != 1]
    dims: list[int] = []
    sources: list[int] = []
    for size, at in phys:
        # input dimensions of size 1 between two kept ones do not break adjacency
        if sources and all(src.dims[_physical_major_to_minor(src)[k]] == 1 for k in range(sources[-1] + 1, at)) \
                and at > sources[-1]:
            dims[-1] *= size
            sources[-1] = at
            continue
        dims.append(size)
        sources.append(at)
    order = sorted(range(len(sources)), key=lambda i: sources[i])
    rank_of = {i: r for r, i in enumerate(order)}
    return dims, [rank_of[i] for i in range(len(sources))]


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _packed_transpose_blocks(dims: list[int], perm: list[int], bits: int) -> int | None:
    """XLA's packed transpose emitter (GetPackedTransposeTileSizes) for elements narrower than a shared-memory
    bank: its number of blocks, or None when it does not apply."""
    if bits >= _BANK_BITS:
        return None
    out, cperm = list(dims), list(perm)
    if cperm[-1] != len(out) - 1:  # the minor dimension is transposed: a size-1 B dimension
        cperm.append(len(out))
        out.append(1)
    rank = len(out)
    if rank < 3:
        return None
    if cperm[rank - 3] != rank - 3:  # a size-1 A dimension
        out.insert(rank - 2, 1)
        cperm = [p + 1 if p > rank - 3 else p for p in cperm]
        cperm.insert(rank - 2, rank - 2)
    inv = _inverse(cperm)
    cin = [out[inv[i]] for i in range(len(out))]
    crank = len(cin)
    t1, t2, a, b = cin[crank - 2], cin[cperm[crank - 2]], cin[crank - 3], cin[-1]
    vec = _BANK_BITS // max(bits, 1)
    shmem = _SHMEM_BANKS * vec
    tile_t1 = min(t1, shmem)
    tile_a = min(a, shmem // tile_t1)
    tile_t2 = min(t2, shmem)
    rows, cols = tile_t2, tile_a * tile_t1
    if cols < 10 * vec or rows < 10 * vec or b != 1 or rows % vec or cols % vec or t2 % tile_t2 % vec:
        return None
    tile = [1] * crank
    tile[inv[crank - 2]] = tile_t1
    tile[crank - 2] = tile_t2
    tile[crank - 3] = tile_a
    return math.prod(ceil_div(d, t) for d, t in zip(out, tile, strict=True))


def transpose_tiling(transpose: Instruction) -> LaunchDims | None:
    """XLA's GetDescriptionForTiledTransposeEmitter on the normalized transpose (`normalized_transpose`) and
    the grid its emitter launches (256 threads a block), or None when XLA leaves the transpose to the loop
    emitter. Three forms: the packed transpose (elements under 32 bits, tiles of 32 x 32 banks); a transpose
    that keeps the minor dimension (a tile of 32 x 32 x that dimension, when that dimension is at most 64 bits
    and the swapped ones wide enough); a transpose of the minor dimension (32 x 32 tiles, both swapped
    dimensions at least 16, or at least 8 with 64 x 128 elements)."""
    src = transpose.operand(0).shape
    if src.is_tuple or transpose.shape.is_tuple:
        return None
    dims, perm = normalized_transpose(transpose)
    if len(perm) < 2:
        return None
    bits = transpose.shape.element_type.bits
    in_dims = [dims[i] for i in _inverse(perm)]
    packed = _packed_transpose_blocks(dims, perm, bits)
    if packed is not None:
        return LaunchDims(packed, _TRANSPOSE_THREADS, "transpose")
    block = [1] * len(in_dims)
    if perm[-1] == len(perm) - 1:  # the minor dimension stays: it goes whole into each tile
        if bits * dims[-1] > _MAX_MINOR_BITS or bits * dims[-1] * min(in_dims[-2], dims[-2]) < 8 * _TILED_MIN:
            return None
        block[-1] = in_dims[-1]
        block[-2] = _TILE
        block[perm[-2]] = _TILE
    else:
        a, b = in_dims[-1], dims[-1]
        if not ((a >= _TILED_MIN and b >= _TILED_MIN) or (a >= 8 and b >= 8 and a * b >= 64 * 128)) or bits == 4:
            return None
        block[-1] = _TILE
        block[perm[-1]] = _TILE
    blocks = math.prod(ceil_div(d, t) for d, t in zip(in_dims, block, strict=True))
    return LaunchDims(blocks, _TRANSPOSE_THREADS, "transpose")


def emitter_kind(inst: Instruction, device: DeviceSpec) -> str:
    """Which emitter runs the kernel: gemm, triton, custom, reduction, transpose, scatter, concatenate,
    dus (in-place dynamic-update-slice), loop, or none (no kernel)."""
    if is_gemm_kernel(inst):
        return "gemm"
    if inst.opcode != "fusion":
        return _unfused_kind(inst, device)
    kind = backend_kind(inst)
    if kind.startswith("__triton"):
        return "triton"
    if str(inst.attrs.get("kind", "")) == "kCustom":
        return "custom"
    comp: Computation = inst.attrs["calls"]
    roots = roots_of(comp)
    for r in comp.instructions:
        if r.opcode == "reduce" and _is_real_reduction(r, device):
            return "reduction"
    if _tiled_transpose(comp) is not None:
        return "transpose"
    if len(roots) == 1 and roots[0].opcode == "scatter":
        return "scatter"
    if len(roots) == 1 and roots[0].opcode == "concatenate":
        return "concatenate"
    if all(r.opcode == "dynamic-update-slice" for r in roots):
        return "dus"
    return "loop"


def _unfused_kind(inst: Instruction, device: DeviceSpec) -> str:
    op = inst.opcode
    if op == "reduce" and _is_real_reduction(inst, device):
        return "reduction"
    if op == "transpose":
        if transpose_is_bitcast(inst):
            return "none"
        return "transpose" if transpose_tiling(inst) is not None else "loop"
    if op in ("scatter", "concatenate"):
        return op
    if op == "dynamic-update-slice":
        return "dus"
    if op == "custom-call":
        return "custom"
    return "loop"


# ------------------------------------------------------------------------------------- launch dims


def loop_dims(shape: Shape | TupleShape, device: DeviceSpec, unroll: int = 1, emitter: str = "loop") -> LaunchDims:
    """XLA's CalculateLaunchDimensions: up to 128 threads per block, one (unrolled) element per thread."""
    n = _first_array(shape).numel if shape.is_tuple else shape.numel
    if n <= 1:
        return LaunchDims(1, 1, emitter)
    n = ceil_div(n, unroll)
    tpb = min(n, device.threads_per_warp * 4)
    return LaunchDims(ceil_div(n, tpb), tpb, emitter)


def _unroll(shape: Shape | TupleShape, device: DeviceSpec) -> int:
    """Loop unrolling for outputs larger than the GPU's thread capacity (XLA's ComputeMaxUnrollFactor)."""
    n = _first_array(shape).numel
    if n < device.threads_per_sm_limit * device.sm_count:
        return 1
    for u in (4, 2):
        if n % u == 0:
            return u
    return 1


def _vector_size(minor: int, threads: int, bits: int) -> int:
    if bits >= 64:
        return 1
    for v in ((2,) if bits >= 32 else (4, 2)):
        if minor % (threads * v) == 0:
            return v
    return 1


def _row_reduction(dims: tuple[int, int, int], bits: int, device: DeviceSpec) -> LaunchDims:
    _, kept, red = dims
    warp = device.threads_per_warp
    if red & (red - 1) == 0:  # power of two: maybe the multi-row emitter
        vec = min(red, max(64 // max(bits, 1), 1))
        if bits >= 32:
            vec = min(max(128 // bits, 1), vec)
        while vec > 1 and ceil_div(kept, _multi_row_threads(kept, red // vec)[0]) < device.sm_count:
            vec //= 2
        if red <= warp * vec:
            n_kept, n_red = _multi_row_threads(kept, red // vec)
            return LaunchDims(ceil_div(kept, n_kept), n_kept * n_red, "reduction")
    n_red = min(_ROW_MAX_THREADS, ceil_div(ceil_div(red, _ROW_ELEMENTS_PER_THREAD), warp) * warp)
    n_kept = 1
    if n_red * 2 <= 256:
        n_kept = kept if kept * n_red <= 256 else 256 // n_red
    vec = _vector_size(red, n_red, bits)
    tile = min(_ROW_ELEMENTS_PER_THREAD // vec, ceil_div((red // vec), n_red))
    blocks = ceil_div(kept, n_kept) * ceil_div((red // vec), (tile * n_red))
    return LaunchDims(blocks, n_kept * n_red, "reduction")


def _multi_row_threads(kept: int, n_red: int) -> tuple[int, int]:
    n_kept = kept if kept * n_red <= 256 else max(256 // max(n_red, 1), 1)
    return n_kept, n_red


def _column_reduction(dims: tuple[int, int, int], bits: int, device: DeviceSpec) -> LaunchDims:
    major, _, minor = dims
    warp = device.threads_per_warp
    if warp % minor == 0:
        return LaunchDims(major, 128, "reduction")
    vec = _vector_size(minor, _TILE, bits)
    return LaunchDims(major * ceil_div(minor, (_TILE * vec)), _TILE * _TILE, "reduction")


def reduction_launch(reduce: Instruction, device: DeviceSpec) -> LaunchDims:
    """The reduction emitter's grid (row, multi-row, column or small-column reduction)."""
    row, dims = reduction_dims(reduce)
    bits = reduce.operand(0).shape.element_type.bits
    return _row_reduction(dims, bits, device) if row else _column_reduction(dims, bits, device)


def _triton_launch(inst: Instruction, root_shape: Shape) -> LaunchDims | None:
    cfg = _config(inst).get("fusion_backend_config", {}).get("block_level_fusion_config", {})
    tiles = cfg.get("output_tiles") or ([{"sizes": cfg["output_tile_sizes"]}] if "output_tile_sizes" in cfg else [])
    if not tiles:
        return None
    sizes = [int(s) for s in tiles[0].get("sizes", [])]
    blocks = 1
    for d, t in zip(root_shape.dims, sizes, strict=False):
        blocks *= ceil_div(d, max(t, 1))
    return LaunchDims(max(blocks, 1), int(cfg.get("num_warps", 4)) * 32, "triton")


def launch_dims(inst: Instruction, device: DeviceSpec, kind: str | None = None) -> LaunchDims:
    """The grid of the kernel `inst` launches (a fusion, or an unfused instruction)."""
    kind = kind or emitter_kind(inst, device)
    comp: Computation | None = inst.attrs.get("calls") if inst.opcode == "fusion" else None
    roots = roots_of(comp) if comp is not None else [inst]
    root_shape = _first_array(roots[0].shape)
    if kind in ("triton", "gemm"):
        got = _triton_launch(inst, root_shape) if inst.opcode == "fusion" else None
        if got is not None:
            return got
        return LaunchDims(max(ceil_div(root_shape.numel, 128), 1), 128, kind)
    if kind == "custom":
        n = elements(roots[0].shape)
        return LaunchDims(max(ceil_div(n, 128), 1), 128, "custom")
    if kind == "reduction":
        hero = next((i for i in (comp.instructions if comp is not None else [inst])
                     if i.opcode == "reduce" and _is_real_reduction(i, device)), None)
        if hero is not None:
            return reduction_launch(hero, device)
    if kind == "transpose":
        hero = _tiled_transpose(comp) if comp is not None else inst
        got = transpose_tiling(hero) if hero is not None else None
        if got is not None:
            return got
    if kind == "concatenate":
        largest = max(roots[0].operands, key=lambda o: o.shape.numel)
        return loop_dims(largest.shape, device, _unroll(largest.shape, device), "concatenate")
    if kind == "scatter":
        return loop_dims(roots[0].operands[-1].shape, device, 1, "scatter")
    if kind == "dus":
        update = max((r.operand(1) for r in roots), key=lambda o: o.shape.numel)
        return loop_dims(update.shape, device, 1, "dus")
    shape = roots[0].shape
    return loop_dims(shape, device, _unroll(shape, device), "loop")

