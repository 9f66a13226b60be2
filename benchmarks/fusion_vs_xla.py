"""Our priority-fusion against XLA:GPU's own, both rated by XLA's GPU cost model (deviceless H100).

For each program: XLA compiles the unoptimized module with its own fusion; XLA compiles our fused module
with its fusion passes off (`--disable-passes priority-fusion,multi_output_fusion,rename_fusions`), so
the same XLA model ("default" column) rates both. Reports kernels, bytes and modeled time.

    python3 benchmarks/fusion_vs_xla.py [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.xla_gpu import available, corpus_programs, xla_gpu_compile  # noqa: E402

OUR_PIPELINE = "call-inliner,simplify,priority-fusion"
KEEP_OURS = "priority-fusion,multi_output_fusion,rename_fusions"


def _kernels(report: dict) -> int:
    k = report["kernels"]
    return int(k.get("static", 0)) if isinstance(k.get("static"), int | float) else int(k["static"]["total"])


def measure(name: str, text: str) -> dict:
    """One row."""
    import hlo
    from passes.pipeline import run_pipeline

    try:
        xla = xla_gpu_compile(text)
    except RuntimeError as e:
        return {"program": name, "error": "XLA:GPU cannot compile it: " + str(e).splitlines()[-1][-80:],
                "xla_kernels": 0}
    module = hlo.parse(text)
    run_pipeline(module, OUR_PIPELINE)
    try:
        ours = xla_gpu_compile(module.to_text(), disable_passes=KEEP_OURS)
    except RuntimeError as e:
        check = next((line for line in str(e).splitlines() if "Check failed" in line), str(e).splitlines()[-1])
        return {"program": name, "error": check.split("] ")[-1][:100], "xla_kernels": _kernels(xla)}
    col = "default"
    row = {
        "program": name,
        "xla_kernels": _kernels(xla), "our_kernels": _kernels(ours),
        "xla_bytes": xla["cost_analysis"]["bytes_accessed"], "our_bytes": ours["cost_analysis"]["bytes_accessed"],
        "xla_time_us": xla["fusion_exec_time_us_sum_x_trips"][col],
        "our_time_us": ours["fusion_exec_time_us_sum_x_trips"][col],
    }
    row["time_ratio"] = row["our_time_us"] / row["xla_time_us"] if row["xla_time_us"] else float("nan")
    return row


def main() -> int:
    """Print the table (markdown) or JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not available():
        print("XLA GPU tool not set up: run ../shared/tools/setup_xla_gpu.sh /tmp/xla-gpu-venv", file=sys.stderr)
        return 1
    rows = [measure(n, t) for n, t in corpus_programs()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| program | kernels XLA | kernels ours | bytes XLA | bytes ours | modeled us XLA | modeled us ours | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['program']} | {r['xla_kernels']} | XLA aborted on our fusions: {r['error']} | | | | | |")
            continue
        print(f"| {r['program']} | {r['xla_kernels']} | {r['our_kernels']} | {r['xla_bytes']:.0f} | {r['our_bytes']:.0f} "
              f"| {r['xla_time_us']:.2f} | {r['our_time_us']:.2f} | {r['time_ratio']:.2f} |")
    ratios = [r["time_ratio"] for r in rows if "error" not in r and r["time_ratio"] == r["time_ratio"]]
    print(f"\nmedian ratio {statistics.median(ratios):.2f}, max {max(ratios):.2f} over {len(ratios)} programs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
