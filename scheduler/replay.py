"""An independent replay of a scheduled module on XLA:GPU's streams, to check `simulator.simulate` against.

It shares nothing with the simulator but the estimator (`node_cost` of a leaf instruction, `latency` of an
async collective) and is written from XLA:GPU's runtime (DEVELOPERS.md, "XLA:GPU's streams"), as simply
as an event replay can be:

- The entry computation runs on the main stream, instruction by instruction in its order (a scheduled
  module's order is its sequence). A while loop replays its condition and body on the same streams, trip
  after trip, then the last condition; a call replays its computation; a conditional its slowest branch.
- An async start whose collective XLA marked `is_sync` runs on the main stream; so does a synchronous
  collective. Any other start records an event on the main stream; its async stream waits for that event,
  then runs the collective: all-reduce, all-gather, reduce-scatter, all-to-all (and async-start wrappers
  of collectives) on the one collective stream (`AsyncStreamKind::kCollective`); send, recv and
  collective-permute on P2P stream 0 or 1 (`_xla_send_recv_pipeline`; the thunk emitter gives
  collective-permute-start a P2P stream kind, while XLA's scheduler counts it on the collective resource,
  so with its limit of 1 it never runs beside another collective either); copy-start on the memcpy
  stream; an async-start wrapping computation on the compute stream of its `operation_queue_id`.
- A done makes the main stream wait for its start's event on the async stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hlopt.hlo.ir import Computation, Instruction, Module

__all__ = ["ReplayResult", "replay", "replay_module"]

_COLLECTIVE_OPS = frozenset({"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                             "ragged-all-to-all", "collective-broadcast"})
_START_OPS = frozenset({"all-reduce-start", "all-gather-start", "collective-permute-start", "reduce-scatter-start",
                        "all-to-all-start", "copy-start", "async-start", "send", "recv"})
_DONE_OPS = frozenset({"all-reduce-done", "all-gather-done", "collective-permute-done", "reduce-scatter-done",
                       "all-to-all-done", "copy-done", "async-done", "send-done", "recv-done"})


@dataclass
class ReplayResult:
    """When the main stream finished, and each stream's busy time, in microseconds."""

    makespan_us: float
    busy_us: dict[str, float] = field(default_factory=dict)
    exposed_us: float = 0.0  # time the main stream waited at dones


class _Streams:
    """The clock of every stream and the end of every collective launched, for one replay."""

    def __init__(self) -> None:
        self.free: dict[str, float] = {"main": 0.0}
        self.busy: dict[str, float] = {}
        self.event: dict[Instruction, float] = {}  # async start -> when its work ends
        self.exposed = 0.0

    def run_main(self, duration: float) -> None:
        self.free["main"] += duration
        self.busy["main"] = self.busy.get("main", 0.0) + duration

    def launch(self, start: Instruction, stream: str, duration: float) -> None:
        begin = max(self.free.get(stream, 0.0), self.free["main"])  # the async stream waits for main
        self.free[stream] = begin + duration
        self.busy[stream] = self.busy.get(stream, 0.0) + duration
        self.event[start] = begin + duration

    def wait(self, start: Instruction) -> None:
        end = self.event.get(start, 0.0)
        if end > self.free["main"]:
            self.exposed += end - self.free["main"]
            self.free["main"] = end


def _config(inst: Instruction) -> Mapping:
    return inst.backend_config_dict()


def _is_sync(start: Instruction) -> bool:
    collective = _config(start).get("collective_backend_config")
    return isinstance(collective, dict) and collective.get("is_sync") is True


def _wrapped_root(start: Instruction) -> str | None:
    calls = start.attrs.get("calls")
    root = getattr(calls, "root", None)
    return root.opcode if root is not None else None


def _stream_of(start: Instruction) -> str:
    """The async stream an (un-synced) start runs on, from XLA:GPU's thunk emitter's choice."""
    op = start.opcode
    if op in ("send", "recv", "collective-permute-start"):  # the emitter's GetStreamKindForP2P
        return "p2p1" if str(start.frontend_attributes.get("_xla_send_recv_pipeline", "0")) == "1" else "p2p0"
    if op == "copy-start":
        return "memcpy"
    if op == "async-start" and _wrapped_root(start) not in _COLLECTIVE_OPS:
        return f"compute{_config(start).get('operation_queue_id', '') or ''}"
    return "collective"


def _start_of(done: Instruction) -> Instruction | None:
    x = done
    while x.operand_count:
        x = x.operand(0)
        if x.opcode in _START_OPS:
            return x
        if not x.opcode.endswith("-update"):
            return None
    return None


def _done_of(start: Instruction) -> Instruction | None:
    for user in start.users:
        if user.opcode in _DONE_OPS:
            return user
        if user.opcode.endswith("-update"):
            return _done_of(user)
    return None


def _trips(loop: Instruction) -> int:
    n = (_config(loop).get("known_trip_count") or {}).get("n")
    if n is not None:
        return max(int(n), 1)
    from hlopt.cost_model.model import trip_count  # the condition's `i < N`, where XLA wrote no count

    return trip_count(loop)


class _Replayer:
    def __init__(self, estimator) -> None:
        self.estimator = estimator

    def computation(self, comp: Computation, streams: _Streams) -> None:
        for inst in comp.instructions:
            self.instruction(inst, streams)

    def instruction(self, inst: Instruction, streams: _Streams) -> None:
        op = inst.opcode
        if op == "while":
            body, cond = inst.attrs["body"], inst.attrs["condition"]
            for _ in range(_trips(inst)):
                self.computation(cond, streams)
                self.computation(body, streams)
            self.computation(cond, streams)
        elif op == "call":
            self.computation(inst.attrs["to_apply"], streams)
        elif op == "conditional":
            self.slowest_branch(inst, streams)
        elif op in _START_OPS:
            done = _done_of(inst)
            duration = float(self.estimator.latency(inst, done)) if done is not None else 0.0
            if _is_sync(inst):
                streams.run_main(duration)
            else:
                streams.launch(inst, _stream_of(inst), duration)
        elif op in _DONE_OPS:
            start = _start_of(inst)
            if start is not None and not _is_sync(start):
                streams.wait(start)
        elif op.endswith("-update"):
            pass
        else:
            streams.run_main(float(self.estimator.node_cost(inst)))

    def slowest_branch(self, inst: Instruction, streams: _Streams) -> None:
        """The branch whose replay ends last (the branch taken is unknown)."""
        best: _Streams | None = None
        for branch in inst.called_computations:
            trial = _Streams()
            trial.free, trial.busy, trial.event = dict(streams.free), dict(streams.busy), dict(streams.event)
            trial.exposed = streams.exposed
            self.computation(branch, trial)
            if best is None or trial.free["main"] > best.free["main"]:
                best = trial
        if best is not None:
            streams.free, streams.busy, streams.event, streams.exposed = best.free, best.busy, best.event, best.exposed


def replay(comp: Computation, estimator) -> ReplayResult:
    """Replay `comp` (its instructions in order) on XLA:GPU's streams with `estimator`'s times."""
    streams = _Streams()
    _Replayer(estimator).computation(comp, streams)
    return ReplayResult(streams.free["main"], dict(streams.busy), streams.exposed)


def replay_module(module: Module, estimator) -> ReplayResult:
    """`replay` of the module's entry computation."""
    return replay(module.entry, estimator)
