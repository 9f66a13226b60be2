"""Numerics of the conformance cases: every run that changed a case's module, executed before and after on
XLA:CPU with the same inputs (tests/test_<pass>_xla_conformance_numerics.py use it; it imports hlopt.runtime)."""

from __future__ import annotations

import numpy as np

from .common import Case, run_case, runnable

#: trip counts and other scalar integer parameters: small, the same on every device (XLA's tests pass none)
SCALAR_INT = 3


def _inputs(module, seed: int = 0) -> list[np.ndarray]:  # noqa: ANN001 - a Module
    from hlopt import runtime

    mode, replicas, partitions = runtime.execution_mode(module)
    per_device = replicas * partitions if mode == "per-device" else None
    rng = np.random.default_rng(seed)
    out = []
    for p in module.entry.parameters:
        shape = p.shape
        if shape.is_tuple:
            raise ValueError("a tuple parameter")
        if shape.rank == 0 and shape.dtype.startswith(("s", "u")) and shape.dtype != "u1":
            value = np.array(SCALAR_INT, dtype=runtime.random_array(shape, rng).dtype)
            out.append(np.stack([value] * per_device) if per_device else value)
        elif per_device:
            out.append(np.stack([runtime.random_array(shape, rng) for _ in range(per_device)]))
        else:
            out.append(runtime.random_array(shape, rng))
    return out


def _with_devices(module, replicas: int) -> None:  # noqa: ANN001 - a Module
    """XLA's tests leave the device count at 1 where their collectives name 4 devices: run them on `replicas`."""
    collective = any(i.opcode in ("all-reduce", "reduce-scatter", "all-gather") for i in module.instructions())
    if collective and int(module.config.get("replica_count", 1)) * int(module.config.get("num_partitions", 1)) == 1:
        module.config["replica_count"] = replicas


def check(case: Case, rtol: float = 1e-4, atol: float = 1e-4, replicas: int = 4) -> str:
    """'' when every changing run keeps the outputs (or a reason the case cannot run on XLA:CPU); raises
    AssertionError on a difference. A module whose collectives run without a device count runs on `replicas`."""
    from hlopt import runtime

    if case.not_runnable:
        return f"not runnable: {case.not_runnable}"
    outcome = run_case(case, keep_modules=True)
    if not outcome.modules:
        return "no run changed the module"
    for before, after in outcome.modules:
        for m in (before, after):
            _with_devices(m, replicas)
        reason = runnable(before) or runnable(after)
        if reason:
            return f"not runnable: {reason}"
        try:
            inputs = _inputs(before)
        except ValueError as e:
            return f"not runnable: {e}"
        result = runtime.run_and_compare(before, after, rtol=rtol, atol=atol, inputs=inputs)
        assert result.ok, f"{case.name}: {result}"
    return ""
