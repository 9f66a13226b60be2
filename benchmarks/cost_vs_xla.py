"""Our cost model against XLA:GPU's own estimates, fusion by fusion (deviceless H100).

XLA compiles each corpus program for an H100 (../shared/tools/xla_gpu_compile.py); for every fusion of
its optimized module we evaluate the same fusion with `cost_model` and compare with XLA's "default"
estimate (both without kernel launch overhead): the distribution of ours / XLA's (median, p10, p90) and
the module totals.

    python3 benchmarks/cost_vs_xla.py [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.xla_gpu import available, corpus_programs, xla_gpu_compile  # noqa: E402


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def measure(name: str, text: str, column: str = "default") -> dict | None:
    """Per-fusion ratios and totals for one program (None if XLA cannot compile it)."""
    import hlo
    from cost_model import AnalyticalGpuModel

    try:
        report = xla_gpu_compile(text)
    except RuntimeError:
        return None
    module = hlo.parse(report["optimized_text"])
    model = AnalyticalGpuModel("h100", num_devices=1)
    by_name = {i.name: i for i in module.instructions()}
    ratios, ours_total, xla_total = [], 0.0, 0.0
    for f in report["fusions"]:
        xla_us = f["exec_time_us"].get(column)
        inst = by_name.get(f["name"])
        if inst is None or not xla_us:
            continue
        # XLA's per-fusion exec_time has no launch overhead (that enters only its fusion decisions)
        ours_us = max(model.instruction_time(inst).time_us - model.device.kernel_launch_us, 1e-6)
        ratios.append(ours_us / xla_us)
        ours_total += ours_us * f.get("times", 1)
        xla_total += xla_us * f.get("times", 1)
    return {"program": name, "fusions": len(ratios), "ratios": ratios, "ours_total_us": ours_total,
            "xla_total_us": xla_total}


def main() -> int:
    """Print a markdown table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not available():
        print("XLA GPU tool not set up: run ../shared/tools/setup_xla_gpu.sh /tmp/xla-gpu-venv", file=sys.stderr)
        return 1
    rows = [r for r in (measure(n, t) for n, t in corpus_programs()) if r is not None]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| program | fusions | median ours/XLA | p10 | p90 | total ours us | total XLA us |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    every = []
    for r in rows:
        if not r["ratios"]:
            continue
        every += r["ratios"]
        print(f"| {r['program']} | {r['fusions']} | {statistics.median(r['ratios']):.2f} | "
              f"{_quantile(r['ratios'], 0.1):.2f} | {_quantile(r['ratios'], 0.9):.2f} | {r['ours_total_us']:.2f} | "
              f"{r['xla_total_us']:.2f} |")
    print(f"| all | {len(every)} | {statistics.median(every):.2f} | {_quantile(every, 0.1):.2f} | "
          f"{_quantile(every, 0.9):.2f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
