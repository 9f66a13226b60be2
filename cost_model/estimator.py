"""The one interface every per-instruction time in hlopt is read through, and its implementations.

A `LatencyEstimator` answers two questions, in microseconds: how long an instruction occupies the compute
stream (`node_cost`), and how long an async collective runs between its start and its done (`latency`). The
scheduler (its graph, fill, bounds and simulator), the collective-pipeliner's gate (through the same machine,
`cost_model.streams`) and the rating of final modules all ask it, so a model plugged in here is seen by all.

Implementations:
- `AnalyticalLatencyEstimator(device)`: the analytical GPU model of `cost_model.model` (`get_cost_model`), or
  any model registered by name (`cost_model.profile.register_cost_model`), such as a `MeasuredProfileModel` of
  measured kernel times (`MeasuredLatencyEstimator` builds one from a profile file);
- `ApproximateLatencyEstimator`: XLA's ApproximateLatencyEstimator (unit costs, for XLA's scheduler tests);
- XLA's own estimates read off a compiled module (`runtime.xla_gpu_path.xla_gpu.XlaEstimateLatency`: it needs XLA's final
  module and simulates loop bodies with the scheduler, so it lives above them, and speaks this protocol).

`estimator_for(name, device)` picks one by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from hlopt.hlo.ir import Instruction

__all__ = ["LatencyEstimator", "ApproximateLatencyEstimator", "AnalyticalLatencyEstimator",
           "MeasuredLatencyEstimator", "estimator_for", "ESTIMATORS", "FREE_OPCODES"]

#: Opcodes that launch nothing: no time on any stream (what the pipeliner's gate counts as free).
FREE_OPCODES = frozenset({"parameter", "get-tuple-element", "tuple", "constant", "bitcast", "opt-barrier",
                          "after-all", "add-dependency"})
#: Names `estimator_for` knows.
ESTIMATORS = ("approximate", "analytical")


@runtime_checkable
class LatencyEstimator(Protocol):
    """Node costs and edge latencies, in microseconds."""

    def node_cost(self, inst: Instruction) -> float:
        """Time the instruction occupies the compute stream (a synchronous collective: its whole time)."""

    def latency(self, start: Instruction, done: Instruction) -> float:
        """Time between an async start and its done (the collective's duration)."""


def _is_async_start(inst: Instruction) -> bool:
    return inst.opcode.endswith("-start") or inst.opcode in ("send", "recv")


def _is_async_done(inst: Instruction) -> bool:
    return inst.opcode.endswith("-done")


class ApproximateLatencyEstimator:
    """XLA's ApproximateLatencyEstimator: 1 / 1000 / 5000 units; async pairs 5000 apart."""

    LOW_COST = 1.0
    MEDIUM_COST = 1000.0
    HIGH_COST = 5000.0
    LOW_LATENCY = 1.0
    HIGH_LATENCY = 5000.0

    def node_cost(self, inst: Instruction) -> float:
        """Convolutions and output fusions cost 5000, loop fusions 1000, the rest 1."""
        if _is_async_start(inst) or _is_async_done(inst):
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
    """Times from a `CostModel` (`node_time_us`, `async_latency_us`): the analytical GPU model of
    `cost_model/` for a device name, or a model registered under that name (a measured profile)."""

    def __init__(self, device: str = "h100", model=None):
        self.device = device
        self._model = model if model is not None else _load_cost_model(device)
        self._cache: dict[Instruction, float] = {}
        self._latencies: dict[Instruction, float] = {}  # async start -> its collective's time

    @property
    def model(self):
        """The `CostModel` the times come from."""
        return self._model

    def node_cost(self, inst: Instruction) -> float:
        """The kernel's modeled time (0 for async starts/dones and ops that launch nothing)."""
        if _is_async_start(inst) or _is_async_done(inst):
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


class MeasuredLatencyEstimator(AnalyticalLatencyEstimator):
    """Measured kernel times (`cost_model.profile.MeasuredProfileModel`: a JSON profile of per-instruction
    times), the analytical model of `base` for what the profile does not hold."""

    def __init__(self, profile: str | Path, base: str = "h100"):
        from hlopt.cost_model.profile import MeasuredProfileModel

        super().__init__(base, MeasuredProfileModel.from_json(profile, base=base))


def _load_cost_model(device: str):
    from hlopt.cost_model.model import get_cost_model

    return get_cost_model(device)


def estimator_for(name: str, device: str = "h100") -> LatencyEstimator:
    """`approximate` (XLA's unit-cost estimator) or `analytical` (the GPU cost model of `device`, or the model
    registered under that name)."""
    if name == "approximate":
        return ApproximateLatencyEstimator()
    if name == "analytical":
        return AnalyticalLatencyEstimator(device)
    raise ValueError(f"unknown latency estimator {name!r} (approximate, analytical)")
