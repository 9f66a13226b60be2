"""while-loop-all-reduce-code-motion on real shard_map training loops: collectives per step and modeled time,
and the all-reduces left inside while loops next to XLA:GPU's own pass (`--vs-xla`).

For each program (captured from jax on 8 CPU devices): the collectives *executed* per step (each one inside a
loop counted once per iteration), before and after `call-inliner,simplify,while-loop-all-reduce-code-motion` (the default pipeline up to the
pass), the modeled
H100 time of the step (cost_model, loops times their trip counts), and whether the outputs still equal the
untransformed module's on XLA CPU.

    python3 benchmarks/collective_motion.py [--json] [--device h100]

`--vs-xla`: for the loop programs below (written as users write them: gradient accumulation with psum, DUS
losses, psum of mesh-invariant values, chained psums, scan over layers, fori_loop, 2-D meshes) and the
shard_map loop programs of corpus/programs.py, the all-reduces left inside while bodies (and what they call)
after hlopt's `default` pipeline, next to XLA:GPU's optimized module (deviceless, 8 devices, through
hlopt's XLA:GPU driver, `hlopt.runtime.xla_gpu`; the counts recorded in XLA_GPU_LEFT_IN_LOOPS unless `--xla-live`), and
whether the outputs still equal the captured module's on 8 CPU devices. XLA:CPU does not run the pass (its
optimized modules keep every all-reduce in the loop), so XLA:GPU is the reference.

    python3 benchmarks/collective_motion.py --vs-xla [--xla-live] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

__all__ = [
    "executed_collectives", "PROGRAMS", "measure", "main", "LOOP_PROGRAMS", "XLA_GPU_LEFT_IN_LOOPS",
    "all_reduces_in_loops", "xla_gpu_all_reduces_in_loops", "compare_with_xla", "loop_program",
]

_COLLECTIVE_OPS = frozenset({
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "collective-broadcast",
    "all-reduce-start", "all-gather-start", "collective-permute-start", "ragged-all-to-all",
})


def executed_collectives(module) -> int:
    """Collectives one run of `module` executes: each computation control flow runs (cost_model's
    `executed_computations`: while bodies once per iteration) times the collectives in it."""
    from hlopt.cli.cost import executed_computations

    return sum(runs * sum(1 for i in comp.instructions if i.opcode in _COLLECTIVE_OPS)
               for comp, runs in executed_computations(module))


def _mesh():
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:8]), ("d",))


def scan_program(kind: str, d: int = 512, microbatches: int = 8, batch: int = 64) -> tuple[Callable, tuple]:
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
        if kind == "losses_twice":
            return lax.scan(lambda c, x: (c, lax.psum(lax.psum(jnp.sum(jnp.tanh(x @ w)), "d"), "d")), 0.0, xs)[1]
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
    "grad_accumulation (psum in scan, 8 microbatches, 512x512)": (lambda: scan_program("grad_accumulation"), ""),
    "per-step losses (DUS form, 8 steps)": (lambda: scan_program("losses"), ""),
    "per-step losses reduced twice (chained psum, DUS form, 8 steps)": (lambda: scan_program("losses_twice"), ""),
    "reduce-scatter gradients (8 microbatches)": (lambda: scan_program("reduce_scatter"),
                                                  "{enable_reduce_scatter=true}"),
    "demo transformer step (7 gradients, 4 microbatches)": (_demo_program, ""),
}


# --------------------------------------------------------------------------- all-reduces left in loops vs XLA:GPU
_W_SHAPE, _XS_SHAPE = (8, 8), (4, 16, 8)


def _inputs():
    import jax.numpy as jnp

    w = jnp.linspace(-1, 1, 64, dtype=jnp.float32).reshape(_W_SHAPE)
    xs = jnp.linspace(0, 1, 4 * 16 * 8, dtype=jnp.float32).reshape(_XS_SHAPE)
    return w, xs


def _loss(w, x):
    import jax.numpy as jnp

    return jnp.sum(jnp.tanh(x @ w))


def _shard_mapped(body: Callable, out=None, check_vma: bool = False, in_specs=None, mesh=None) -> Callable:
    import jax
    from jax.sharding import PartitionSpec as P

    in_specs = in_specs if in_specs is not None else (P(), P(None, "d"))
    f = jax.shard_map(body, mesh=mesh or _mesh(), in_specs=in_specs, out_specs=P() if out is None else out,
                      check_vma=check_vma)
    return jax.jit(f)


def _grad_accumulation():
    import jax
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        return lax.scan(lambda a, x: (a + lax.psum(jax.grad(_loss)(w, x), "d"), None), jnp.zeros_like(w), xs)[0]

    return _shard_mapped(body), _inputs()


def _dus_losses(twice: bool = False):
    from jax import lax

    def body(w, xs):
        def step(c, x):
            total = lax.psum(_loss(w, x), "d")
            return c, lax.psum(total, "d") if twice else total

        return lax.scan(step, 0.0, xs)[1]

    return _shard_mapped(body), _inputs()


def _grad_of_psum_loss():
    """check_vma=False: the gradient of a psum'ed loss is psum'ed once more by the user (two chained all-reduces,
    plus jax's psum of the cotangent seed)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        def step(a, x):
            g = jax.grad(lambda w_: lax.psum(_loss(w_, x), "d"))(w)
            return a + lax.psum(g, "d"), None

        return lax.scan(step, jnp.zeros_like(w), xs)[0]

    return _shard_mapped(body), _inputs()


def _dus_accumulation(twice: bool = False):
    """Rows accumulated with dynamic_slice + add + dynamic_update_slice at the scan index."""
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        def step(acc, ix):
            i, x = ix
            v = lax.psum(jnp.sum(jnp.tanh(x @ w), 0, keepdims=True), "d")
            v = lax.psum(v, "d") if twice else v
            row = lax.dynamic_slice_in_dim(acc, i, 1) + v
            return lax.dynamic_update_slice_in_dim(acc, row, i, 0), None

        return lax.scan(step, jnp.zeros((4, 8)), (jnp.arange(4), xs))[0]

    return _shard_mapped(body), _inputs()


def _invariant_losses():
    """check_vma=True: a psum of a value invariant over the mesh axis (jax's psum_invariant)."""
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        return lax.scan(lambda c, x: (c, lax.psum(jnp.sum(jnp.tanh(w * jnp.sum(x))), "d")), 0.0, xs)[1]

    return _shard_mapped(body, check_vma=True), _inputs()


def _vma_grad_accumulation():
    """check_vma=True: jax inserts the gradient psum itself (the transpose of pvary) and psums the loss."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def body(w, xs):
        def step(a, x):
            loss, g = jax.value_and_grad(lambda w_: lax.psum(_loss(w_, x), "d"))(w)
            return a + g, loss

        return lax.scan(step, jnp.zeros_like(w), xs)

    return _shard_mapped(body, out=(P(), P()), check_vma=True), _inputs()


def _scan_over_layers():
    """check_vma=True: the backward scan over 3 layers psums each layer's gradient and stores it (reversed DUS)."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def body(ws, x):
        def f(ws):
            return lax.psum(jnp.sum(lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]), "d")

        return jax.grad(f)(ws)

    w, xs = _inputs()
    ws = jnp.stack([w * (i + 1) for i in range(3)])
    return _shard_mapped(body, check_vma=True, in_specs=(P(), P("d"))), (ws, xs[0])


def _fori_grad_accumulation():
    import jax
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        return lax.fori_loop(0, 4, lambda i, a: a + lax.psum(jax.grad(_loss)(w, xs[i]), "d"), jnp.zeros_like(w))

    return _shard_mapped(body), _inputs()


def _mesh_2d_accumulation():
    """A 4x2 (dp, tp) mesh: the psum runs over dp only (replica groups of 4)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("dp", "tp"))

    def body(w, xs):
        return lax.scan(lambda a, x: (a + lax.psum(jax.grad(_loss)(w, x), "dp"), None), jnp.zeros_like(w), xs)[0]

    return _shard_mapped(body, mesh=mesh, in_specs=(P(), P(None, "dp"))), _inputs()


def _pmean_losses():
    """pmean: all-reduce then divide (neither XLA nor hlopt moves a divided all-reduce)."""
    from jax import lax

    def body(w, xs):
        return lax.scan(lambda c, x: (c, lax.pmean(_loss(w, x), "d")), 0.0, xs)[1]

    return _shard_mapped(body), _inputs()


def _nested_loops():
    """Epochs x microbatches: the gradient all-reduce leaves the inner loop, stays in the outer one."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        def epoch(w, _):
            g = lax.scan(lambda a, x: (a + lax.psum(jax.grad(_loss)(w, x), "d"), None), jnp.zeros_like(w), xs)[0]
            return w - 0.1 * g, None

        return lax.scan(epoch, w, None, length=2)[0]

    return _shard_mapped(body), _inputs()


def _bf16_gradients():
    """bf16 gradients psum'ed, accumulated in f32 (the moved sum rounds once: bf16 tolerance)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        def step(a, x):
            g = jax.grad(_loss)(w.astype(jnp.bfloat16), x.astype(jnp.bfloat16))
            return a + lax.psum(g, "d").astype(jnp.float32), None

        return lax.scan(step, jnp.zeros_like(w), xs)[0]

    return _shard_mapped(body), _inputs()


def _gradients_and_losses():
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def body(w, xs):
        def step(a, x):
            loss, g = jax.value_and_grad(_loss)(w, x)
            return a + lax.psum(g, "d"), lax.psum(loss, "d")

        return lax.scan(step, jnp.zeros_like(w), xs)

    return _shard_mapped(body, out=(P(), P())), _inputs()


def _pytree_gradients():
    """A psum of a dict of gradients (one all-reduce per leaf), accumulated with tree.map."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def body(p, xs):
        def step(a, x):
            g = lax.psum(jax.grad(lambda p_: jnp.sum(jnp.tanh(x @ p_["a"]) @ p_["b"]))(p), "d")
            return jax.tree.map(jnp.add, a, g), None

        return lax.scan(step, jax.tree.map(jnp.zeros_like, p), xs)[0]

    w, xs = _inputs()
    specs = {"a": P(), "b": P()}
    return _shard_mapped(body, out=specs, in_specs=(specs, P(None, "d"))), ({"a": w, "b": 2 * w}, xs)


def _optimizer_loop():
    """SGD steps in a scan: each step's update needs its own psum (nothing may move)."""
    import jax
    from jax import lax

    def body(w, xs):
        return lax.scan(lambda w, x: (w - 0.01 * lax.psum(jax.grad(_loss)(w, x), "d"), None), w, xs)[0]

    return _shard_mapped(body), _inputs()


def _fori_losses_at_set():
    """`losses.at[i].set(psum(loss))` in a fori_loop: jax emits a scatter, which neither moves."""
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        return lax.fori_loop(0, 4, lambda i, ls: ls.at[i].set(lax.psum(_loss(w, xs[i]), "d")), jnp.zeros(4))

    return _shard_mapped(body), _inputs()


def _jit_data_parallel():
    """jit with a batch-sharded input (GSPMD, no shard_map): XLA's partitioner makes the gradient all-reduce, so
    the captured module has none; XLA:GPU's partitioned module must then not keep one in the loop either."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def f(w, xs):
        return lax.scan(lambda a, x: (a + jax.grad(_loss)(w, x), None), jnp.zeros_like(w), xs)[0]

    mesh = _mesh()
    shardings = (NamedSharding(mesh, P()), NamedSharding(mesh, P(None, "d")))
    return jax.jit(f, in_shardings=shardings, out_shardings=NamedSharding(mesh, P())), _inputs()


def _corpus(name: str):
    def build():
        from hlopt.corpus.programs import program_by_name

        return program_by_name(name).build()

    return build


#: name -> builder of (jitted function, args), all on 8 devices
LOOP_PROGRAMS: dict[str, Callable[[], tuple[Callable, tuple]]] = {
    "grad accumulation (psum in scan)": _grad_accumulation,
    "DUS losses": _dus_losses,
    "DUS losses, psum twice": lambda: _dus_losses(twice=True),
    "grad of psum'ed loss, psum'ed again": _grad_of_psum_loss,
    "DS/DUS row accumulation": _dus_accumulation,
    "DS/DUS row accumulation, psum twice": lambda: _dus_accumulation(twice=True),
    "psum of mesh-invariant values (check_vma)": _invariant_losses,
    "grad accumulation (check_vma)": _vma_grad_accumulation,
    "scan over layers, backward (check_vma)": _scan_over_layers,
    "fori_loop grad accumulation": _fori_grad_accumulation,
    "2-D mesh, psum over dp": _mesh_2d_accumulation,
    "pmean losses": _pmean_losses,
    "nested loops (epochs x microbatches)": _nested_loops,
    "bf16 gradients, f32 accumulator": _bf16_gradients,
    "gradients and losses": _gradients_and_losses,
    "pytree gradients": _pytree_gradients,
    "optimizer loop (SGD in scan)": _optimizer_loop,
    "fori_loop losses.at[i].set": _fori_losses_at_set,
    "jit data-parallel grad accumulation (GSPMD)": _jit_data_parallel,
    "corpus: shmap_psum_in_scan": _corpus("shmap_psum_in_scan"),
    "corpus: shmap_grad_accumulation": _corpus("shmap_grad_accumulation"),
    "demo transformer step": _demo_program,
}

#: All-reduces XLA:GPU leaves inside while bodies (deviceless, 8 devices, jax-cuda12-plugin 0.10.2, H100 spec),
#: measured with `--vs-xla --xla-live` (first through ../shared/tools' reference script, now through hlopt's
#: driver: the same compiler, the same plugin). XLA moves one all-reduce of a
#: chain per run; in the demo step its all-reduce combiner then packs the 7 gradient all-reduces it left in the
#: loop (the inner psum of each chain) into 1 (7 with `--disable-passes all-reduce-combiner`).
XLA_GPU_LEFT_IN_LOOPS: dict[str, int] = {
    "grad accumulation (psum in scan)": 0,
    "DUS losses": 0,
    "DUS losses, psum twice": 1,
    "grad of psum'ed loss, psum'ed again": 1,
    "DS/DUS row accumulation": 0,
    "DS/DUS row accumulation, psum twice": 1,
    "psum of mesh-invariant values (check_vma)": 0,
    "grad accumulation (check_vma)": 0,
    "scan over layers, backward (check_vma)": 0,
    "fori_loop grad accumulation": 0,
    "2-D mesh, psum over dp": 0,
    "pmean losses": 1,
    "nested loops (epochs x microbatches)": 1,
    "bf16 gradients, f32 accumulator": 0,
    "gradients and losses": 0,
    "pytree gradients": 0,
    "optimizer loop (SGD in scan)": 1,
    "fori_loop losses.at[i].set": 1,
    "jit data-parallel grad accumulation (GSPMD)": 0,
    "corpus: shmap_psum_in_scan": 0,
    "corpus: shmap_grad_accumulation": 0,
    "demo transformer step": 1,
}

#: Programs whose moved sums round differently (bf16): tolerances for the numerics check.
_TOLERANCES = {"bf16 gradients, f32 accumulator": (2e-2, 5e-2)}


def loop_program(name: str) -> tuple[Callable, tuple]:
    """(jitted function, example args) of one LOOP_PROGRAMS entry."""
    return LOOP_PROGRAMS[name]()


def _loop_computations(module) -> set:
    """While bodies and everything they call (conditions excluded: XLA keeps no collective there)."""
    work = [i.attrs["body"] for i in module.instructions() if i.opcode == "while"]
    seen: set = set()
    while work:
        comp = work.pop()
        if comp not in seen:
            seen.add(comp)
            work.extend(comp.called_computations())
    return seen


def all_reduces_in_loops(module) -> int:
    """All-reduces (sync or `all-reduce-start`) inside while bodies and the computations they call."""
    return sum(1 for comp in _loop_computations(module) for i in comp.instructions
               if i.opcode in ("all-reduce", "all-reduce-start"))


def xla_gpu_all_reduces_in_loops(hlo_text: str, devices: int = 8, spec: str = "h100_sxm") -> int:
    """All-reduces XLA:GPU's optimized module keeps inside while loops (runs hlopt's XLA:GPU driver)."""
    from hlopt.corpus.xla_reference import xla_gpu_compile

    from hlopt import hlo

    return all_reduces_in_loops(hlo.parse(xla_gpu_compile(hlo_text, spec, devices=devices)["optimized_text"]))


def compare_with_xla(name: str, pipeline: str = "default", live: bool = False, check: bool = True) -> dict:
    """One LOOP_PROGRAMS row: all-reduces in loops before, after hlopt's `pipeline`, and left by XLA:GPU
    (recorded, or measured when `live`), and whether the outputs stay equal on 8 CPU devices."""
    from hlopt.passes.pipeline import run_pipeline

    from hlopt import runtime

    fn, args = loop_program(name)
    before = runtime.capture(fn, *args)
    after = before.clone()
    run_pipeline(after, pipeline)
    xla = xla_gpu_all_reduces_in_loops(str(before)) if live else XLA_GPU_LEFT_IN_LOOPS.get(name)
    row = {"program": name, "in_loops_before": all_reduces_in_loops(before),
           "in_loops_hlopt": all_reduces_in_loops(after), "in_loops_xla_gpu": xla}
    if check:
        rtol, atol = _TOLERANCES.get(name, (1e-4, 1e-5))
        row["outputs_equal"] = bool(runtime.run_and_compare(before, after, rtol=rtol, atol=atol).ok)
    return row


def _print_vs_xla(rows: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    print("| program | all-reduces in loops before | hlopt `default` | XLA:GPU | outputs equal |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        eq = {True: "yes", False: "NO"}.get(r.get("outputs_equal"), "-")
        print(f"| {r['program']} | {r['in_loops_before']} | {r['in_loops_hlopt']} | {r['in_loops_xla_gpu']} | {eq} |")


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
    parser.add_argument("--vs-xla", action="store_true", help="all-reduces left in loops, hlopt vs XLA:GPU")
    parser.add_argument("--xla-live", action="store_true", help="with --vs-xla: run XLA:GPU instead of the "
                        "recorded counts (needs the XLA:GPU compiler: python3 -m hlopt.runtime.xla_gpu install)")
    opts = parser.parse_args(argv)
    if opts.vs_xla:
        _print_vs_xla([compare_with_xla(n, live=opts.xla_live, check=not opts.no_check) for n in LOOP_PROGRAMS],
                      opts.json)
        return 0
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
