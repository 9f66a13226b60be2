"""runtime: capture HLO from JAX, compile and run HLO on XLA, and hlopt inside JAX and XLA:GPU.

- `runtime.execution`: XLA:CPU (`compile`, `execute`, `run_and_compare`; how a module runs: `execution_mode`);
- `runtime.jax_integration`: `capture`, `jit`, `hook` (a pipeline before every `jax.jit` compile);
- `runtime.xla_gpu_path`: XLA's GPU compiler, deviceless (`hlopt compile`), and `load` of what it wrote;
- `runtime.tuning`: `hlopt tune`.
`runtime._xla` is the one module that touches jaxlib internals.
"""

from __future__ import annotations

from hlopt.runtime._xla import XlaError, gpu_devices, mlir_to_hlo_text, xla_canonical_text
from hlopt.runtime.execution.compare import Comparison, compare
from hlopt.runtime.execution.executable import (
    GPU_PLATFORM,
    Executable,
    compile,
    execute,
    execution_mode,
    run_and_compare,
)
from hlopt.runtime.execution.inputs import random_array, random_inputs
from hlopt.runtime.jax_integration.capture import capture, capture_optimized_text, capture_text
from hlopt.runtime.jax_integration.hook import Hook, hook, install, uninstall
from hlopt.runtime.jax_integration.jit import jit
from hlopt.runtime.xla_gpu_path.saved import load  # what `hlopt compile` wrote, loaded on a GPU host

__all__ = [
    "capture", "capture_text", "capture_optimized_text", "compile", "execute", "Executable", "XlaError",
    "mlir_to_hlo_text",
    "random_inputs", "random_array", "compare", "Comparison", "xla_canonical_text", "run_and_compare",
    "execution_mode", "jit", "hook", "Hook", "install", "uninstall", "gpu_devices", "GPU_PLATFORM",
    "load",
]
