"""Recognizing async start/done pairs and the resource (collective type) each occupies."""

from __future__ import annotations

from hlopt.hlo.ir import Instruction

__all__ = ["is_async_start", "is_async_done", "async_kind", "RESOURCE_KINDS", "wrapped_opcode", "is_sync_collective",
           "done_of"]

#: Resource kinds the scheduler tracks, one per collective type.
RESOURCE_KINDS = (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "copy", "send", "recv",
    "async",
)

_START_KIND = {
    "all-reduce-start": "all-reduce",
    "all-gather-start": "all-gather",
    "collective-permute-start": "collective-permute",
    "copy-start": "copy",
    "send": "send",
    "recv": "recv",
}
_DONE_KIND = {
    "all-reduce-done": "all-reduce",
    "all-gather-done": "all-gather",
    "collective-permute-done": "collective-permute",
    "copy-done": "copy",
    "send-done": "send",
    "recv-done": "recv",
}


def wrapped_opcode(inst: Instruction) -> str | None:
    """For async-start/update/done (and `X-start` sugar), the opcode of the wrapped instruction."""
    op = inst.opcode
    for suffix in ("-start", "-update", "-done"):
        if op.endswith(suffix) and op not in _START_KIND and op not in _DONE_KIND:
            base = op[: -len(suffix)]
            if base != "async":
                return base
    if op in ("async-start", "async-update", "async-done"):
        start = inst
        while start.opcode != "async-start" and start.operand_count:
            start = start.operand(0)
        calls = start.get("calls")
        if calls is not None and calls.root is not None:
            return calls.root.opcode
    return None


def is_async_start(inst: Instruction) -> bool:
    """True for an instruction that begins asynchronous work."""
    op = inst.opcode
    return op in _START_KIND or op.endswith("-start")


def is_async_done(inst: Instruction) -> bool:
    """True for an instruction that waits for asynchronous work."""
    op = inst.opcode
    return op in _DONE_KIND or op == "async-done" or op.endswith("-done")


def async_kind(inst: Instruction) -> str:
    """The resource kind of an async start or done."""
    op = inst.opcode
    if op in _START_KIND:
        return _START_KIND[op]
    if op in _DONE_KIND:
        return _DONE_KIND[op]
    wrapped = wrapped_opcode(inst)
    if wrapped in RESOURCE_KINDS:
        return wrapped
    return "async"


def matching_start(done: Instruction) -> Instruction | None:
    """The start a done waits for (through async-update chains)."""
    x = done
    while x.operand_count and not is_async_start(x.operand(0)):
        if not x.operand(0).opcode.endswith("-update"):
            return None
        x = x.operand(0)
    return x.operand(0) if x.operand_count else None


def _start_of(inst: Instruction) -> Instruction | None:
    """`inst` if it is a start, the start a done waits for, else None."""
    if is_async_start(inst):
        return inst
    return matching_start(inst) if is_async_done(inst) else None


def is_sync_collective(inst: Instruction) -> bool:
    """True for an async start (or its done) that XLA:GPU marked `is_sync`
    (backend_config {"collective_backend_config": {"is_sync": true}}): XLA's GpuConvertAsyncCollectivesToSync
    tags pairs with nothing to overlap, and XLA's GPU scheduler then treats them as ordinary synchronous
    instructions (not async pairs). The collective runs on the compute stream, blocking it."""
    start = _start_of(inst)
    if start is None or not start.backend_config or "is_sync" not in start.backend_config:
        return False
    try:
        config = start.backend_config_json()
    except ValueError:
        return False
    if not isinstance(config, dict):
        return False
    collective = config.get("collective_backend_config")
    return isinstance(collective, dict) and collective.get("is_sync") is True


def done_of(start: Instruction) -> Instruction | None:
    """The done of an async start (None if it has none)."""
    return next((u for u in start.users if is_async_done(u)), None)
