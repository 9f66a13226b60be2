"""Fusion costs: every instruction's `Profile` (flops, per-operand utilization and times-emitted, output
bytes, IR size, budget counters), computed from a fused computation with XLA's "elementwise use roots"
propagation (GpuHloCostAnalysis), so that a producer/consumer pair can be costed without building it, and
`FusionCostModel`, fusion's view of `cost_model` (a kernel's time, a producer+consumer fusion's time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hlopt.cost_model.analysis import ELEMENTWISE_OPS
from hlopt.hlo.ir import Computation, Instruction
from hlopt.hlo.structure import StructureKeys, shared_keys
from hlopt.passes.fusion.fusion_rules import (
    EW,
    SIGNIFICANT_REDUCE,
    SPLITS_BLOCKS,
    byte_size,
    element_count,
    fusion_kind,
    fusion_roots,
    is_row_reduction,
    is_tiled_transpose,
    is_unnested_reduction,
    reduction_groups,
    reduction_hero,
)

__all__ = [
    "reads_elements_multiple_times", "Profile", "XLA_OP_COST", "FULL_DEVICE_THREADS", "instruction_flops",
    "FlopsSource", "InstructionFlops", "merge_profiles", "profile_of", "param_reads_multiple",
    "FusionCostModel", "_FusionCostModel",
]

# ----------------------------------------------------------------------------- profiles


def _operand_utilization(inst: Instruction, i: int) -> float:
    """Elements of operand i read per element of the operand, to compute the whole output once."""
    op = inst.opcode
    operand = inst.operand(i).shape
    n_in = max(element_count(operand), 1)
    if op == "broadcast":
        return element_count(inst.shape) / n_in
    if op in ("slice", "dynamic-slice", "gather") and i == 0:
        return element_count(inst.shape) / n_in
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


def reads_elements_multiple_times(inst: Instruction) -> bool:
    """XLA's IfFusedReadsElementsMultipleTimes."""
    if inst.opcode in ("gather", "broadcast"):
        return element_count(inst.shape) > element_count(inst.operand(0).shape)
    if inst.opcode == "reduce-window":
        window = inst.attrs.get("window")
        return window is not None and any(d.size > d.stride for d in window.dims)
    return False


def _shared_memory(inst: Instruction) -> int:
    """XLA's SharedMemoryUsage of one unfused instruction."""
    if inst.opcode == "reduce" and is_unnested_reduction(inst):
        n = max(inst.operand_count // 2, 1)
        elem = sum(max(inst.operand(i).shape.element_type.bits // 8, 1) for i in range(n))
        return 32 * elem if is_row_reduction(inst) else 32 * (4 * 32 + 1) * elem
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
#: measured with XLA:GPU deviceless (hlopt.runtime.xla_gpu_path.xla_gpu) on 10-op chains over 256K elements; other
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
    and the model's quarter rate for other transcendentals. `InstructionFlops` caches it (a fusion run owns one)."""
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
        compute = per * element_count(inst.shape) if per is not None else c.flops + 4.0 * c.transcendentals
    return c.flops, c.transcendentals, compute


def _blocks(hero: Instruction | None, out_elements: int) -> int:
    """Thread blocks the kernel's emitter launches (fitted on XLA:GPU's default model, H100): a column
    reduction one per 64 kept minor columns (times the kept major extent), a row reduction one per
    clamp(4096 / row length, 1, 8) rows, a loop one per 128 output elements (512 once it unrolls)."""
    if hero is not None and hero.opcode == "reduce":
        groups = reduction_groups(hero) or []
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


#: Opcodes whose `instruction_flops` is a function of the opcode, the result shape and the operand shapes
#: (layouts and element types included) alone: elementwise ops (XLA's per-element counts), data movement
#: and leaves. Not `map` (its computation), nor anything with attributes that change the count.
_SHAPE_DETERMINED = (ELEMENTWISE_OPS - {"map"}) | {"copy", "broadcast", "reshape", "bitcast", "parameter"}


class FlopsSource(Protocol):
    """Where profiles get an instruction's (flops, transcendentals, compute): a `FusionRun`, or
    `InstructionFlops` outside a run."""

    def flops_of(self, inst: Instruction) -> tuple[float, float, float]:
        """`instruction_flops` of `inst` under some cost model."""


class InstructionFlops:
    """`instruction_flops` under one device's cost model, cached by instruction id for as long as this
    object lives (a fusion run owns one; the instructions must not change meanwhile)."""

    def __init__(self, device: str = "h100", cost: FusionCostModel | None = None, keys: StructureKeys | None = None):
        self.device = device
        self._cost = cost
        self._cache: dict[int, tuple[float, float, float]] = {}
        self._by_shapes: dict[tuple, tuple[float, float, float]] = {}
        #: the other ops (a reduce, a dot, a slice) by their structure: the module's keys in a fusion run
        self._keys = keys if keys is not None else StructureKeys()
        #: a fusion's walked Profile by the fusion's structural key (`hlo.structure`): everything the walk
        #: reads (fused computation, operand and result shapes) is in the key, so the fusion of every layer
        #: is walked once; Profiles are not changed once made (`param_reads_multiple` is structural too)
        self._fusion_profiles: dict[tuple, Profile] = {}
        self._single_profiles: dict[tuple, Profile] = {}  # likewise an unfused instruction's

    @property
    def cost(self) -> FusionCostModel:
        """The cost model (made on first use)."""
        if self._cost is None:
            self._cost = FusionCostModel(self.device)
        return self._cost

    def fusion_profile(self, fusion: Instruction) -> Profile:
        """The walked Profile of `fusion` (`_fusion_profile`), remembered by the fusion's structure."""
        return self._by_structure(self._fusion_profiles, fusion, _fusion_profile)

    def single_profile(self, inst: Instruction) -> Profile:
        """The Profile of an unfused instruction (`_single_profile`), remembered by its structural key: it reads
        the instruction's opcode, shapes and attributes and its operands' shapes, all in the key."""
        return self._by_structure(self._single_profiles, inst, _single_profile)

    def _by_structure(self, memo: dict[tuple, Profile], inst: Instruction,
                      walk: Callable[[Instruction, FlopsSource], Profile]) -> Profile:
        """`walk(inst, self)`, remembered in `memo` by `inst`'s structural key."""
        try:
            key = self._keys.of(inst)
            got = memo.get(key)
        except TypeError:  # an attribute value that is not hashable even as its parts
            return walk(inst, self)
        if got is None:
            got = memo[key] = walk(inst, self)
        return got

    def flops_of(self, inst: Instruction) -> tuple[float, float, float]:
        """`instruction_flops(inst)` with this cost model's XLA:GPU flops, cached: by id, and for the ops
        whose count follows from opcode and shapes alone (`_SHAPE_DETERMINED`) by those, so that the
        clones fusion makes of one instruction, and the same op repeated layer after layer, are counted once;
        the other ops (but fusions) by their structure (`hlo.structure`: attributes and called computations
        included), which is all the count reads."""
        got = self._cache.get(inst.id)
        if got is None:
            op = inst.opcode
            if op in _SHAPE_DETERMINED:
                key = (op, inst.shape, *(o.shape for o in inst.operands))
                got = self._by_shapes.get(key)
                if got is None:
                    got = self._by_shapes[key] = instruction_flops(inst, self.cost.gpu_flops)
            elif op != "fusion":
                try:
                    key = self._keys.of(inst)
                    got = self._by_shapes.get(key)
                except TypeError:  # an attribute value that is not hashable even as its parts
                    key = None
                if got is None:
                    got = instruction_flops(inst, self.cost.gpu_flops)
                    if key is not None:
                        self._by_shapes[key] = got
            else:
                got = instruction_flops(inst, self.cost.gpu_flops)
            self._cache[inst.id] = got
        return got


def _single_profile(inst: Instruction, run: FlopsSource) -> Profile:
    flops, trans, compute = run.flops_of(inst)
    n = inst.operand_count
    util = [_operand_utilization(inst, i) for i in range(n)]
    out_bytes = float(byte_size(inst.shape))
    inplace = None
    if inst.opcode in ("dynamic-update-slice", "scatter") and not inst.shape.is_tuple:
        inplace = 0
        util[0] = 0.0
        update = inst.operand(1 if inst.opcode == "dynamic-update-slice" else 2).shape
        out_bytes = float(byte_size(update))
    hero = inst.opcode == "reduce" and is_unnested_reduction(inst)
    kind = "kInput" if hero or is_tiled_transpose(inst) or inst.opcode == "scatter" or (
        inst.opcode == "concatenate" and n <= 4) else "kLoop"
    return Profile(
        flops=flops, transcendentals=trans, util=util, emitted=[1.0] * n, out_bytes=out_bytes, inplace=inplace,
        ir_size=1.0, bb_splits=float(inst.opcode in SPLITS_BLOCKS), instructions=1,
        unnested_reductions=int(hero), shared_memory=_shared_memory(inst),
        significant_reduce=_significant_reduce(inst), reduction_hero=hero,
        expensive_to_repeat=_expensive_to_repeat(inst), kind=kind,
        op_bytes=[float(byte_size(op.shape)) for op in inst.operands], compute=compute,
        blocks=_blocks(inst if hero else None, element_count(inst.shape)),
        threads=_threads(inst if hero else None, element_count(inst.shape)),
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


def _fusion_profile(fusion: Instruction, run: FlopsSource) -> Profile:
    comp: Computation = fusion.attrs["calls"]
    util, emitted = _propagate(comp)
    hero = reduction_hero(comp)
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
        if inst.opcode in SPLITS_BLOCKS:
            splits += emitted[inst]
        if inst.opcode == "reduce" and is_unnested_reduction(inst):
            reductions += 1
        shmem += _shared_memory(inst)
        significant |= _significant_reduce(inst)
        expensive |= _expensive_to_repeat(inst)
    n = fusion.operand_count
    params = [comp.parameter(i) for i in range(n)]
    p_util = [util.get(p, 0.0) for p in params]
    out_bytes = float(byte_size(fusion.shape))
    inplace = None
    root = comp.root
    if root.opcode in ("dynamic-update-slice", "scatter") and root.operand(0).opcode == "parameter":
        inplace = root.operand(0).attrs["parameter_number"]
        if root.operand(0).user_count == 1:
            p_util[inplace] = 0.0
            update = root.operand(1 if root.opcode == "dynamic-update-slice" else 2).shape
            out_bytes = float(byte_size(update))
    return Profile(
        flops=flops, transcendentals=trans, util=p_util, emitted=[max(emitted.get(p, 0.0), 1.0) for p in params],
        out_bytes=out_bytes, inplace=inplace, ir_size=max(ir, 1.0), bb_splits=splits, instructions=count,
        unnested_reductions=reductions, shared_memory=shmem, significant_reduce=significant,
        reduction_hero=hero is not None, expensive_to_repeat=expensive, kind=fusion_kind(comp),
        op_bytes=[float(byte_size(op.shape)) for op in fusion.operands], compute=compute,
        blocks=_blocks(hero, element_count(fusion_roots(comp)[0].shape)),
        threads=_threads(hero, element_count(fusion_roots(comp)[0].shape)),
    )


def _inplace_of(fusion: Instruction) -> tuple[int | None, float]:
    """(in-place operand number, output bytes) of a fusion whose root updates a parameter in place."""
    root = fusion.attrs["calls"].root
    if root.opcode in ("dynamic-update-slice", "scatter") and root.operand(0).opcode == "parameter" \
            and root.operand(0).user_count == 1:
        update = root.operand(1 if root.opcode == "dynamic-update-slice" else 2).shape
        return root.operand(0).attrs["parameter_number"], float(byte_size(update))
    return None, float(byte_size(fusion.shape))


def combined_util(a: float, b: float) -> float:
    """Utilization of one value read at two places of one kernel: elementwise reads (each at most 1) read
    the same element in the same iteration, once (XLA's utilization meets at their common root, and a
    fused producer is evaluated once); re-reads (a broadcast, a window) add up."""
    return (a if a > b else b) if a <= 1.0 and b <= 1.0 else a + b


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
            u = combined_util(u, (cu if cu > 1.0 else 1.0) if c.inplace == i else cu)
            rep = ce if ce > rep else rep
            continue
        got = per.get(op.id)
        if got is None:
            per[op.id] = [cu, ce, c.op_bytes[i]]
        else:
            got[0] = combined_util(got[0], cu)
            got[1] = ce if ce > got[1] else got[1]
    for i, op in enumerate(producer_operands):
        pu, pe = p.util[i] * u, p.emitted[i] * rep
        got = per.get(op.id)
        if got is None:
            per[op.id] = [pu, pe, p.op_bytes[i]]
        else:
            got[0] = combined_util(got[0], pu)
            got[1] = pe if pe > got[1] else got[1]
    comp = fusion.attrs["calls"]
    hero = reduction_hero(comp)
    inplace, out_bytes = _inplace_of(fusion)
    rows = [per.get(op.id) or [1.0, 1.0, float(byte_size(op.shape))] for op in fusion.operands]
    op_util = [r[0] for r in rows]
    if inplace is not None:
        op_util[inplace] = 0.0
    return Profile(
        flops=c.flops + p.flops * u, transcendentals=c.transcendentals + p.transcendentals * u, util=op_util,
        compute=c.compute + p.compute * u, blocks=_blocks(hero, element_count(fusion_roots(comp)[0].shape)),
        threads=_threads(hero, element_count(fusion_roots(comp)[0].shape)),
        emitted=[r[1] if r[1] > 1.0 else 1.0 for r in rows], out_bytes=out_bytes, inplace=inplace,
        ir_size=c.ir_size + p.ir_size * rep, bb_splits=c.bb_splits + p.bb_splits * rep,
        instructions=c.instructions + p.instructions, unnested_reductions=c.unnested_reductions + p.unnested_reductions,
        shared_memory=c.shared_memory + p.shared_memory, significant_reduce=c.significant_reduce or p.significant_reduce,
        reduction_hero=hero is not None, expensive_to_repeat=c.expensive_to_repeat or p.expensive_to_repeat,
        kind=str(fusion.attrs.get("kind")), op_bytes=[r[2] for r in rows],
    )


def profile_of(inst: Instruction, cache: dict | None = None, run: FlopsSource | None = None) -> Profile:
    """The instruction's Profile (cached in `cache` by id when given; drop the entry when a fusion changes).
    `run` gives the flops: the fusion pass's `FusionRun` (its device's cost model, cached for the run);
    without one, the H100 model's."""
    if cache is not None:
        got = cache.get(inst.id)
        if got is not None:
            return got
    run = run if run is not None else InstructionFlops()
    if inst.opcode == "fusion":
        walk = getattr(run, "fusion_profile", None)  # a run remembers them by structure
        prof = walk(inst) if walk is not None else _fusion_profile(inst, run)
    else:
        one = getattr(run, "single_profile", None)
        prof = one(inst) if one is not None else _single_profile(inst, run)
    if cache is not None:
        cache[inst.id] = prof
    return prof


def param_reads_multiple(fusion: Instruction, prof: Profile) -> list[bool]:
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
            hit = reads_elements_multiple_times(x)
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
            self.spec = spec
            from hlopt.cost_model import kernel

            self._kernel = kernel
        except ImportError:  # pragma: no cover - cost_model is part of hlopt
            self.model = None
            self.bandwidth = self.H100_FALLBACK["hbm_bandwidth"]
            self.fp32_flops = self.H100_FALLBACK["fp32_flops"]
            self.launch_us = self.H100_FALLBACK["kernel_launch_us"]
            self.sms, self.clock_hz, self.lanes = 132.0, 1.98e9, float(_LANES)
            self.spec = None
        self._weighted = getattr(self.model, "weighted_kernel_time_us", None)
        #: the model's per-instruction XLA:GPU flops (`gpu_flops(inst)`), when it has them
        self.gpu_flops = getattr(self.model, "gpu_flops", None) if self._weighted is not None else None
        self.times: dict[int, float] = {}
        self._read_traits: dict[int, tuple[bool, bool]] = {}
        #: `operand_read_bytes` by its arguments
        self._read_memo: dict[tuple, float] = {}
        #: a fusion's read traits by its structural key (`hlo.structure`): they read the fusion alone
        self._traits_by_key: dict[tuple, tuple[bool, bool]] = {}

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

    def operand_read_bytes(self, nbytes: float, util: float, blocks: int, element_bytes: int = 4,
                           coalesced: bool = True) -> float:
        """Coalesced-HBM-equivalent bytes of an operand of `nbytes` read `util` times over by a kernel of
        `blocks` blocks (XLA's ReadTimeWithDRAMHeuristic, `cost_model.kernel.read_weights`): the first read
        from HBM (uncoalesced: most of each transaction wasted), the re-reads from cache, no faster than the
        blocks issue them (a one-block reduction re-reading a broadcast operand pays for every re-read)."""
        first = nbytes * (util if util < 1.0 else 1.0)
        if self.spec is None or (coalesced and util <= 1.0):
            return first
        key = (nbytes, util, blocks, element_bytes, coalesced)  # a pure function of these: a few kinds repeat
        got = self._read_memo.get(key)
        if got is None:
            w_first, w_again = self._kernel.read_weights(self.spec, max(blocks, 1), nbytes, element_bytes, coalesced)
            got = self._read_memo[key] = first * w_first + nbytes * max(util - 1.0, 0.0) * w_again
        return got

    def read_traits(self, inst: Instruction) -> tuple[bool, bool]:
        """(runs the tiled transpose emitter, transposes a minor dimension) of the kernel `inst` launches,
        cached until `forget`: what XLA's IsReadCoalescedHeuristic looks at."""
        got = self._read_traits.get(inst.id)
        if got is None:
            if self.spec is None:
                got = (False, False)
            elif inst.opcode == "fusion":  # a walk of the fused computation: remembered by structure
                try:
                    key = shared_keys(inst.parent.module if inst.parent is not None else None).of(inst)
                    got = self._traits_by_key.get(key)
                except TypeError:  # an attribute value that is not hashable even as its parts
                    key = None
                if got is None:
                    got = self._walk_read_traits(inst)
                    if key is not None:
                        self._traits_by_key[key] = got
            else:
                got = self._walk_read_traits(inst)
            self._read_traits[inst.id] = got
        return got

    def known_read_traits(self, inst: Instruction) -> tuple[bool, bool] | None:
        """`read_traits(inst)` where already read (and not forgotten since), else None."""
        return self._read_traits.get(inst.id)

    def _walk_read_traits(self, inst: Instruction) -> tuple[bool, bool]:
        tiled = self._kernel.emitter_kind(inst, self.spec) == "transpose"
        return tiled, not tiled and self._kernel.transposes_minor_dimension(inst)

    def fused_reads_coalesced(self, producer: Instruction, p: Profile, consumer: Instruction, c: Profile) -> bool:
        """XLA's IsReadCoalescedHeuristic for `producer` fused into `consumer`: two reductions in one kernel
        are not coalesced, a transpose of the minor dimension in either breaks coalescing unless the kernel
        is the tiled transpose emitter."""
        if p.reduction_hero and c.reduction_hero:
            return False
        (tp, bp), (tc, bc) = self.read_traits(producer), self.read_traits(consumer)
        if (tp or tc) and not (p.reduction_hero or c.reduction_hero):
            return True
        return not (bp or bc)

    def time_us(self, inst: Instruction, prof: Profile) -> float:
        """Modeled time of `inst` as it is now (cached; `forget` it when it changes)."""
        t = self.times.get(inst.id)
        if t is None:
            t = self.times[inst.id] = self.emitter_time_us(
                prof.compute, self.read_bytes(inst, prof, prof.blocks, not self.read_traits(inst)[1]) + prof.out_bytes,
                prof.blocks, prof.threads)
        return t

    def forget(self, inst: Instruction) -> None:
        """Drop the cached time of a changed instruction."""
        self.times.pop(inst.id, None)
        self._read_traits.pop(inst.id, None)

    def read_bytes(self, inst: Instruction, prof: Profile, blocks: int | None = None, coalesced: bool = True) -> float:
        """HBM bytes an instruction reads: each distinct operand once, up to its utilization; with `blocks`,
        weighted as `operand_read_bytes` weighs them (re-reads, uncoalesced reads)."""
        per: dict[int, list] = {}
        for op, u, b in zip(inst.operands, prof.util, prof.op_bytes, strict=False):
            k = op.id
            if k in per:
                per[k][0] = combined_util(per[k][0], u)
            else:
                per[k] = [u, b, op]
        if blocks is None:
            return sum(b * min(u, 1.0) for u, b, _ in per.values())
        return sum(self.operand_read_bytes(b, u, blocks, self._element_bytes(op, coalesced), coalesced)
                   for u, b, op in per.values())

    def _element_bytes(self, op: Instruction, coalesced: bool) -> int:
        return 4 if coalesced or self.spec is None else self._kernel.element_bytes(op.shape)

    def tiled_time_us(self, ops: Sequence[Instruction], inputs: Sequence[Instruction], out_bytes: float,
                      rows: int, flops: FlopsSource) -> float:
        """Modeled time of a block-level (Triton) kernel tiled by rows, one row per program: every op computed
        once per element (a tile keeps its row on chip, however many users a value has), every distinct input
        read once, the output written once; `rows` programs of full blocks (XLA's tiled performance model in
        the large)."""
        compute = sum(flops.flops_of(op)[2] for op in ops if op.opcode != "parameter")
        nbytes = out_bytes + sum(float(byte_size(x.shape)) for x in dict.fromkeys(inputs))
        return self.emitter_time_us(compute, nbytes, rows, _LANES)

    def fused_time_us(self, producer: Instruction, p: Profile, consumer: Instruction, c: Profile,
                      multi_output: bool = False) -> float:
        """Modeled time of the one kernel computing `consumer` with `producer` fused in (and, for a
        multi-output fusion, also writing the producer's value)."""
        u = 0.0
        per: dict[int, list] = {}
        for op, cu, b in zip(consumer.operands, c.util, c.op_bytes, strict=False):
            k = op.id
            if op is producer:
                u = combined_util(u, cu)
            elif k in per:
                per[k][0] = combined_util(per[k][0], cu)
            else:
                per[k] = [cu, b, op]
        out_bytes = c.out_bytes
        if c.inplace is not None and consumer.operands[c.inplace] is producer:
            out_bytes = float(byte_size(consumer.shape))
            u = max(u, 1.0)
        for op, pu, b in zip(producer.operands, p.util, p.op_bytes, strict=False):
            k = op.id
            if k not in per:
                per[k] = [pu * u, b, op]
            else:
                per[k][0] = combined_util(per[k][0], pu * u)  # read elementwise by both: once
        grid = p if p.reduction_hero and not c.reduction_hero else c
        coalesced = self.fused_reads_coalesced(producer, p, consumer, c)
        nbytes = out_bytes
        for x, b, op in per.values():
            nbytes += self.operand_read_bytes(b, x, grid.blocks, self._element_bytes(op, coalesced), coalesced)
        if multi_output:
            nbytes += p.out_bytes
            u = max(u, 1.0)
        return self.emitter_time_us(c.compute + p.compute * u, nbytes, grid.blocks, grid.threads)


#: The adapter under the name the design notes use.
_FusionCostModel = FusionCostModel
