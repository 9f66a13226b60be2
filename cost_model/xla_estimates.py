"""XLA's own per-instruction estimates, read off a module XLA:GPU compiled (no jaxlib needed to read them).

XLA:GPU writes its estimates into each fusion's and collective's backend_config (`reification_cost`: one
entry per cost model, `exec_time_us`). `XlaEstimateTimes` is the `cost_model.estimator.LatencyEstimator` on
them: a launch costs the launch overhead plus XLA's estimate (`estimate_of`; none for library calls and
bare ops), a collective XLA's `sol` estimate (hlopt's analytical model where XLA gives none). A loop or call
costs what `computation_time_us` says its computations cost; `runtime.xla_gpu_path.xla_gpu.XlaEstimateLatency` gives that
with the scheduler's simulator (it sits above the scheduler; this half sits below it).
"""

from __future__ import annotations

from hlopt.hlo.ir import Computation, Instruction

__all__ = ["NO_LAUNCH", "launch_kind", "xla_estimates", "estimate_of", "XlaEstimateTimes"]

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
