"""horizontal-loop-fusion: independent loop kernels of one shape that feed the same consumer, launched as one
kernel (XLA:GPU's HorizontalLoopFusion, its kLoop form).

Before (an optimizer's updates of four tensors of one shape, each its own kernel):
    %u0 = (f32[64], f32[64], f32[64]) fusion(%p0, %g0, %m0, %v0), kind=kLoop, calls=%adam.0
    ...
    %u3 = (f32[64], f32[64], f32[64]) fusion(%p3, %g3, %m3, %v3), kind=kLoop, calls=%adam.3
    ROOT %t = tuple(gte(%u0), ..., gte(%u3))
After (one launch, twelve outputs of one loop shape):
    %h = (f32[64] x 12) fusion(%p0, %g0, ..., %v3), kind=kLoop, calls=%fused_computation
    ROOT %t = tuple(gte(%h, 0), ..., gte(%h, 11))

Small kernels are launch-bound: XLA's GpuPerformanceModel charges each launch its overhead, and a loop kernel
over a few thousand elements costs less than the launch. XLA:GPU had this pass (horizontal_loop_fusion.cc, run
after its fusion passes and again on the copies its copy insertion makes); the XLA:GPU of jax 0.10.2 ships
without it (its plugin holds no such pass, only the retired `xla_gpu_use_horizontal_fusion` option's name), so its
default compile launches each optimizer update over a small tensor, and each copy of a parameter to an output,
as a kernel of its own. This pass brings the rule back on our side of the XLA:GPU path (`xla-gpu-after`).

Rules (XLA's, for the kLoop form): for each consumer, uses before defs, its operands (through get-tuple-elements)
that are loop fusions or elementwise instructions, without control edges, whose only users besides the root are
that consumer, with at most 8192*8192 elements and 128 fused instructions; grouped by output type, number of
outputs and shape (layout included: one loop), at most 32 outputs (64 for lone instructions) and 4000 bytes of
kernel parameters per group. Stricter than XLA, as this pass runs after copy insertion: outside the entry
computation copies are left alone (fusing them can break buffer sharing, as XLA says of its copy variant) and
no two kernels of a group read one value of the loop's carried state (an output may update it in place);
`loop_bodies=false` keeps to the entry computation. No in-place kernels (dynamic-update-slice, scatter) and no
fusion with a reduce, scatter or sort. Every group must pass the never-slower check
(`fusion_trial.FusionTrial.horizontal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import Shape
from hlopt.passes.cse import CommonSubexpressionElimination
from hlopt.passes.framework.registry import register
from hlopt.passes.fusion.fusion_building import merge_into_multi_output, wrap_in_fusion
from hlopt.passes.fusion.fusion_rules import EW, fusible_computations, fusion_roots, in_place_operand
from hlopt.passes.fusion.fusion_run import FusionPass, FusionRun
from hlopt.passes.fusion.fusion_trial import FusionTrial

__all__ = ["HorizontalLoopFusion", "horizontal_candidate", "outputs_of"]

#: XLA's IsProfitableFusionCandidate limits for the kLoop form.
MAX_ELEMENTS = 8192 * 8192
MAX_FUSED_INSTRUCTIONS = 128
#: XLA's GetNextSpanOfFusions limits: outputs per group (fusions, lone instructions), kernel parameter bytes.
MAX_OUTPUTS_FUSIONS = 32
MAX_OUTPUTS_LONE = 64
MAX_PARAM_BYTES = 4000


def outputs_of(inst: Instruction) -> list[Instruction]:
    """XLA's GetOutputsOfFusible: a fusion's roots, or the instruction itself."""
    return fusion_roots(inst.attrs["calls"]) if inst.opcode == "fusion" else [inst]


def _only_consumer_or_root(inst: Instruction, consumer: Instruction) -> bool:
    """XLA's IsConsumerTheOnlyNonRootUser (through get-tuple-elements)."""
    for user in inst.users:
        if user.opcode == "get-tuple-element":
            if not _only_consumer_or_root(user, consumer):
                return False
        elif user is not consumer and user is not user.parent.root:
            return False
    return True


def horizontal_candidate(inst: Instruction) -> str | None:
    """Why `inst` cannot join a horizontal loop fusion (XLA's IsFusibleCandidate and
    IsProfitableFusionCandidate, with hlopt's stricter rules); None: it can."""
    if inst.has_control_dependencies:
        return "control edges"
    if inst.opcode != "fusion":
        if inst.opcode not in EW or not inst.operand_count or inst.shape.is_tuple:
            return "neither a loop fusion nor an elementwise instruction"
        return None if inst.shape.numel <= MAX_ELEMENTS else "too many elements"
    if str(inst.attrs.get("kind")) != "kLoop":
        return "not a loop fusion"
    comp: Computation = inst.attrs["calls"]
    outs = outputs_of(inst)
    if any(o.shape.is_tuple for o in outs):
        return "a tuple-shaped output (a variadic op)"
    if len({o.shape.dtype for o in outs}) != 1:
        return "outputs of several types"
    if in_place_operand(inst) is not None or any(o.opcode in ("dynamic-update-slice", "scatter") for o in outs):
        return "updates a buffer in place"
    if any(i.opcode in ("reduce", "scatter", "sort") for i in comp.instructions):
        return "a reduce, scatter or sort inside"
    if outs[0].shape.numel > MAX_ELEMENTS:
        return "too many elements"
    if len(comp.instructions) > MAX_FUSED_INSTRUCTIONS:
        return "too many fused instructions"
    return None


def _loop_key(inst: Instruction) -> tuple[str, int, tuple[int, ...], object]:
    """What a group shares: output type, number of outputs, and the first output's dims and layout."""
    outs = outputs_of(inst)
    shape: Shape = outs[0].shape
    return shape.dtype, len(outs), tuple(shape.dims), shape.layout


def _groups(candidates: list[Instruction]) -> list[list[Instruction]]:
    """XLA's GetNextSpanOfFusions over candidates of one loop key (in XLA's sort order)."""
    out: list[list[Instruction]] = []
    by_key: dict[tuple, list[Instruction]] = {}
    for inst in candidates:
        by_key.setdefault(_loop_key(inst), []).append(inst)
    for members in by_key.values():
        members.sort(key=lambda i: (len(i.attrs["calls"].instructions) if i.opcode == "fusion" else 1))
        span: list[Instruction] = []
        outputs = io = 0
        limit = MAX_OUTPUTS_FUSIONS if members[0].opcode == "fusion" else MAX_OUTPUTS_LONE
        for inst in members:
            n = len(outputs_of(inst))
            if span and (outputs + n >= limit or (io + inst.operand_count + n) * 8 >= MAX_PARAM_BYTES):
                out.append(span)
                span, outputs, io = [], 0, 0
            span.append(inst)
            outputs += n
            io += inst.operand_count + n
        out.append(span)
    return [g for g in out if len(g) > 1]


def _carry_values(inst: Instruction) -> set[int]:
    """The values of the computation's parameter (a loop's carried state) `inst` reads."""
    return {op.id for op in inst.operands
            if op.opcode == "parameter" or (op.opcode == "get-tuple-element" and op.operand(0).opcode == "parameter")}


def _disjoint_carries(group: list[Instruction]) -> list[Instruction]:
    """The members of `group` (in order) that read no carried value an earlier member reads: in a loop body an
    output may update its carried value in place, and one kernel must not read what another part of it writes."""
    taken: set[int] = set()
    kept = []
    for inst in group:
        carries = _carry_values(inst)
        if carries & taken:
            continue
        taken |= carries
        kept.append(inst)
    return kept


@register
@dataclass(frozen=True)
class HorizontalLoopFusion(FusionPass):
    """Independent loop kernels of one shape feeding one consumer become one kernel (see the module docstring)."""

    name: ClassVar[str] = "horizontal-loop-fusion"
    #: also fuse in loop bodies and other called computations (copies there are left alone, and no two kernels of a
    #: group read one carried value); False: the entry computation only
    loop_bodies: bool = True
    #: then CSE on the fused computations, as XLA's horizontal fusion pipeline runs HloCSE (only fusion
    #: computations) after its passes: the copies of a constant broadcast that merged kernels each brought,
    #: and values the fusion passes before duplicated into one fused computation, computed once
    cse_fusions: bool = True

    def fuse(self, module: Module, run: FusionRun) -> bool:
        """Horizontal loop fusion in the entry computation (with `loop_bodies`, in every fusible computation),
        consumers visited uses before defs."""
        trial = FusionTrial(self.device) if self.never_slower else None
        changed = False
        comps = fusible_computations(module) if self.loop_bodies else [module.entry]
        for comp in comps:
            changed |= self._fuse_in(comp, comp is module.entry, run, trial)
        if self.cse_fusions:
            run.finish()
            changed |= CommonSubexpressionElimination(only_fusion_computations=True).run(module)
        return changed

    def _fuse_in(self, comp: Computation, entry: bool, run: FusionRun, trial: FusionTrial | None) -> bool:
        changed = False
        for consumer in reversed(comp.post_order()):
            if consumer.parent is not comp:
                continue
            candidates = self._candidates(consumer, run)
            if not entry:
                candidates = [c for c in candidates if not any(o.opcode == "copy" for o in outputs_of(c))]
            for group in _groups(candidates):
                if not entry:
                    group = _disjoint_carries(group)
                    if len(group) < 2:
                        continue
                changed |= self._fuse_group(comp, group, run, trial)
        if changed:
            comp.make_topological()
        return changed

    def _candidates(self, consumer: Instruction, run: FusionRun) -> list[Instruction]:
        """The consumer's operands (through get-tuple-elements) that may join a horizontal fusion."""
        seen: dict[int, Instruction] = {}
        for op in consumer.operands:
            while op.opcode == "get-tuple-element":
                op = op.operand(0)
            if op.id in seen or op.parent is not consumer.parent:
                continue
            if horizontal_candidate(op) is None and _only_consumer_or_root(op, consumer):
                seen[op.id] = op
        return list(seen.values())

    def _fuse_group(self, comp: Computation, group: list[Instruction], run: FusionRun,
                    trial: FusionTrial | None) -> bool:
        names = tuple(g.name for g in group[1:])
        verdict = trial.horizontal(group) if trial is not None else None
        if verdict is not None and verdict.slower:
            run.explain(comp.name, group[0].name, names, False, f"slower as built ({verdict.describe()})",
                        verdict=verdict, rule="horizontal")
            return False
        run.explain(comp.name, group[0].name, names, True,
                    f"{len(group)} independent loop kernels of one shape as one", verdict=verdict, rule="horizontal")
        first = group[0] if group[0].opcode == "fusion" else wrap_in_fusion(group[0], run=run)
        for other in group[1:]:
            merge_into_multi_output(first, other, reorder=False, run=run)
        return True
