"""Fusion budgets: XLA:GPU's limits on one fusion (operands and outputs, unnested reductions, shared
memory, code size) and the rules that read Profiles (FusionFitsInBudget, ProducerConsumerMergedTooLarge,
CreatesHeavyComputation).
"""

from __future__ import annotations

from dataclasses import dataclass

from hlopt.hlo.ir import Instruction
from hlopt.passes.fusion.fusion_cost import Profile, param_reads_multiple, reads_elements_multiple_times
from hlopt.passes.fusion.fusion_rules import (
    MAX_IR_SIZE,
    MAX_OPERANDS_AND_OUTPUTS,
    MAX_UNNESTED_REDUCTIONS,
    SHARED_MEMORY_PER_BLOCK,
)

__all__ = [
    "Budgets", "DEFAULT_BUDGETS", "budget_refusal", "merged_too_large", "creates_heavy_computation",
]


@dataclass(frozen=True, slots=True)
class Budgets:
    """XLA:GPU's limits on one fusion (the passes' options)."""

    max_operands_and_outputs: int = MAX_OPERANDS_AND_OUTPUTS
    max_unnested_reductions: int = MAX_UNNESTED_REDUCTIONS
    max_ir_size: int = MAX_IR_SIZE
    #: 0: no limit (XLA:GPU's MLIR emitters); N: the legacy emitters' limit (see `merged_too_large`)
    max_basic_block_splits: int = 0
    shared_memory_per_block: int = SHARED_MEMORY_PER_BLOCK


DEFAULT_BUDGETS = Budgets()


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
    as the consumer emits its parameter, and the merged IR may not exceed `max_ir_size`. With
    `max_basic_block_splits` set (XLA's legacy emitters, xla_gpu_mlir_emitter_level < 4, removed from XLA in
    October 2024), more block-splitting ops than that refuse, and each doubles the code."""
    rep = 1.0
    if consumer.opcode == "fusion":
        rep = max((e for op, e in zip(consumer.operands, c.emitted, strict=False) if op is producer), default=1.0)
    size = p.ir_size * rep + c.ir_size
    if budgets.max_basic_block_splits:
        splits = rep * p.bb_splits + c.bb_splits
        if splits > budgets.max_basic_block_splits:
            return f"code size: {splits:.0f} basic-block splits > {budgets.max_basic_block_splits}"
        size *= 2 ** splits
    if size > budgets.max_ir_size:
        return f"code size: IR size {size:.0f} > {budgets.max_ir_size}"
    return None


def creates_heavy_computation(producer: Instruction, p: Profile, consumer: Instruction, c: Profile) -> bool:
    """XLA's CreatesHeavyComputation: an expensive-to-repeat producer into a consumer that reads its
    elements several times (broadcast, gather, overlapping windows) would be recomputed per read."""
    if not p.expensive_to_repeat:
        return False
    if consumer.opcode != "fusion":
        return reads_elements_multiple_times(consumer)
    reads = param_reads_multiple(consumer, c)
    return any(reads[i] for i, op in enumerate(consumer.operands) if op is producer)
