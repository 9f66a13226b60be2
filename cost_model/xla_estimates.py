"""XLA's own per-instruction estimates, read off a module XLA:GPU compiled (no jaxlib needed to read them).

XLA:GPU writes its estimates into each fusion's and collective's backend_config (`reification_cost`: one
entry per cost model, `exec_time_us`). `XlaEstimateTimes` is the `cost_model.estimator.LatencyEstimator` on
them: a launch costs the launch overhead plus XLA's estimate (`estimate_of`; none for library calls and
bare ops), a collective XLA's `sol` estimate (hlopt's analytical model where XLA gives none). A loop or call
costs what `computation_time_us` says its computations cost; `runtime.xla_gpu_path.xla_gpu.XlaEstimateLatency` gives that
with the scheduler's simulator (it sits above the scheduler; this half sits below it).
"""

from __future__ import annotations

from typing import Any

from hlopt.hlo.ir import Computation, Instruction, Module

__all__ = ["NO_LAUNCH", "launch_kind", "xla_estimates", "estimate_of", "XlaEstimateTimes", "collective_key",
           "xla_collective_latencies", "WithXlaCollectiveLatencies"]

#: Opcodes that launch no kernel of their own.
NO_LAUNCH = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional",
                       "call", "after-all", "add-dependency", "opt-barrier", "domain", "partition-id",
                       "replica-id", "async-update"})


def launch_kind(inst: Instruction) -> str | None:
    """"fusion", "custom-call", "collective", "other" (a kernel of its own) or None (no launch)."""
    from hlopt.hlo.opcodes import COLLECTIVES

    op = inst.opcode
    if op == "async-start":
        wrapped = inst.called_computations
        op = wrapped[0].root.opcode if wrapped else op
    if op in NO_LAUNCH or op.endswith("-done"):
        return None
    if op in COLLECTIVES or op.removesuffix("-start") in COLLECTIVES or op in ("send", "recv"):
        return "collective"
    return op if op in ("fusion", "custom-call") else "other"


def xla_estimates(inst: Instruction) -> dict[str, float]:
    """XLA's per-model estimates (us) in a backend_config's reification_cost; the last per model wins
    (a backend-only compile appends its own); the unnamed model is XLA's default ("default")."""
    out: dict[str, float] = {}
    for entry in inst.backend_config_value("reification_cost") or []:
        if isinstance(entry, dict) and "exec_time_us" in entry:
            out[entry.get("name") or "default"] = float(entry["exec_time_us"])
    return out


def estimate_of(fusion: Instruction) -> float | None:
    """XLA's estimate of one fusion (us): its default model's, except for block-level Triton fusions
    (fusion kind `__triton`: softmax, norms), whose default estimate is unusable (milliseconds to minutes
    for sub-microsecond kernels); the indexing cost model's is used for those. None without estimates."""
    models = xla_estimates(fusion)
    kind = fusion.backend_config_value("fusion_backend_config", "kind")
    if kind == "__triton" and "indexing-cost-model" in models:
        return models["indexing-cost-model"]
    return models.get("default")


class XlaEstimateTimes:
    """A `LatencyEstimator` on XLA's own estimates (module docstring); `computation_time_us` times the
    computations a while, call or conditional runs (0 here: `runtime.xla_gpu_path.xla_gpu.XlaEstimateLatency` simulates
    them)."""

    def __init__(self, target: str, launch_us: float, devices: int) -> None:
        from hlopt.cost_model.model import get_cost_model

        self.launch_us = launch_us
        self._fallback = get_cost_model(target, num_devices=max(devices, 1))

    def computation_time_us(self, comp: Computation) -> float:
        """One execution of a called computation (override to time loop bodies)."""
        return 0.0

    def node_cost(self, inst: Instruction) -> float:
        """Time on the compute stream."""
        from hlopt.cost_model.model import control_flow_time_us

        if inst.opcode in ("while", "call", "conditional"):
            return control_flow_time_us(inst, self.computation_time_us)
        kind = launch_kind(inst)
        if kind is None or inst.opcode.endswith("-start"):
            return 0.0
        if kind == "collective":  # a synchronous collective op
            return self.launch_us + self._collective_us(inst)
        return self.launch_us + ((estimate_of(inst) or 0.0) if kind == "fusion" else 0.0)

    def latency(self, start: Instruction, done: Instruction) -> float:
        """An async collective's time."""
        return self.launch_us + self._collective_us(start)

    def _collective_us(self, inst: Instruction) -> float:
        sol = xla_estimates(inst).get("sol")
        return sol if sol is not None else float(self._fallback.async_latency_us(inst))


#: The attributes of a collective XLA's estimate of it reads (with its kind and shapes): who takes part, along
#: which dimensions, across replicas or partitions.
_COLLECTIVE_KEY_ATTRS = ("replica_groups", "source_target_pairs", "dimensions", "scatter_dimension",
                         "use_global_device_ids", "constrain_layout")


def collective_key(start: Instruction) -> tuple | None:
    """What XLA's estimate of an async collective reads, in a form two compiles of one program share: the
    collective's kind, its operands' and result's shapes, who takes part (`_COLLECTIVE_KEY_ATTRS`) and whether it
    has a channel (across partitions); not its name or channel number. None for anything but the start of an
    async collective (`all-gather-start`, an `async-start` wrapping one, ...)."""
    from hlopt.cost_model.model import collective_kind

    if not (start.opcode.endswith("-start") or start.opcode == "async-start"):
        return None
    found = collective_kind(start)
    if found is None:
        return None
    op, kind = found
    attrs = op.attrs
    return (kind, str(op.shape), tuple(str(o.shape) for o in op.operands), "channel_id" in attrs,
            tuple((name, str(attrs[name])) for name in _COLLECTIVE_KEY_ATTRS if name in attrs))


def xla_collective_latencies(module: Module) -> dict[tuple, float]:
    """`collective_key` -> XLA's `sol` estimate (us) of the async collectives of a module XLA:GPU compiled (its
    final module, where its latency-hiding scheduler wrote them); a key XLA estimated two ways is left out."""
    found: dict[tuple, float] = {}
    ambiguous: set[tuple] = set()
    for comp in module.computations:
        for inst in comp.instructions:
            key = collective_key(inst)
            if key is None:
                continue
            sol = xla_estimates(inst).get("sol")
            if sol is None:
                continue
            if found.setdefault(key, sol) != sol:
                ambiguous.add(key)
    for key in ambiguous:
        del found[key]
    return found


class WithXlaCollectiveLatencies:
    """A `CostModel` whose async collectives take XLA's own estimate where XLA gave one for a collective of the
    same `collective_key` (`latencies`, from `xla_collective_latencies`; plus a launch, as `XlaEstimateTimes`
    times them), and `base` for everything else: kernels, synchronous collectives, the collectives XLA did not
    estimate. XLA:GPU's scheduler times collectives with that estimator (`sol`), so a schedule made on these
    overlaps the collectives XLA's estimates call long. `hits` counts the collectives it answered."""

    def __init__(self, base: Any, latencies: dict[tuple, float], launch_us: float | None = None) -> None:
        self.base = base
        self.latencies = dict(latencies)
        spec = getattr(base, "device", None)
        self.launch_us = float(launch_us if launch_us is not None else getattr(spec, "kernel_launch_us", 1.0))
        self.hits = 0

    def node_time_us(self, inst: Instruction) -> float:
        """`base`'s."""
        return self.base.node_time_us(inst)

    def async_latency_us(self, start: Instruction) -> float:
        """XLA's estimate of the collective plus a launch, where it has one; else `base`'s."""
        key = collective_key(start)
        sol = self.latencies.get(key) if key is not None else None
        if sol is None:
            return self.base.async_latency_us(start)
        self.hits += 1
        return self.launch_us + sol

    def __getattr__(self, name: str) -> Any:
        """Everything else (`device`, `instruction_time`, ...) is `base`'s."""
        if name == "base":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)
