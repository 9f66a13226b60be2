"""Compile-time overhead of hlopt's pre-compile hook vs `jax.jit` alone, and steady-state step time.

    python3 benchmarks/hook_overhead.py [--repeat 3] [--steps 50] [--programs flax,mlp,demo] [--json]

For each program: first-call time (trace + lower + compile; `jax.clear_caches()` before every run) of
plain `jax.jit` and of `runtime.jit(pipeline=P)` for P in "simplify" and "default", the part of it spent in
the hook's pipeline (parse, passes, cost estimates, print), and the median step time after compiling (XLA:CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

ROOT = Path(__file__).resolve().parents[1]

PIPELINES = ["simplify", "default"]
# On XLA:CPU the hook skips the passes whose output XLA:CPU discards (runtime.hook.CPU_DISCARDED_PASSES);
# --keep-discarded runs them, to compare.


def _load_example(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def programs() -> dict[str, Callable[[], tuple[Callable, tuple]]]:
    """name -> () -> (un-jitted step function, example arguments)."""

    def flax() -> tuple[Callable, tuple]:
        ex = _load_example("flax_training_hook")
        graphdef, params, opt_state, tx = ex.make_state()
        x, y = ex.batches(1)[0]
        return ex.make_step(graphdef, tx).__wrapped__, (params, opt_state, x, y)

    def mlp() -> tuple[Callable, tuple]:
        import jax
        import jax.numpy as jnp

        ex = _load_example("jit_hook_training")
        key = jax.random.PRNGKey(0)
        params = {"w1": jax.random.normal(key, (16, 32)) * 0.1, "b1": jnp.zeros(32),
                  "w2": jax.random.normal(jax.random.fold_in(key, 1), (32, 4)) * 0.1}
        return ex.train_step.__wrapped__, (params, jax.random.normal(key, (64, 16)), jnp.ones((64, 4)))

    def demo() -> tuple[Callable, tuple]:
        from hlopt.cli.demo_program import make_train_step

        step, args = make_train_step()
        return step.__wrapped__, args

    def cnn() -> tuple[Callable, tuple]:
        import jax
        import optax
        from flax import nnx

        class CNN(nnx.Module):
            def __init__(self, rngs: nnx.Rngs):
                self.conv1 = nnx.Conv(1, 16, kernel_size=(3, 3), rngs=rngs)
                self.conv2 = nnx.Conv(16, 32, kernel_size=(3, 3), rngs=rngs)
                self.dense = nnx.Linear(7 * 7 * 32, 10, rngs=rngs)

            def __call__(self, x):
                x = nnx.avg_pool(nnx.relu(self.conv1(x)), (2, 2), strides=(2, 2))
                x = nnx.avg_pool(nnx.relu(self.conv2(x)), (2, 2), strides=(2, 2))
                return self.dense(x.reshape(x.shape[0], -1))

        graphdef, params = nnx.split(CNN(nnx.Rngs(0)))
        tx = optax.adam(1e-3)

        def step(params, opt_state, x, y):
            def loss(p):
                logits = nnx.merge(graphdef, p)(x)
                return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

            value, grads = jax.value_and_grad(loss)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, value

        key = jax.random.key(0)
        x = jax.random.normal(key, (32, 28, 28, 1))
        y = jax.random.randint(jax.random.fold_in(key, 1), (32,), 0, 10)
        return step, (params, tx.init(params), x, y)

    return {"flax": flax, "cnn": cnn, "mlp": mlp, "demo": demo}


def _block(out) -> None:
    import jax

    jax.block_until_ready(out)


def _first_call(make: Callable[[], Callable], args: tuple) -> tuple[float, Callable, float]:
    """(seconds of the first call, the jitted function, seconds inside the hook's pipeline)."""
    import jax

    jax.clear_caches()
    f = make()
    start = time.perf_counter()
    _block(f(*args))
    seconds = time.perf_counter() - start
    hook_s = sum(r.seconds for r in getattr(f, "records", []))
    return seconds, f, hook_s


def _step_time(f: Callable, args: tuple, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        _block(f(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


KEEP_DISCARDED = False  # --keep-discarded


def _hooked(f):
    f.hook.skip_discarded_on_cpu = not KEEP_DISCARDED
    return f


def measure(name: str, build: Callable[[], tuple[Callable, tuple]], repeat: int, steps: int) -> dict:
    """One row: compile and step seconds of plain jax.jit and of runtime.jit per pipeline."""
    import jax

    from hlopt import runtime

    fn, args = build()
    makers: dict[str, Callable[[], Callable]] = {"jax.jit": lambda: jax.jit(fn)}
    for p in PIPELINES:
        makers[p] = lambda p=p: _hooked(runtime.jit(fn, pipeline=p))
    row: dict = {"program": name}
    for label, make in makers.items():
        runs = [_first_call(make, args) for _ in range(repeat)]
        best = min(runs, key=lambda r: r[0])
        row[label] = {"compile_s": best[0], "hook_s": best[2], "step_s": _step_time(best[1], args, steps)}
        if label != "jax.jit":
            row[label]["instructions"] = [(r.module, r.instructions_before, r.instructions_after)
                                          for r in best[1].records]
    for p in PIPELINES:
        row[p]["compile_ratio"] = row[p]["compile_s"] / row["jax.jit"]["compile_s"]
        row[p]["step_ratio"] = row[p]["step_s"] / row["jax.jit"]["step_s"]
        row[p]["hook_share"] = row[p]["hook_s"] / row["jax.jit"]["compile_s"]  # the noise-free part
    return row


def main() -> None:
    """Measure and print a table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", default="flax,cnn,mlp,demo")
    ap.add_argument("--keep-discarded", action="store_true",
                    help="run the passes XLA:CPU discards (fusion, scheduling) too, as before they were skipped")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    available = programs()
    global KEEP_DISCARDED
    KEEP_DISCARDED = a.keep_discarded
    rows = [measure(n, available[n], a.repeat, a.steps) for n in a.programs.split(",")]
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    from hlopt.cli.console import table_console
    from rich.table import Table

    table = Table(title="hlopt hook vs jax.jit (XLA:CPU; compile = first call, best of --repeat; "
                        "in parentheses: ms in the hook's pipeline)")
    for col in ["program", "jax.jit compile", *[f"{p} compile (hook)" for p in PIPELINES], "jax.jit step",
                *[f"{p} step" for p in PIPELINES]]:
        table.add_column(col, justify="left" if col == "program" else "right")
    for r in rows:
        base = r["jax.jit"]
        table.add_row(
            r["program"], f"{base['compile_s'] * 1e3:.0f} ms",
            *[f"{r[p]['compile_s'] * 1e3:.0f} ms ({r[p]['hook_s'] * 1e3:.0f}) {r[p]['compile_ratio']:.2f}x"
              for p in PIPELINES],
            f"{base['step_s'] * 1e6:.0f} us",
            *[f"{r[p]['step_s'] * 1e6:.0f} us {r[p]['step_ratio']:.2f}x" for p in PIPELINES])
    table_console().print(table)


if __name__ == "__main__":
    main()
