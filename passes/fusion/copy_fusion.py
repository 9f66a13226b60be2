"""copy-fusion: copies of a fusion's output computed by that fusion, as extra outputs (XLA:GPU's CopyFusion).

Before (copies a copy insertion made of one value, for the buffers of two loops' initial states):
    %f = f32[20,32,128] fusion(), kind=kLoop, calls=%fused_computation     # broadcast(0)
    %c1 = f32[20,32,128] copy(%f)
    %c2 = f32[20,32,128] copy(%f)
After (one kernel writes the three buffers):
    %f = (f32[20,32,128], f32[20,32,128], f32[20,32,128]) fusion(), kind=kLoop, calls=%fused_computation
    %g0 = get-tuple-element(%f), index=0   %c1 = get-tuple-element(%f), index=1   %c2 = ... index=2

Why hlopt needs it: XLA:GPU runs CopyFusion right after its copy insertion, which in its own pipeline comes after
fusion, so the copies find the fusions they copy. On the XLA:GPU path (`hlopt compile`) copy insertion runs in
step 2, with XLA's generic fusion off: CopyFusion finds nothing to fuse into, and in step 3 our fusion passes
meet the copies as lone instructions (a copy is one kernel launch each: gru_scan_grad's entry launched 13
kernels where XLA's launched 7). This pass, run after `multi-output-fusion`, makes the move XLA would have made.

Rules (XLA's copy_fusion.cc): the entry computation only (elsewhere a copy may share its buffer with a loop's
parameter); the fusion's parameters feed only elementwise ops (no copy among them), its roots are no reductions
or scatters, not all slices, no dynamic-update-slice (emitted in place); a copy qualifies when it reads the
fusion directly or through a get-tuple-element and/or a bitcast, keeps the shape and layout, has no control
edges, and the fusion stays within the operand budget. Beyond XLA: a get-tuple-element with several users
(XLA asks for one; multi-output-fusion has often made the copied value an extra output already), and a lone
fusible instruction with copy users is wrapped in a fusion first (on this path the backend wraps it anyway).
Every move passes the never-slower check (`fusion_trial.FusionTrial.users_as_outputs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.passes.framework.registry import register
from hlopt.passes.fusion.fusion_building import fuse_user_as_output, wrap_in_fusion
from hlopt.passes.fusion.fusion_rules import EW, fusion_roots, is_fusible, is_unnested_reduction
from hlopt.passes.fusion.fusion_run import FusionPass, FusionRun
from hlopt.passes.fusion.fusion_trial import FusionTrial

__all__ = ["CopyFusion", "copy_chains", "copy_fusion_refusal"]

#: Lone instructions that are no kernel of their own or not worth a fusion: never wrapped to take copies.
_NOT_WRAPPED = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "copy"})


def _only_elementwise_from_parameters(comp: Computation) -> bool:
    """XLA's OnlyElementwiseOpsReachableFromParams: what the parameters feed is elementwise (no copy), a bitcast
    or the tuple root."""
    work = list(comp.parameters)
    seen = {p.id for p in work}
    while work:
        inst = work.pop()
        for user in inst.users:
            if user.opcode not in ("bitcast", "tuple") and (user.opcode not in EW or user.opcode == "copy"):
                return False
            if user.id not in seen:
                seen.add(user.id)
                work.append(user)
    return True


def copy_fusion_refusal(fusion: Instruction) -> str | None:
    """Why copies of `fusion`'s outputs cannot become its outputs (None: they can)."""
    comp: Computation = fusion.attrs["calls"]
    if not _only_elementwise_from_parameters(comp):
        return "its parameters feed more than elementwise ops"
    roots = fusion_roots(comp)
    if any(is_unnested_reduction(r) or r.opcode == "scatter" for r in roots):
        return "a reduction or scatter root"
    if comp.root.opcode == "tuple" and all(r.opcode == "slice" for r in roots):
        return "all its outputs are slices"
    if any(r.opcode == "dynamic-update-slice" for r in roots):
        return "a dynamic-update-slice root, emitted in place"
    return None


def _wrappable(inst: Instruction) -> bool:
    """A lone instruction that takes copies once wrapped in a fusion, under the rules above: elementwise, or a
    broadcast or iota of constants."""
    if inst.opcode in _NOT_WRAPPED or not is_fusible(inst) or inst.shape.is_tuple:
        return False
    if inst.opcode in EW:
        return True
    return inst.opcode in ("broadcast", "iota") and all(op.opcode == "constant" for op in inst.operands)


def _is_plain_copy(inst: Instruction) -> bool:
    return (inst.opcode == "copy" and not inst.shape.is_tuple and inst.shape == inst.operand(0).shape
            and not inst.has_control_dependencies)


def copy_chains(inst: Instruction) -> list[list[Instruction]]:
    """The copies of `inst`'s outputs, each as its path from `inst`: [get-tuple-element], [bitcast], copy."""
    chains: list[list[Instruction]] = []
    multi = inst.shape.is_tuple
    for user in inst.users:
        starts = [[user]]
        if multi:
            if user.opcode != "get-tuple-element":
                continue
            starts = [[user, u] for u in user.users]
        for path in starts:
            last = path[-1]
            if last.opcode == "bitcast" and last.user_count == 1:
                path = [*path, last.users[0]]
            if _is_plain_copy(path[-1]) and (len(path) == 1 or path[-1].operand(0) is path[-2]):
                chains.append(path)
    return chains


@register
@dataclass(frozen=True)
class CopyFusion(FusionPass):
    """Copies of a fusion's outputs become extra outputs of that fusion (see the module docstring)."""

    name: ClassVar[str] = "copy-fusion"

    def fuse(self, module: Module, run: FusionRun) -> bool:
        """Copy fusion in the entry computation."""
        comp = module.entry
        trial = FusionTrial(self.device) if self.never_slower else None
        changed = False
        for inst in comp.post_order():
            if inst.parent is not comp:
                continue
            changed |= self._fuse_copies_of(inst, run, trial)
        return changed

    def _fuse_copies_of(self, inst: Instruction, run: FusionRun, trial: FusionTrial | None) -> bool:
        """Make the copies of `inst` its outputs, where the rules and the check allow."""
        is_fusion = inst.opcode == "fusion" and str(inst.attrs.get("kind")) in ("kLoop", "kInput")
        if not is_fusion and not _wrappable(inst):
            return False
        chains = copy_chains(inst)
        if not chains:
            return False
        comp = inst.parent
        if is_fusion:
            why = copy_fusion_refusal(inst)
            if why is not None:
                run.explain(comp.name, inst.name, tuple(c[-1].name for c in chains), False, why, rule="copy")
                return False
        outputs = len(inst.shape.elements) if inst.shape.is_tuple else 1
        room = self.max_operands_and_outputs - inst.operand_count - outputs
        if room < len(chains):
            chains = chains[:max(room, 0)]
            if not chains:
                return False
        names = tuple(c[-1].name for c in chains)
        verdict = trial.users_as_outputs(inst, chains) if trial is not None else None
        if verdict is not None and verdict.slower:
            run.explain(comp.name, inst.name, names, False, f"slower as built ({verdict.describe()})",
                        verdict=verdict, rule="copy")
            return False
        run.explain(comp.name, inst.name, names, True, f"{len(chains)} copy(ies) of its outputs as extra outputs",
                    verdict=verdict, rule="copy")
        fusion = inst if is_fusion else wrap_in_fusion(inst, run=run)  # the chains' users now read the wrapper
        for chain in chains:
            fuse_user_as_output(fusion, chain, run=run)
        for user in list(fusion.users):
            if user.opcode == "get-tuple-element" and user.user_count == 0 and user is not comp.root:
                comp.remove(user)
        return True
