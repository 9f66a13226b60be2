"""tree-reduction-rewriter: a column reduction over many rows into few columns becomes two reductions, where the
cost model rates the two kernels faster than the one (XLA:GPU's TreeReductionRewriter, with a speed rule).

Before (batch-norm's per-channel sum over N*H*W = 4096 rows, 64 channels):
    %r = f32[64] reduce(f32[16,16,16,64] %x, %zero), dimensions={0,1,2}, to_apply=%sum
After:
    %x3 = f32[64,64,64] reshape(%x)                                   # [k1, k2, channels], a bitcast
    %r1 = f32[64,64] reduce(%x3, %zero), dimensions={1}, to_apply=%sum # 4096 outputs: many blocks
    %r = f32[64] reduce(%r1, %zero), dimensions={0}, to_apply=%sum

XLA:GPU's column-reduction emitter gives each block 32 columns and walks the rows within the block: with 64
columns it runs two blocks, and XLA's own model (GpuPerformanceModel) rates the example 16.7 us, memory-bound at
a fraction of the bandwidth, where the two reductions are rated 0.32 us and 0.26 us plus one launch. XLA's
TreeReductionRewriter splits a reduction the same way, but only where one block could not reduce it without
atomics (the reduced size above its race-free bound, 32 * 128 = 4096 rows for a column reduction): it is a
correctness rule, not a speed rule, so at 4096 rows XLA keeps the slow kernel. This pass, run before
priority-fusion in `xla-gpu-after`, splits a column reduction (a reduced block of dimensions followed by kept
minor dimensions, in the layout's order, optionally after kept major dimensions) into [k1, k2] rows, k2 the
largest divisor of the row count between sqrt(rows)/2 and sqrt(rows) (a power of two preferred, as XLA's
ComputeSplitParams chooses it), when the cost model (`cost_model`, what `hlopt cost` reports) times the two
kernels, launches included, below the one. As in XLA's rewriter the init value is applied in both reductions (an
identity of the reducer); the sum is taken in a different order, so floating-point results can differ by rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.shape import Shape
from hlopt.passes.framework.base import ModulePass, PassResult
from hlopt.passes.framework.registry import register
from hlopt.passes.fusion.fusion_rules import fusible_computations
from hlopt.passes.fusion.fusion_run import Explanation

__all__ = ["SplitExplanation", "TreeReductionRewriter", "split_plan"]

#: Rows below this are never split (the stage kernels would not pay their launch).
MIN_ROWS = 1024


def _default_layout(shape: Shape) -> bool:
    layout = shape.layout
    return layout is None or list(layout.minor_to_major) == list(range(shape.rank - 1, -1, -1))


def split_plan(reduce: Instruction) -> tuple[int, int, int, int] | None:
    """(batch, rows, columns, k2) of a column reduction this pass may split, or None: one operand and init,
    the operand in the default layout, its dimensions kept-major (batch), reduced (rows), kept-minor
    (columns), each block contiguous, and a divisor k2 of the rows found."""
    if reduce.opcode != "reduce" or reduce.operand_count != 2 or reduce.shape.is_tuple:
        return None
    if reduce.has_control_dependencies:
        return None
    shape = reduce.operand(0).shape
    if shape.is_tuple or not _default_layout(shape) or not _default_layout(reduce.shape):
        return None
    reduced = sorted(reduce.attrs.get("dimensions", ()))
    if not reduced or reduced != list(range(reduced[0], reduced[-1] + 1)) or reduced[-1] == shape.rank - 1:
        return None
    dims = shape.dims
    batch = math.prod(dims[:reduced[0]])
    rows = math.prod(dims[d] for d in reduced)
    columns = math.prod(dims[reduced[-1] + 1:])
    if rows < MIN_ROWS:
        return None
    k2 = _split_factor(rows)
    return None if k2 is None else (batch, rows, columns, k2)


def _split_factor(rows: int) -> int | None:
    """The largest divisor of `rows` in (sqrt(rows)/2, sqrt(rows)], a power of two first; None if there is none."""
    top = math.isqrt(rows)
    divisors = [k for k in range(top, top // 2, -1) if rows % k == 0]
    if not divisors:
        return None
    powers = [k for k in divisors if k & (k - 1) == 0]
    return (powers or divisors)[0]


def _split(reduce: Instruction, plan: tuple[int, int, int, int]) -> tuple[Instruction, ...]:
    """Replace `reduce` by reshape, reduce, reduce (and a reshape back); returns the new instructions."""
    batch, rows, columns, k2 = plan
    comp = reduce.parent
    module = comp.module
    x, init = reduce.operands
    dtype = x.shape.dtype
    lead = (batch,) if batch > 1 else ()
    shaped = Shape(dtype, (*lead, rows // k2, k2, columns)).with_default_layout()
    reshape = Instruction("reshape", shaped, [x], name=module.unique_name("reshape"))
    stage = Shape(dtype, (*lead, rows // k2, columns)).with_default_layout()
    first = Instruction("reduce", stage, [reshape, init], name=module.unique_name(reduce.name + ".split"),
                        dimensions=(len(lead) + 1,), to_apply=reduce.attrs["to_apply"])
    final = Shape(dtype, (*lead, columns)).with_default_layout()
    second = Instruction("reduce", final, [first, init], name=module.unique_name(reduce.name + ".tree"),
                         dimensions=(len(lead),), to_apply=reduce.attrs["to_apply"])
    made = [reshape, first, second]
    if tuple(final.dims) != tuple(reduce.shape.dims):
        made.append(Instruction("reshape", reduce.shape, [second], name=module.unique_name("reshape")))
    for inst in made:
        comp.add(inst, before=reduce)
        if reduce.metadata is not None:
            inst.metadata = reduce.metadata.copy()
    comp.replace_instruction(reduce, made[-1])
    return tuple(made)


class SplitExplanation(Explanation):
    """One decision of this pass (an `Explanation`, printed as a split rather than a fusion)."""

    __slots__ = ()

    def __str__(self) -> str:
        verb = "split" if self.taken else "kept"
        return (f"[{self.pass_name}] [{self.rule}] {self.computation}: {verb} %{self.producer}: {self.reason}; "
                f"cost model {self.before_us:.3f} us as one kernel, {self.after_us:.3f} us as two")


def _modeled_us(insts: list[Instruction], device: str) -> float:
    """The cost model's time of `insts` (each as its own kernel, launch included), built in a scratch module."""
    from hlopt.cost_model import get_cost_model

    model = get_cost_model(device)
    return sum(float(model.node_time_us(i)) for i in insts if i.opcode == "reduce")


def _scratch(reduce: Instruction) -> tuple[Module, Instruction]:
    """A module holding a copy of `reduce` reading a parameter (and its init), to try the split on."""
    m = Module("tree_reduction_trial")
    comp = Computation("trial")
    m.add_computation(comp, entry=True)
    x, init = reduce.operands
    p = comp.add(Instruction("parameter", x.shape, (), name="p", parameter_number=0))
    i = comp.add(init.clone(name="init", operands=()) if init.opcode == "constant" else
                 Instruction("parameter", init.shape, (), name="i", parameter_number=1))
    r = comp.add(reduce.clone(name="r", operands=[p, i]))
    comp.set_root(r)
    return m, r


@register
@dataclass(frozen=True)
class TreeReductionRewriter(ModulePass):
    """Split slow column reductions in two (see the module docstring)."""

    name: ClassVar[str] = "tree-reduction-rewriter"
    device: str = "h100"

    def run_with_result(self, module: Module) -> PassResult:
        """Split every column reduction the cost model rates faster split; the result explains each one."""
        explanations: list[SplitExplanation] = []
        changed = False
        for comp in fusible_computations(module):
            for inst in list(comp.instructions):
                plan = split_plan(inst)
                if plan is None:
                    continue
                _, trial = _scratch(inst)
                before = _modeled_us([trial], self.device)
                after = _modeled_us(list(_split(trial, plan)), self.device)
                taken = after < before
                explanations.append(SplitExplanation(
                    self.name, comp.name, inst.name, (), taken,
                    f"column reduction of {plan[1]} rows into {plan[1] // plan[3]} x {plan[3]}",
                    before - after, before, after, -1, rule="tree"))
                if taken:
                    _split(inst, plan)
                    changed = True
        return PassResult(changed, explanations)

    def run(self, module: Module) -> bool:
        """Run on `module`."""
        return self.run_with_result(module).changed
