"""while-loop-all-reduce-code-motion on real shard_map training loops: collectives per step and modeled time,
and the all-reduces left inside while loops next to XLA:GPU's own pass (`--vs-xla`).

For each program (captured from jax on 8 CPU devices): the collectives *executed* per step (each one inside a
loop counted once per iteration), before and after `call-inliner,simplify,while-loop-all-reduce-code-motion` (the default pipeline up to the
pass), the modeled
H100 time of the step (cost_model, loops times their trip counts), and whether the outputs still equal the
untransformed module's on XLA CPU.

    python3 benchmarks/collective_motion.py [--json] [--device h100]

`--vs-xla`: for the loop programs of hlopt.corpus.loop_programs (written as users write them: gradient accumulation with psum, DUS
losses, psum of mesh-invariant values, chained psums, scan over layers, fori_loop, 2-D meshes) and the
shard_map loop programs of corpus/programs.py, the all-reduces left inside while bodies (and what they call)
after hlopt's `default` pipeline, next to XLA:GPU's optimized module (deviceless, 8 devices, through
hlopt's XLA:GPU driver, `hlopt.runtime.xla_gpu_path.xla_gpu`; the counts recorded in XLA_GPU_LEFT_IN_LOOPS unless `--xla-live`), and
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

from hlopt.corpus.loop_programs import LOOP_PROGRAMS, demo_program, loop_program, scan_program  # noqa: E402

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


#: name -> (program factory, pass options)
PROGRAMS: dict[str, tuple[Callable[[], tuple[Callable, tuple]], str]] = {
    "grad_accumulation (psum in scan, 8 microbatches, 512x512)": (lambda: scan_program("grad_accumulation"), ""),
    "per-step losses (DUS form, 8 steps)": (lambda: scan_program("losses"), ""),
    "per-step losses reduced twice (chained psum, DUS form, 8 steps)": (lambda: scan_program("losses_twice"), ""),
    "reduce-scatter gradients (8 microbatches)": (lambda: scan_program("reduce_scatter"),
                                                  "{enable_reduce_scatter=true}"),
    "demo transformer step (7 gradients, 4 microbatches)": (demo_program, ""),
}


# --------------------------------------------------------------------------- all-reduces left in loops vs XLA:GPU

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
    from hlopt.passes.framework.pipeline import run_pipeline

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
    from hlopt.passes.framework.pipeline import run_pipeline

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
                        "recorded counts (needs the XLA:GPU compiler: python3 -m hlopt.runtime.xla_gpu_path.xla_gpu install)")
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
