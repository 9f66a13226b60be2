"""Costs the scheduler and simulator read: a node's run time and an async op's start-to-done latency.

`estimator_for(name, device)` gives either XLA's ApproximateLatencyEstimator (`approximate`: unit costs,
used by XLA's own scheduler tests) or the analytical GPU model of `cost_model/` (`analytical`).
Both speak the `LatencyEstimator` protocol, so users can plug in their own (e.g. a measured profile).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from hlopt.hlo.ir import Instruction
from hlopt.scheduler.async_ops import async_kind, done_of, is_async_done, is_async_start, is_sync_collective

__all__ = ["LatencyEstimator", "ApproximateLatencyEstimator", "AnalyticalLatencyEstimator", "estimator_for",
           "stream_cost", "is_overlapped_start", "is_overlapped_done"]


@runtime_checkable
class LatencyEstimator(Protocol):
    """Node costs and edge latencies, in microseconds."""

    def node_cost(self, inst: Instruction) -> float:
        """Time the instruction occupies the compute stream."""

    def latency(self, start: Instruction, done: Instruction) -> float:
        """Time between an async start and its done (the collective's duration)."""


class ApproximateLatencyEstimator:
    """XLA's ApproximateLatencyEstimator: 1 / 1000 / 5000 units; async pairs 5000 apart."""

    LOW_COST = 1.0
    MEDIUM_COST = 1000.0
    HIGH_COST = 5000.0
    LOW_LATENCY = 1.0
    HIGH_LATENCY = 5000.0

    def node_cost(self, inst: Instruction) -> float:
        """Convolutions and output fusions cost 5000, loop fusions 1000, the rest 1."""
        if is_async_start(inst) or is_async_done(inst):
            return 0.0
        if inst.opcode == "convolution":
            return self.HIGH_COST
        if inst.opcode == "fusion":
            kind = str(inst.get("kind", ""))
            return self.HIGH_COST if kind == "kOutput" else self.MEDIUM_COST
        return self.LOW_COST

    def latency(self, start: Instruction, done: Instruction) -> float:
        """Every async pair is 5000 apart."""
        return self.HIGH_LATENCY


class AnalyticalLatencyEstimator:
    """Times from the analytical GPU cost model (`cost_model/`), in microseconds."""

    def __init__(self, device: str = "h100"):
        self.device = device
        self._model = _load_cost_model(device)
        self._cache: dict[Instruction, float] = {}
        self._latencies: dict[Instruction, float] = {}  # async start -> its collective's time

    def node_cost(self, inst: Instruction) -> float:
        """The kernel's modeled time (0 for async starts/dones and ops that launch nothing)."""
        if is_async_start(inst) or is_async_done(inst):
            return 0.0
        cached = self._cache.get(inst)
        if cached is None:
            cached = self._cache[inst] = float(self._model.node_time_us(inst))
        return cached

    def latency(self, start: Instruction, done: Instruction) -> float:
        """The collective's modeled time (cached per start: the graph, the timeline and the bounds ask)."""
        cached = self._latencies.get(start)
        if cached is None:
            cached = self._latencies[start] = float(self._model.async_latency_us(start))
        return cached


def is_overlapped_start(inst: Instruction) -> bool:
    """An async start whose work runs beside the compute stream (not one XLA marked `is_sync`)."""
    return is_async_start(inst) and not is_sync_collective(inst)


def is_overlapped_done(inst: Instruction) -> bool:
    """The done of an overlapped async start."""
    return is_async_done(inst) and not is_sync_collective(inst)


def stream_cost(estimator: LatencyEstimator, inst: Instruction) -> float:
    """Time `inst` occupies the compute stream: a sync-marked start blocks it for the collective's latency,
    other async starts and every done take none, the rest their `node_cost`."""
    if is_async_start(inst):
        if not is_sync_collective(inst):
            return 0.0
        done = done_of(inst)
        return float(estimator.latency(inst, done)) if done is not None else 0.0
    if is_async_done(inst):
        return 0.0
    return float(estimator.node_cost(inst))


def _load_cost_model(device: str):
    from hlopt.cost_model import get_cost_model

    return get_cost_model(device)


def estimator_for(name: str, device: str = "h100") -> LatencyEstimator:
    """`approximate` (XLA's unit-cost estimator) or `analytical` (the GPU cost model)."""
    if name == "approximate":
        return ApproximateLatencyEstimator()
    if name == "analytical":
        return AnalyticalLatencyEstimator(device)
    raise ValueError(f"unknown latency estimator {name!r} (approximate, analytical)")


_ = async_kind
