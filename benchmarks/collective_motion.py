"""while-loop-all-reduce-code-motion on real shard_map training loops: collectives per step and modeled time.

For each program (captured from jax on 8 CPU devices): the collectives *executed* per step (each one inside a
loop counted once per iteration), before and after `call-inliner,simplify,while-loop-all-reduce-code-motion` (the default pipeline up to the
pass), the modeled
H100 time of the step (cost_model, loops times their trip counts), and whether the outputs still equal the
untransformed module's on XLA CPU.

    python3 benchmarks/collective_motion.py [--json] [--device h100]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["executed_collectives", "PROGRAMS", "measure", "main"]

_COLLECTIVE_OPS = frozenset({
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "collective-broadcast",
    "all-reduce-start", "all-gather-start", "collective-permute-start", "ragged-all-to-all",
})


def executed_collectives(module) -> int:
    """Collectives one run of `module` executes: each computation control flow runs (cost_model's
    `executed_computations`: while bodies once per iteration) times the collectives in it."""
    from hlopt.cost_model.cli import executed_computations

    return sum(runs * sum(1 for i in comp.instructions if i.opcode in _COLLECTIVE_OPS)
               for comp, runs in executed_computations(module))


def _mesh():
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:8]), ("d",))


def _scan_program(kind: str, d: int = 512, microbatches: int = 8, batch: int = 64) -> tuple[Callable, tuple]:
    """A shard_map loop over microbatches: psum'ed gradients accumulated, per-step losses collected (DUS form),
    or reduce-scattered gradients accumulated."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def grad(w, x):
        return jax.grad(lambda w_: jnp.sum(jnp.tanh(x @ w_)))(w)

    def body(w, xs):
        if kind == "grad_accumulation":
            return lax.scan(lambda acc, x: (acc + lax.psum(grad(w, x), "d"), None), jnp.zeros_like(w), xs)[0]
        if kind == "losses":
            return lax.scan(lambda c, x: (c, lax.psum(jnp.sum(jnp.tanh(x @ w)), "d")), 0.0, xs)[1]
        return lax.scan(lambda acc, x: (acc + lax.psum_scatter(grad(w, x), "d", scatter_dimension=0, tiled=True),
                                        None), jnp.zeros((d // 8, d)), xs)[0]

    out = P("d") if kind == "reduce_scatter" else P()
    f = jax.shard_map(body, mesh=_mesh(), in_specs=(P(), P(None, "d")), out_specs=out, check_vma=False)
    w = jnp.linspace(-1, 1, d * d, dtype=jnp.float32).reshape(d, d) / d
    xs = jnp.linspace(0, 1, microbatches * batch * d, dtype=jnp.float32).reshape(microbatches, batch, d)
    return jax.jit(f), (w, xs)


def _demo_program() -> tuple[Callable, tuple]:
    from hlopt.cli.demo_program import make_train_step

    return make_train_step()


#: name -> (program factory, pass options)
PROGRAMS: dict[str, tuple[Callable[[], tuple[Callable, tuple]], str]] = {
    "grad_accumulation (psum in scan, 8 microbatches, 512x512)": (lambda: _scan_program("grad_accumulation"), ""),
    "per-step losses (DUS form, 8 steps)": (lambda: _scan_program("losses"), ""),
    "reduce-scatter gradients (8 microbatches)": (lambda: _scan_program("reduce_scatter"),
                                                  "{enable_reduce_scatter=true}"),
    "demo transformer step (7 gradients, 4 microbatches)": (_demo_program, ""),
}


def measure(name: str, device: str = "h100", check: bool = True) -> dict:
    """One program: collectives per step and modeled time before/after, and the numerics check."""
    from hlopt.cost_model import module_time_us
    from hlopt.passes.pipeline import run_pipeline

    from hlopt import runtime

    factory, options = PROGRAMS[name]
    fn, args = factory()
    before = runtime.capture(fn, *args)
    after = before.clone()
    start = time.perf_counter()
    run_pipeline(after, "call-inliner,simplify,while-loop-all-reduce-code-motion" + options)
    seconds = time.perf_counter() - start
    row = {
        "program": name,
        "collectives_per_step_before": executed_collectives(before),
        "collectives_per_step_after": executed_collectives(after),
        "modeled_us_before": module_time_us(before, device),
        "modeled_us_after": module_time_us(after, device),
        "pass_seconds": seconds,
    }
    row["modeled_us_saved"] = row["modeled_us_before"] - row["modeled_us_after"]
    if check:
        result = runtime.run_and_compare(before, after, rtol=1e-4, atol=1e-5)
        row["outputs_equal"] = bool(result.ok)
    return row


def main(argv: list[str] | None = None) -> int:
    """Print the table (or `--json`)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON list of rows")
    parser.add_argument("--device", default="h100")
    parser.add_argument("--no-check", action="store_true", help="skip running before/after on XLA CPU")
    opts = parser.parse_args(argv)
    rows = [measure(name, opts.device, not opts.no_check) for name in PROGRAMS]
    if opts.json:
        print(json.dumps(rows, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"while-loop-all-reduce-code-motion ({opts.device}, modeled)")
    for col in ("program", "collectives/step before", "after", "modeled us before", "after", "saved",
                "outputs equal"):
        table.add_column(col, justify="left" if col == "program" else "right")
    for r in rows:
        table.add_row(r["program"], str(r["collectives_per_step_before"]), str(r["collectives_per_step_after"]),
                      f"{r['modeled_us_before']:.1f}", f"{r['modeled_us_after']:.1f}", f"{r['modeled_us_saved']:.1f}",
                      str(r.get("outputs_equal", "-")))
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
