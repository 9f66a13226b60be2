"""triton-softmax-priority-fusion: grow XLA:GPU's block-level Triton fusions (`__triton`, made by XLA's
SoftmaxRewriterTriton) the way XLA's PriorityFusion does in XLA:GPU's default compile: a producer fuses into
a Triton fusion, and a Triton fusion into its consumers, while the result can still be tiled by XLA's rules
and XLA's cost model says it pays.

Before (step 3, single ops unwrapped):
    %t = f32[16,512] fusion(%x), kind=kCustom, calls=%mean_centered     (__triton, tiles [1,512])
    %sq = f32[16,512] multiply(%t, %t)
    %var = f32[16] reduce(%sq, %zero), dimensions={1}, to_apply=%add
    %inv = f32[16] rsqrt(%var)
    %b = f32[16,512] broadcast(%inv), dimensions={0}
    %n = f32[16,512] multiply(%t, %b)
After:
    %n = f32[16,512] fusion(%x), kind=kCustom, calls=%fused_computation   (__triton, the tile XLA's cost
                                   model picks: mean, centring, variance, rsqrt and the product in one)

XLA's rules (PriorityFusion with Triton fusion growth, as XLA:GPU's default compile runs it), applied greedily
before priority-fusion (step 3 of the XLA:GPU path no longer runs this pass by default: priority-fusion grows
Triton fusions in its own queue by the same rule, `priority-fusion{triton_softmax_priority_fusion=true}`):
- a Triton fusion fuses into every one of its users that is not a bitcast (single ops XLA's Triton emitter
  supports, or other Triton fusions) when each result can be tiled (XLA's CanFuseWithAllNonBitcastUsers
  with CanFuseTriton); each of them recomputes it, and it is gone unless bitcasts read it;
- a single supported op fuses into its Triton users: into all of them when those are all its users (it is
  then gone), else into those that gain by it (it stays for priority-fusion to fuse into the others);
- a fusion happens when XLA's priority is not negative: time unfused minus time fused, a launch each
  (GpuPerformanceModelWithIndexingAnalysis::EstimateRunTimes), fusions timed by XLA's indexing cost
  model at their best tiling;
- the grown fusion gets the output tile and warps XLA's TryFindBestTilingForFusion would give it.
Tileability, supported ops and the cost model are `passes/fusion/triton_tiling.py` (XLA's SymbolicTileAnalysis,
IsTritonSupportedInstruction and indexing cost model for these ops), the same rule priority-fusion's queue grows
Triton fusions by (`priority-fusion{triton_softmax_priority_fusion=true}`). Multi-output Triton fusions are
not made here (priority-fusion makes them with `triton_multi_output_fusion=true`, XLA's
xla_gpu_unsupported_enable_triton_multi_output_fusion); one already there is timed by its real root's tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.passes.cse import CommonSubexpressionElimination
from hlopt.passes.framework.base import ModulePass, PassResult, non_fusion_computations
from hlopt.passes.framework.registry import register
from hlopt.passes.fusion.fusion_building import fuse_into_new_fusion, fuse_producer, remove_fusion
from hlopt.passes.fusion.fusion_run import FusionRun
from hlopt.passes.fusion.fusion_trial import TrialVerdict
from hlopt.passes.fusion.triton_tiling import (
    FusedGraph,
    TilingChoice,
    best_tiling,
    block_level_tile,
    graph_of_fusion,
    graph_of_pair,
    tiling_cost,
    triton_config,
    unsupported_reason,
    with_tiling,
)

__all__ = ["TritonSoftmaxPriorityFusion", "block_level_tile"]



def _single_candidate(inst: Instruction) -> bool:
    """A single instruction XLA's PriorityFusion may fuse with a Triton fusion (as producer or consumer)."""
    return inst.opcode not in ("fusion", "parameter", "constant", "tuple", "get-tuple-element") \
        and unsupported_reason(inst) is None


class _Costs:
    """Modelled times of the fusions a run weighs (XLA's indexing cost model, `triton_tiling`), cached per
    instruction until it changes."""

    def __init__(self, device: str, launch_us: float):
        self.device, self.launch_us = device, launch_us
        self._alone: dict[Instruction, float | None] = {}
        self._fused: dict[tuple[Instruction, Instruction], TilingChoice | str] = {}
        self._pairs: dict[Instruction, list[tuple[Instruction, Instruction]]] = {}
        self.noted: set[tuple[int, tuple[int, ...], bool]] = set()  # refusals recorded (`_note`)

    def forget(self, inst: Instruction) -> None:
        """Drop what is known of `inst` (it changed)."""
        self._alone.pop(inst, None)
        for pair in self._pairs.pop(inst, ()):
            self._fused.pop(pair, None)

    def alone(self, inst: Instruction) -> float | None:
        """The time of `inst` as its own kernel: a Triton fusion with its tile, a single op at its best."""
        if inst not in self._alone:
            tile = block_level_tile(inst)
            if tile is not None:
                graph = graph_of_fusion(inst)
                choice = tiling_cost(graph, tile, self.device) or best_tiling(graph, device=self.device)
            else:
                graph = FusedGraph(inst, {inst: list(inst.operands)})
                choice = best_tiling(graph, device=self.device)
            self._alone[inst] = choice.cost_us if isinstance(choice, TilingChoice) else None
        return self._alone[inst]

    def fused(self, producer: Instruction, consumer: Instruction) -> TilingChoice | str:
        """The best tiling of `producer` fused into `consumer` (a consumer's own tile kept within 1%)."""
        key = (producer, consumer)
        if key not in self._fused:
            self._fused[key] = best_tiling(graph_of_pair(producer, consumer), keep=block_level_tile(consumer),
                                           device=self.device)
            self._pairs.setdefault(producer, []).append(key)
            self._pairs.setdefault(consumer, []).append(key)
        return self._fused[key]


@dataclass
class _Plan:
    """Fusing one producer into some of its users: per user, the tiling of the result; and whether it pays."""

    producer: Instruction
    users: list[Instruction]
    tilings: list[TilingChoice]
    unfused_us: float
    fused_us: float

    @property
    def pays(self) -> bool:
        return self.fused_us <= self.unfused_us


def _plan(costs: _Costs, producer: Instruction, users: list[Instruction], producer_stays: bool) -> _Plan | None:
    """XLA's priority of fusing `producer` into `users` (time unfused minus time fused, launches included:
    GpuPerformanceModelWithIndexingAnalysis::EstimateRunTimes); None if one of them cannot be tiled. A
    producer that stays (it has other users) keeps its own launch and time on both sides."""
    own = costs.alone(producer)
    if own is None:
        return None
    unfused = 0.0 if producer_stays else own + costs.launch_us
    fused = 0.0
    tilings = []
    for user in users:
        alone = costs.alone(user)
        choice = costs.fused(producer, user)
        if alone is None or not isinstance(choice, TilingChoice):
            return None
        unfused += alone + costs.launch_us
        fused += choice.cost_us + costs.launch_us
        tilings.append(choice)
    return _Plan(producer, users, tilings, unfused, fused)


def _note(run: FusionRun, costs: _Costs, producer: Instruction, plan: _Plan | None, gone: bool) -> None:
    """Record one growth decision (taken when the plan pays) with its modeled times, for the audit (a refusal
    once per producer and users)."""
    if plan is None:
        return  # not tileable: no decision on times to record
    key = (producer.id, tuple(u.id for u in plan.users), plan.pays)
    if not plan.pays and key in costs.noted:
        return
    costs.noted.add(key)
    verdict = TrialVerdict(plan.unfused_us, plan.fused_us, int(gone))
    reason = (f"into {len(plan.users)} Triton user(s), XLA's indexing cost model" if plan.pays
              else f"slower as built ({verdict.describe()})")
    run.explain(producer.parent.name if producer.parent else "", producer.name, tuple(u.name for u in plan.users),
                plan.pays, reason, plan.unfused_us - plan.fused_us, verdict, "triton-growth")


@register
@dataclass(frozen=True)
class TritonSoftmaxPriorityFusion(ModulePass):
    """Grow block-level Triton fusions by their producers and consumers while tileable (module docstring)."""

    name: ClassVar[str] = "triton-softmax-priority-fusion"
    max_rounds: int = 64
    device: str = "h100"

    def run(self, module: Module) -> bool:
        return self.run_with_result(module).changed

    def run_with_result(self, module: Module) -> PassResult:
        """Run on `module`; the result carries every growth decided on its modeled times (the audit)."""
        from hlopt.cost_model.devices import get_device

        run = FusionRun(module, self.name, self.device)
        costs = _Costs(self.device, float(get_device(self.device).kernel_launch_us))
        changed = False
        for comp in non_fusion_computations(module):
            for _ in range(self.max_rounds):
                if not self._round(comp, run, costs):
                    break
                changed = True
        run.finish()
        if changed:  # the copies of a value that reached one fusion by several paths become one
            CommonSubexpressionElimination(only_fusion_computations=True).run(module)
        return PassResult(changed, run.explanations)

    def _round(self, comp: Computation, run: FusionRun, costs: _Costs) -> bool:
        changed = False
        for inst in list(comp.post_order()):
            if inst.parent is not comp or inst.is_root or not inst.users or inst.has_side_effect:
                continue
            if block_level_tile(inst) is not None:
                changed |= self._fuse_triton_into_users(inst, run, costs)
            elif _single_candidate(inst) and any(block_level_tile(u) is not None for u in inst.users):
                changed |= self._fuse_into_triton_users(comp, inst, run, costs)
        return changed

    def _fuse_triton_into_users(self, triton: Instruction, run: FusionRun, costs: _Costs) -> bool:
        """A Triton fusion into every user that is not a bitcast (single ops XLA's Triton emitter supports,
        or Triton fusions) when each result stays tileable and the priority is not negative (XLA's
        CanFuseWithAllNonBitcastUsers with CanFuseTriton, and its priority). It stays for its bitcast users,
        if any: its time and launch then count on both sides (XLA's priority would count it as gone, and
        recomputing a chain of Triton fusions in each next one costs more than it saves)."""
        users = [u for u in triton.users if u.opcode != "bitcast"]
        if not users:
            return False
        for user in users:
            if block_level_tile(user) is None and not _single_candidate(user):
                return False
        gone = len(users) == triton.user_count
        plan = _plan(costs, triton, users, producer_stays=not gone)
        if plan is None or not plan.pays:
            _note(run, costs, triton, plan, gone)
            return False
        _note(run, costs, triton, plan, gone)
        cfg = triton_config(triton)
        for i, (user, choice) in enumerate(zip(plan.users, plan.tilings, strict=True)):
            self._fuse(triton, user, choice, cfg, last=gone and i == len(users) - 1, run=run, costs=costs)
        costs.forget(triton)
        if gone:
            remove_fusion(triton, run=run)
        return True

    def _fuse_into_triton_users(self, comp: Computation, producer: Instruction, run: FusionRun,
                                costs: _Costs) -> bool:
        """A single op into its Triton users where tileable: when every user is such a Triton fusion it
        goes (XLA fuses a producer into all its users or none); otherwise it is recomputed in the Triton
        users that gain by it and stays for the rest (priority-fusion, after this pass, fuses it there)."""
        tritons = [u for u in producer.users if block_level_tile(u) is not None]
        complete = len(tritons) == producer.user_count
        plan = _plan(costs, producer, tritons, producer_stays=not complete)
        if plan is None and not complete:
            takers = [u for u in tritons if isinstance(costs.fused(producer, u), TilingChoice)]
            plan = _plan(costs, producer, takers, producer_stays=True) if takers else None
        if plan is None or not plan.pays:
            _note(run, costs, producer, plan, False)
            return False
        gone = len(plan.users) == producer.user_count
        _note(run, costs, producer, plan, gone)
        for i, (user, choice) in enumerate(zip(plan.users, plan.tilings, strict=True)):
            self._fuse(producer, user, choice, None, last=gone and i == len(plan.users) - 1, run=run, costs=costs)
        if gone:
            costs.forget(producer)
            comp.remove(producer)
        return True

    @staticmethod
    def _fuse(producer: Instruction, user: Instruction, choice: TilingChoice, cfg: dict[str, Any] | None,
              last: bool, run: FusionRun, costs: _Costs) -> None:
        """Fuse `producer` into `user` (a Triton fusion, or a single op that becomes one) with `choice`."""
        if user.opcode == "fusion":
            base = triton_config(user)
            fuse_producer(user, producer, last_use=last, constants=True, run=run)
            user.attrs["kind"] = "kCustom"
            user.set_backend_config_json(with_tiling(base, choice))
            costs.forget(user)
        else:
            assert cfg is not None
            fused = fuse_into_new_fusion(producer, user, last_use=last, constants=True, run=run)
            fused.attrs["kind"] = "kCustom"
            fused.set_backend_config_json(with_tiling(cfg, choice))
