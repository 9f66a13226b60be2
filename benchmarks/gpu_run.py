"""On a machine with a GPU: hlopt's re-emitted executable against XLA:GPU's own compile, run, checked, timed.

    python3 benchmarks/gpu_run.py [--programs a,b] [--repeat 50] [--json]

For each single-device corpus program and the two larger training steps of `fusion_vs_xla.py`:
- XLA: the module as jax lowers it, compiled for the local GPU by XLA:GPU with its own fusion and
  schedule (`runtime.compile(target=..., deviceless=False)`: what `jax.jit` runs);
- ours: the XLA:GPU path of `hlopt compile` (`runtime.xla_gpu_path.reemit.compile_for_gpu`, deviceless, for the local
  GPU's target), its serialized executable loaded on the GPU (`runtime.xla_gpu_path.xla_gpu.load_executable`).
Both outputs are compared with XLA:CPU's on the same inputs; the table gives the median step time of each
on the device (inputs already there) and their ratio. Without a GPU (or without the XLA:GPU compiler) it
says so and exits 0. No GPU was available when this was written: it has not run on one yet.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from hlopt.corpus.xla_reference import corpus_programs

#: Programs XLA:GPU cannot compile (LAPACK custom calls have no CUDA handler).
SKIP = {"linalg"}


def measure(name: str, text: str, target: str, repeat: int) -> dict:
    """One row: numerics of both against XLA:CPU, step times on the device."""
    from hlopt.runtime.xla_gpu_path.reemit import compile_for_gpu
    from hlopt.runtime.xla_gpu_path.xla_gpu import load_executable

    from hlopt import hlo, runtime

    module = hlo.parse(text)
    inputs = runtime.random_inputs(module, seed=0)
    want = runtime.execute(module, inputs)
    row: dict = {"program": name}
    for side in ("xla", "ours"):
        try:
            if side == "xla":
                exe = runtime.compile(module, target=target, deviceless=False)
            else:
                result = compile_for_gpu(module, target)
                exe = load_executable(result.executable, result.hlopt_module)
                row["modeled_ratio"] = result.ratio
            row[f"{side}_ok"] = runtime.compare(want, exe.execute(inputs), 2e-3, 2e-3).ok
            row[f"{side}_us"] = exe.time_us(inputs, repeat)
        except Exception as e:
            row[f"{side}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    if "xla_us" in row and "ours_us" in row:
        row["ratio"] = row["ours_us"] / row["xla_us"]
    return row


def _cell(row: dict, side: str) -> str:
    return f"{row[side + '_us']:.1f}" if side + "_us" in row else row.get(side + "_error", "-")


def main() -> int:
    """Print the table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", help="comma-separated program names (default: all)")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from hlopt.corpus.training_steps import larger_programs
    from hlopt.runtime import gpu_devices
    from hlopt.runtime.xla_gpu_path import xla_gpu

    if not gpu_devices():
        print("gpu_run: no GPU on this machine (jax.devices('gpu') is empty): nothing to run")
        return 0
    target = xla_gpu.local_target()
    if target is None or not xla_gpu.available():
        print(f"gpu_run: needs a GPU hlopt has a target for ({', '.join(xla_gpu.TARGETS)}) and the XLA:GPU "
              f"compiler ({xla_gpu.INSTALL_COMMAND})")
        return 0
    names = args.programs.split(",") if args.programs else None
    progs = [(n, t) for n, t in corpus_programs(names) + larger_programs() if n not in SKIP
             and (names is None or n in names)]
    rows = [measure(n, t, target, args.repeat) for n, t in progs]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"| program | XLA:GPU, us | hlopt + XLA:GPU, us | ratio | modeled ratio | numerics (XLA / ours) |  [{target}]")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        ok = f"{r.get('xla_ok', '-')} / {r.get('ours_ok', '-')}"
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "-"
        modeled = f"{r['modeled_ratio']:.2f}" if r.get("modeled_ratio") else "-"
        print(f"| {r['program']} | {_cell(r, 'xla')} | {_cell(r, 'ours')} | {ratio} | {modeled} | {ok} |")
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    if ratios:
        print(f"\nmedian ratio {statistics.median(ratios):.2f}, max {max(ratios):.2f} over {len(ratios)} programs")
    return 0 if all(r.get("xla_ok", True) and r.get("ours_ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
