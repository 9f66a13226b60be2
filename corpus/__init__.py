"""hlopt.corpus: the JAX programs the tests and the benchmarks run, in one importable place.

Every module builds its HLO at run time from programs of our own (nothing committed); jax is imported only
when a program is built. The multi-device programs need 8 CPU devices: call `use_cpu_devices()` before jax is
imported (tests/conftest.py does the same for the tests).

- `programs`: the test corpus (`PROGRAMS`, `corpus_texts()`: unoptimized and XLA:CPU-optimized HLO of each
  program, `built(name)`, `program_text(name)`), with the sharded and LAPACK programs of `programs_extra`.
- `pipeline_programs`: scanned 8-device training steps (FSDP, data parallel, remat, gradient accumulation) the
  collective pipeliner works on.
- `fusion_programs`, `unseen_programs`: programs of the fusion and re-emission comparisons with XLA:GPU.
- `loop_programs`: shard_map training loops for while-loop-all-reduce-code-motion (`LOOP_PROGRAMS`,
  `scan_program`).
- `training_steps`: the larger training steps of those comparisons (1 and 8 devices).
- `transformer`: N-layer transformer training steps sized to an instruction count (`module_of_size`).
- `user_programs`: programs of the shapes users write, for the JAX hook on XLA:GPU.
- `xla_reference`: XLA:GPU's own compile of a module (deviceless) as a report, the reference compared with.

Layer: above `cli` (it builds on `runtime` and the demo's program); nothing in hlopt's other subpackages
imports it.
"""

from __future__ import annotations

import os

__all__ = ["use_cpu_devices", "DEVICES"]

#: the CPU devices the multi-device programs use
DEVICES = 8


def use_cpu_devices(count: int = DEVICES) -> None:
    """Ask jax for `count` CPU devices and the CPU platform (unless the environment already says otherwise);
    effective only before jax is imported."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={count}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
