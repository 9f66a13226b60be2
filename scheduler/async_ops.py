"""Recognizing async start/done pairs and the resource (stream) each occupies.

Two machine models (`STREAM_MODELS`), chosen per run with `stream_model(name)`:

- `xla-gpu` (the default) is XLA:GPU's (DEVELOPERS.md, "XLA:GPU's streams"): every async collective
  (all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute, and async-start wrappers of
  them) runs on ONE collective stream (`AsyncStreamKind::kCollective`, the scheduler's
  `kGpuAsyncStreamCollectives` resource); send/recv run on the P2P streams (pipeline 0 or 1); copy-start
  on the memcpy stream; an async-start wrapping computation on an async compute stream. A CUDA stream runs
  its work one item at a time, whatever the scheduler's overlap limit lets be in flight, and a start XLA
  marked `is_sync` runs on the compute stream and holds no async stream.
- `per-type` is XLA's generic `AsyncTracker` (the one XLA's scheduler tests use): one resource per
  collective type, `limit` of them running at once, and a sync-marked start still holds a slot of its
  type.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from hlopt.hlo.ir import Instruction

__all__ = ["is_async_start", "is_async_done", "async_kind", "RESOURCE_KINDS", "wrapped_opcode", "is_sync_collective",
           "done_of", "STREAM_MODELS", "stream_model", "current_stream_model", "xla_gpu_stream", "type_kind",
           "stream_slots", "sync_start_holds_slot", "XLA_GPU_STREAM_LIMITS"]

#: The machine models `async_kind` answers for (module docstring).
STREAM_MODELS = ("xla-gpu", "per-type")
_MODEL: contextvars.ContextVar[str] = contextvars.ContextVar("hlopt_stream_model", default="xla-gpu")

#: XLA:GPU's overlap limits of its async streams besides the collective stream (whose limit is the
#: scheduler's `overlap_limit`, XLA's `xla_gpu_experimental_parallel_collective_overlap_limit`, default 1):
#: kNumAsyncCollectivesP2P for the P2P streams, unbounded memcpy (gpu_latency_hiding_scheduler.cc).
XLA_GPU_STREAM_LIMITS = {"p2p0": 4, "p2p1": 4, "memcpy": 1 << 30}

#: Resource kinds of the per-type model, one per collective type.
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


@contextlib.contextmanager
def stream_model(name: str) -> Iterator[str]:
    """Within the block, `async_kind` (and the simulator, bounds, scheduler) use machine model `name`."""
    if name not in STREAM_MODELS:
        raise ValueError(f"unknown stream model {name!r} (known: {', '.join(STREAM_MODELS)})")
    token = _MODEL.set(name)
    try:
        yield name
    finally:
        _MODEL.reset(token)


def current_stream_model() -> str:
    """The machine model in force (`xla-gpu` unless a `stream_model` block says otherwise)."""
    return _MODEL.get()


def stream_slots(limit: int) -> int:
    """How many of one resource's collectives run at once: 1 on XLA:GPU (a CUDA stream runs its work in
    order; the overlap limit only bounds how many are in flight), `limit` in the per-type model."""
    return 1 if _MODEL.get() == "xla-gpu" else max(limit, 1)


def sync_start_holds_slot() -> bool:
    """Whether a start XLA marked `is_sync` holds a slot of its resource: not on XLA:GPU (it runs on the
    compute stream, and XLA's GPU scheduler gives it no async resource), yes in the per-type model."""
    return _MODEL.get() != "xla-gpu"


def async_kind(inst: Instruction) -> str:
    """The resource of an async start or done under the current model (`xla_gpu_stream` or `type_kind`)."""
    return xla_gpu_stream(inst) if _MODEL.get() == "xla-gpu" else type_kind(inst)


_P2P_PIPELINE_ATTR = "_xla_send_recv_pipeline"


def xla_gpu_stream(inst: Instruction) -> str:
    """The XLA:GPU stream an async start or done runs on: "collective", "p2p0" / "p2p1" (send/recv, by
    their `_xla_send_recv_pipeline` attribute), "memcpy" (copy-start) or "async-compute" (an async-start
    wrapping computation)."""
    kind = type_kind(inst)
    if kind in ("send", "recv"):
        start = inst if is_async_start(inst) else (matching_start(inst) or inst)
        pipeline = str(start.frontend_attributes.get(_P2P_PIPELINE_ATTR, "0"))
        return "p2p1" if pipeline == "1" else "p2p0"
    if kind == "copy":
        return "memcpy"
    if kind == "async":
        return "async-compute"
    return "collective"


def type_kind(inst: Instruction) -> str:
    """The resource of an async start or done in the per-type model: its collective type."""
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
    return start.backend_config_value("collective_backend_config", "is_sync") is True


def done_of(start: Instruction) -> Instruction | None:
    """The done of an async start (None if it has none)."""
    return next((u for u in start.users if is_async_done(u)), None)
