"""On a machine with a GPU: our fused modules compiled by XLA:GPU for real, run, checked and timed.

    python3 benchmarks/gpu_run.py [--programs a,b] [--repeat 50] [--json]
    python3 benchmarks/gpu_run.py --platform cpu     # the same path on XLA:CPU (a smoke test, no GPU)

For each single-device corpus program and the two larger training steps of `fusion_vs_xla.py`:
- XLA: the unoptimized module compiled for the GPU with XLA's own fusion (`runtime.compile(target=...)`
  on a module without fusions);
- ours: the module after `call-inliner,simplify,priority-fusion,multi-output-fusion`, compiled with
  `keep_fusions=True`: XLA's fusion passes and layout assignment off, so that it runs our fusions
  (`runtime.xla_gpu.module_for_xla_gpu`; experimental: this run is what checks it on a GPU).
Both outputs are compared with XLA:CPU's on the same inputs; the table gives the median step time of
each on the device (inputs already there) and their ratio. Without a GPU it says so and exits 0.
On XLA:CPU (`--platform cpu`) the "ours" column fails: XLA:CPU takes only kLoop fusions, and without
its layout assignment it miscomputes some dots; the run only exercises the path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.xla_gpu import corpus_programs  # noqa: E402

OUR_PIPELINE = "call-inliner,simplify,priority-fusion,multi-output-fusion"
#: Programs XLA:GPU cannot compile (LAPACK custom calls have no CUDA handler).
SKIP = {"linalg"}


def measure(name: str, text: str, repeat: int) -> dict:
    """One row: numerics of both against XLA:CPU, step times on the device."""
    from hlopt.passes.pipeline import run_pipeline

    from hlopt import hlo, runtime

    module = hlo.parse(text)
    inputs = runtime.random_inputs(module, seed=0)
    want = runtime.execute(module, inputs)
    fused = hlo.parse(text)
    run_pipeline(fused, OUR_PIPELINE)
    row: dict = {"program": name}
    for side, m in (("xla", module), ("ours", fused)):
        try:
            exe = runtime.compile(m, target="h100", deviceless=False, keep_fusions=side == "ours")
            got = exe.execute(inputs)
            row[f"{side}_ok"] = runtime.compare(want, got, 2e-3, 2e-3).ok
            row[f"{side}_us"] = exe.time_us(inputs, repeat)
        except Exception as e:  # noqa: BLE001 - a row per program, failures included
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
    ap.add_argument("--platform", default="gpu", help="jax platform to run on (default gpu)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from benchmarks.fusion_vs_xla import larger_programs
    from hlopt import runtime

    runtime.GPU_PLATFORM = args.platform
    if args.platform == "gpu" and not runtime.gpu_devices():
        print("gpu_run: no GPU on this machine (jax.devices('gpu') is empty): nothing to run")
        return 0
    names = args.programs.split(",") if args.programs else None
    progs = [(n, t) for n, t in corpus_programs(names) + larger_programs() if n not in SKIP
             and (names is None or n in names)]
    rows = [measure(n, t, args.repeat) for n, t in progs]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| program | XLA fusion, us | ours, us | ratio | numerics (XLA / ours) |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        ok = f"{r.get('xla_ok', '-')} / {r.get('ours_ok', '-')}"
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "-"
        print(f"| {r['program']} | {_cell(r, 'xla')} | {_cell(r, 'ours')} | {ratio} | {ok} |")
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    if ratios:
        print(f"\nmedian ratio {statistics.median(ratios):.2f}, max {max(ratios):.2f} over {len(ratios)} programs")
    return 0 if all(r.get("xla_ok", True) and r.get("ours_ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
