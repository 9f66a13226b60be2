"""User cost models: a registry by name, and a model built from measured kernel times.

Fusion and the scheduler get their model from `get_cost_model(name)`. A name registered here wins over the
built-in devices, so a plugin file (loaded with `--load`) can do::

    from hlopt.cost_model import MeasuredProfileModel, register_cost_model

    register_cost_model("my-h100-profile", lambda: MeasuredProfileModel.from_json("profile.json", base="h100"))

and then `hlopt schedule IN --device my-h100-profile` (or `latency-hiding-scheduler{device=my-h100-profile}`)
schedules with measured times. Any object with `node_time_us(inst)` and `async_latency_us(start)` (the
`CostModel` protocol) can be registered.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hlopt.hlo.ir import Instruction

__all__ = ["register_cost_model", "unregister_cost_model", "registered_cost_models", "user_cost_model",
           "MeasuredProfileModel"]

_REGISTRY: dict[str, Callable[[], Any]] = {}


def register_cost_model(name: str, factory: Callable[[], Any]) -> None:
    """Make `get_cost_model(name)` call `factory()` (a fresh model per analysis or pass run)."""
    if not name or not callable(factory):
        raise ValueError("register_cost_model needs a name and a callable factory")
    _REGISTRY[name.lower()] = factory


def unregister_cost_model(name: str) -> None:
    """Forget a registered model (no error when it is absent)."""
    _REGISTRY.pop(name.lower(), None)


def registered_cost_models() -> list[str]:
    """Names of the user models registered so far."""
    return sorted(_REGISTRY)


def user_cost_model(name: str) -> Any | None:
    """A fresh instance of the user model registered as `name`, or None; checks it speaks `CostModel`."""
    factory = _REGISTRY.get(name.lower())
    if factory is None:
        return None
    model = factory()
    for method in ("node_time_us", "async_latency_us"):
        if not callable(getattr(model, method, None)):
            raise TypeError(f"cost model {name!r} has no {method}() (see cost_model.CostModel)")
    return model


class MeasuredProfileModel:
    """Times measured on a device (a profile: instruction name -> microseconds), the analytical model of
    `base` for everything the profile does not list.

    Async collectives are looked up under the start's name (the start-to-done time), then under the name of
    the synchronous collective it came from (`all-reduce.3` for `all-reduce-start.3`). `hits` counts the
    instructions the profile answered.
    """

    def __init__(self, times_us: Mapping[str, float], base: str = "h100", num_devices: int = 8):
        from hlopt.cost_model.model import AnalyticalGpuModel

        self.times_us = {str(k): float(v) for k, v in times_us.items()}
        bad = [k for k, v in self.times_us.items() if not v >= 0.0]
        if bad:
            raise ValueError(f"measured times must be >= 0 us, got {bad[:3]}")
        self.base = AnalyticalGpuModel(base, num_devices)
        self.device = self.base.device
        self.hits = 0

    @classmethod
    def from_json(cls, path: str | Path, base: str = "h100", num_devices: int = 8) -> MeasuredProfileModel:
        """Read `{"name": us, ...}` or `{"instructions": [{"name": ..., "time_us": ...}, ...]}` (the shape of
        `hlopt cost --json`, so a profile can start from the model's own numbers)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read the profile: {e}") from None
        if isinstance(data, dict) and isinstance(data.get("instructions"), list):
            data = {row["name"]: row["time_us"] for row in data["instructions"]}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected an object of instruction name -> microseconds")
        return cls(data, base, num_devices)

    def _measured(self, inst: Instruction) -> float | None:
        t = self.times_us.get(inst.name)
        if t is None and inst.opcode.endswith("-start"):
            t = self.times_us.get(inst.name.replace("-start", "", 1))
        if t is not None:
            self.hits += 1
        return t

    def node_time_us(self, inst: Instruction) -> float:
        """The measured time, else the analytical one (async starts occupy no compute time; loops, calls
        and conditionals from their bodies' times under this model)."""
        from hlopt.cost_model.model import _CONTROL, _is_async_start, control_flow_time_us

        if _is_async_start(inst):
            return 0.0
        t = self._measured(inst)
        if t is not None:
            return t
        if inst.opcode in _CONTROL:
            return control_flow_time_us(inst, self.computation_time_us)
        return self.base.node_time_us(inst)

    def computation_time_us(self, comp) -> float:
        """Sequential time of a computation under this model."""
        from hlopt.cost_model.model import _is_async_start

        return sum(self.async_latency_us(i) if _is_async_start(i) else self.node_time_us(i)
                   for i in comp.instructions)

    def module_time_us(self, module) -> float:
        """Sequential time of the entry computation under this model."""
        return self.computation_time_us(module.entry)

    def async_latency_us(self, start: Instruction) -> float:
        """The measured start-to-done time, else the analytical one."""
        t = self._measured(start)
        return self.base.async_latency_us(start) if t is None else t

    def __getattr__(self, name: str) -> Any:
        # Everything else (kernel_time_us, instruction_time, ...) from the analytical base model.
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)
