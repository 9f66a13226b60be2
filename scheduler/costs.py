"""Costs the scheduler and simulator read: a node's run time and an async op's start-to-done latency.

The estimator interface and its implementations live in `cost_model.estimator` (re-exported here under the
names the scheduler always had): `estimator_for(name, device)` gives either XLA's ApproximateLatencyEstimator
(`approximate`: unit costs, used by XLA's own scheduler tests) or the analytical GPU model of `cost_model/`
(`analytical`). All speak the `LatencyEstimator` protocol, so users can plug in their own (e.g. a measured
profile, `cost_model.estimator.MeasuredLatencyEstimator`). What is the scheduler's own: how an async pair
occupies the streams (`stream_cost`, `is_overlapped_start`, `is_overlapped_done`).
"""

from __future__ import annotations

from hlopt.cost_model.estimator import (
    AnalyticalLatencyEstimator,
    ApproximateLatencyEstimator,
    LatencyEstimator,
    MeasuredLatencyEstimator,
    estimator_for,
)
from hlopt.hlo.ir import Instruction
from hlopt.scheduler.async_ops import async_kind, done_of, is_async_done, is_async_start, is_sync_collective

__all__ = ["LatencyEstimator", "ApproximateLatencyEstimator", "AnalyticalLatencyEstimator", "estimator_for",
           "stream_cost", "is_overlapped_start", "is_overlapped_done", "MeasuredLatencyEstimator"]


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


_ = async_kind
