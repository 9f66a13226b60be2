"""The one side-effect rule: XLA's HloInstruction::HasSideEffect (xla/hlo/ir/hlo_instruction.cc).

An instruction has a side effect of its own (`HasSideEffectNoRecurse`) when it is send/recv (and their
dones), infeed/outfeed, rng, an async all-reduce/all-gather/collective-permute (start or done), a
collective-broadcast, a side-effecting custom-call, a collective with `constrain_layout`, or a collective
with a channel outside an SPMD module; an async-update/done shares its start's effect, and async sugar
(`custom-call-start`, ...) has the wrapped op's. `has_side_effect` adds what the called computations do.
DCE keeps such instructions when dead, `Computation.replace_instruction` keeps such operands, and the
scheduler's fill does not move them.

A module is SPMD when it runs more than one partition (XLA's `use_spmd_partitioning`, which its HLO text
cannot carry; jax partitions with SPMD whenever it has more than one partition).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hlopt.hlo.opcodes import async_base

if TYPE_CHECKING:
    from hlopt.hlo.ir import Computation, Instruction, Module

__all__ = ["SideEffects", "is_spmd"]

_ALWAYS = frozenset({
    "send", "send-done", "recv", "recv-done", "infeed", "outfeed", "rng", "rng-get-and-update-state",
    "all-reduce-start", "all-reduce-done", "all-gather-start", "all-gather-done", "collective-broadcast",
    "collective-permute-start", "collective-permute-done",
})
#: Collectives whose `constrain_layout` makes them side-effecting (XLA's HloCollectiveInstruction).
LAYOUT_CONSTRAINED = frozenset({"all-to-all", "all-gather", "all-reduce", "reduce-scatter", "ragged-all-to-all"})
#: Instructions whose channel makes them side-effecting outside SPMD modules (XLA's HloChannelInstruction).
_CHANNEL = LAYOUT_CONSTRAINED | {"collective-permute"}


def is_spmd(module: Module | None) -> bool:
    """Whether `module` is partitioned SPMD (more than one partition)."""
    partitions = module.config.get("num_partitions", 1) if module is not None else 1
    return int(partitions or 1) > 1


class SideEffects:
    """XLA's HasSideEffect for the instructions of one module, memoized per called computation; make one
    per pass run (the memo assumes the called computations do not change meanwhile)."""

    def __init__(self, module: Module | None):
        self.spmd = is_spmd(module)
        self._computations: dict[Computation, bool] = {}

    def own(self, inst: Instruction) -> bool:
        """The instruction's own side effect (XLA's HasSideEffectNoRecurse)."""
        op = inst.opcode
        plain = _PLAIN.get(op)
        if plain is None:
            plain = _PLAIN[op] = _is_plain(op)
        if plain:
            return False
        if _is_async_tail(inst):
            return self(chain_start(inst))  # an async-done/update shares its start's wrapped op
        base = async_base(op)
        if base is not None:  # `custom-call-start` and friends: the wrapped op decides
            return base == "custom-call" and inst.attrs.get("custom_call_has_side_effect") is True
        if op in _ALWAYS:
            return True
        if op in _CHANNEL:
            if op != "collective-permute" and inst.attrs.get("constrain_layout") is True:
                return True
            return inst.attrs.get("channel_id") is not None and not self.spmd
        if op == "custom-call":
            return inst.attrs.get("custom_call_has_side_effect") is True
        return False

    def __call__(self, inst: Instruction) -> bool:
        """Whether `inst` or anything it calls has a side effect (XLA's HasSideEffect)."""
        if self.own(inst):
            return True
        return any(self.computation(c) for c in inst.called_computations)

    def computation(self, comp: Computation) -> bool:
        """Whether any instruction of `comp` (or of its callees) has a side effect."""
        known = self._computations.get(comp)
        if known is None:
            self._computations[comp] = False  # recursion guard
            known = any(self(i) for i in comp.instructions)
            self._computations[comp] = known
        return known


#: opcode -> whether `SideEffects.own` is False for every instruction of it, whatever its attributes
_PLAIN: dict[str, bool] = {}


def _is_plain(op: str) -> bool:
    """No async op, none of the always side-effecting ones, no channel instruction, no custom-call."""
    return async_base(op) is None and op not in ("async-update", "async-done") and op not in _ALWAYS \
        and op not in _CHANNEL and op != "custom-call"


def _is_async_tail(inst: Instruction) -> bool:
    op = inst.opcode
    return op in ("async-update", "async-done") or (
        async_base(op) is not None and op.endswith(("-done", "-update")))


def chain_start(inst: Instruction) -> Instruction:
    """The start of the async chain an async-update/done belongs to (`inst` itself otherwise)."""
    while _is_async_tail(inst) and inst.operand_count:
        inst = inst.operand(0)
    return inst
