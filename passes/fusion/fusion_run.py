"""A fusion pass and its runs: `FusionPass` (the options both fusion passes take), `FusionRun` (the
state of one run, made by the run and dropped after it) and `Explanation` (one decision of a run).
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.structure import shared_keys
from hlopt.passes.framework.base import ModulePass, PassResult
from hlopt.passes.fusion.fusion_budgets import Budgets
from hlopt.passes.fusion.fusion_cost import FusionCostModel, InstructionFlops
from hlopt.passes.fusion.fusion_rules import (
    MAX_IR_SIZE,
    MAX_OPERANDS_AND_OUTPUTS,
    MAX_UNNESTED_REDUCTIONS,
    SHARED_MEMORY_PER_BLOCK,
)

__all__ = [
    "FusionPass", "FusionRun", "Explanation",
]


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
    #: 0 (default): no limit, as XLA:GPU's MLIR emitters; N: the legacy emitters' limit of N basic-block splits
    #: per fusion (`fusion_budgets.merged_too_large`), e.g. MAX_BASIC_BLOCK_SPLITS
    max_basic_block_splits: int = 0
    shared_memory_per_block: int = SHARED_MEMORY_PER_BLOCK
    #: build every fusion the pass decides on copies first and refuse it where the cost model (`hlopt cost`'s)
    #: times it slower than the kernels it replaces (`fusion_trial.FusionTrial`; XLA's GpuPerformanceModel check)
    never_slower: bool = True

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
        self._flops = InstructionFlops(device, keys=shared_keys(module))

    @property
    def cost(self) -> FusionCostModel:
        """The cost model of this run's device (made on first use)."""
        return self._flops.cost

    def flops_of(self, inst: Instruction) -> tuple[float, float, float]:
        """`instruction_flops` with this run's cost model, cached by instruction id for the run."""
        return self._flops.flops_of(inst)

    def fusion_profile(self, fusion: Instruction) -> Any:
        """`fusion`'s walked Profile (`fusion_cost`), remembered for the run by the fusion's structure."""
        return self._flops.fusion_profile(fusion)

    def single_profile(self, inst: Instruction) -> Any:
        """An unfused instruction's Profile (`fusion_cost`), remembered for the run by its structure."""
        return self._flops.single_profile(inst)

    def explain(self, computation: str, producer: str, consumers: tuple[str, ...], taken: bool, reason: str,
                gain_us: float | None = None, verdict: Any = None, rule: str = "") -> None:
        """Record one decision of this run (`verdict`: the never-slower check's `TrialVerdict`, if it ran;
        `rule`: the rule that allowed or refused it)."""
        e = Explanation(self.pass_name, computation, producer, consumers, taken, reason, gain_us, rule=rule)
        if verdict is not None:
            e.before_us, e.after_us, e.launches_saved = verdict.before_us, verdict.after_us, verdict.launches_saved
        self.explanations.append(e)

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
    #: the cost model's time of the parts before and of the kernels after (us, launches included), and the
    #: launches saved: the never-slower check's figures, where it ran
    before_us: float | None = None
    after_us: float | None = None
    launches_saved: int | None = None
    #: the rule that allowed (or refused) it: `priority`, `triton`, `sibling`, `producer-consumer`, ...
    rule: str = ""

    def __str__(self) -> str:
        into = f" into {', '.join('%' + c for c in self.consumers)}" if self.consumers else ""
        verb = "fused" if self.taken else "refused"
        gain = f"; modeled gain {self.gain_us:+.3f} us" if self.gain_us is not None else ""
        rule = f" [{self.rule}]" if self.rule else ""
        check = ""
        if self.before_us is not None and self.after_us is not None:
            check = (f"; cost model {self.before_us:.3f} -> {self.after_us:.3f} us, "
                     f"{self.launches_saved} launch(es) saved")
        return f"[{self.pass_name}]{rule} {self.computation}: {verb} %{self.producer}{into}: {self.reason}{gain}{check}"


def _name_parameters(comp: Computation, module: Module) -> None:
    """Parameter n is called `param_n` (uniquified), as in XLA's fused computations."""
    for p in comp.parameters:
        n = p.attrs["parameter_number"]
        if p.name != f"param_{n}" and not p.name.startswith(f"param_{n}."):
            p.name = module.unique_name(f"param_{n}")
