"""XLA:GPU's `is_sync` marks on async collectives, as a decision of the schedule.

XLA's GpuConvertAsyncCollectivesToSync runs after its latency-hiding scheduler and marks every async pair
whose start and done have nothing but no-op instructions between them (backend_config
collective_backend_config.is_sync=true): they then run on the compute stream. The marks are a
consequence of XLA's order; re-scheduling an XLA-compiled module can `clear_sync_marks` first (so the
pairs are async again and may overlap compute), and `mark_sync_pairs` afterwards re-derives them for the
new order, as XLA would.
"""

from __future__ import annotations

from hlopt.hlo.ir import Computation, Instruction
from hlopt.scheduler.async_ops import is_async_done, is_async_start, is_sync_collective, matching_start

__all__ = ["clear_sync_marks", "mark_sync_pairs", "NOP_OPCODES"]

#: Instructions that launch nothing (XLA's IsNopInstruction on GPU).
NOP_OPCODES = frozenset({"get-tuple-element", "bitcast", "constant", "parameter", "tuple", "partition-id",
                         "replica-id", "opt-barrier"})


def _set_sync(start: Instruction, value: bool) -> None:
    config = start.backend_config_json() or {}
    collective = dict(config.get("collective_backend_config") or {})
    collective["is_sync"] = value
    config["collective_backend_config"] = collective
    start.set_backend_config_json(config)


def clear_sync_marks(comp: Computation) -> list[Instruction]:
    """Set is_sync=false on every marked async start of `comp`; the starts changed."""
    marked = [i for i in comp.instructions if is_async_start(i) and is_sync_collective(i)]
    for start in marked:
        _set_sync(start, False)
    return marked


def mark_sync_pairs(comp: Computation) -> list[Instruction]:
    """Mark is_sync=true on each collective start whose done follows it with only no-ops between (in
    `comp`'s current order); the starts marked. Only starts that carry a GPU backend_config
    with a collective_backend_config are touched (others, e.g. CPU modules, are left as they are)."""
    marked = []
    open_starts: dict[Instruction, bool] = {}  # start -> still nothing but no-ops since it
    for inst in comp.instructions:
        if is_async_start(inst):
            open_starts[inst] = True
            continue
        if is_async_done(inst):
            start = matching_start(inst)
            if open_starts.pop(start, False) and _has_collective_config(start) and not is_sync_collective(start):
                _set_sync(start, True)
                marked.append(start)
            continue
        if inst.opcode not in NOP_OPCODES:
            for start in open_starts:
                open_starts[start] = False
    return marked


def _has_collective_config(start: Instruction) -> bool:
    config = start.backend_config_json() if start.backend_config else None
    return isinstance(config, dict) and isinstance(config.get("collective_backend_config"), dict)
