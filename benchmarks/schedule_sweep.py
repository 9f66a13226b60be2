"""The synthetic sweep of issue 8: makespan / lower bound of each heuristic over patterns x layers x ratios.

`scheduler.synthetic` modules (fsdp, data-parallel, pipeline, mixed) of 4-32 layers with the communication
to compute ratio from 0.25 to 8, scheduled by the pass (defaults: alternatives, fill within XLA's memory
limit) and run through the simulator; per pattern and heuristic: the worst and the median makespan over
the proven lower bound (`scheduler.bounds`), and the peak memory of the worst one against the list schedule's.

    python3 benchmarks/schedule_sweep.py [--heuristics xla-default,start-delay] [--layers 4,8,16,32]
                                         [--ratios 0.25,0.5,1,2,4,8] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics

PATTERNS = ("fsdp", "data-parallel", "pipeline", "mixed")


def sweep(heuristics: list[str], layers: list[int], ratios: list[float]) -> list[dict]:
    """One row per module x heuristic."""
    from hlopt.cli.schedule import schedule_module
    from hlopt.scheduler.synthetic import synthetic_module

    rows = []
    for pattern in PATTERNS:
        for n in layers:
            for ratio in ratios:
                for h in heuristics:
                    s = schedule_module(synthetic_module(n, pattern, comm_ratio=ratio), h, "h100", "analytical", 1)
                    rows.append({"module": f"synthetic:{pattern}:{n}:{ratio:g}", "pattern": pattern, "heuristic": h,
                                 "makespan_over_bound": s["makespan_us"] / s["lower_bound_us"],
                                 "peak_memory_bytes": s["peak_memory_bytes"], "schedule_seconds": s["schedule_seconds"]})
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per pattern and heuristic: module count, worst (and which), median."""
    out = []
    for pattern in PATTERNS:
        for h in dict.fromkeys(r["heuristic"] for r in rows):
            rs = [r for r in rows if r["pattern"] == pattern and r["heuristic"] == h]
            worst = max(rs, key=lambda r: r["makespan_over_bound"])
            out.append({"pattern": pattern, "heuristic": h, "modules": len(rs),
                        "worst": worst["makespan_over_bound"], "worst_module": worst["module"],
                        "median": statistics.median(r["makespan_over_bound"] for r in rs),
                        "max_schedule_seconds": max(r["schedule_seconds"] for r in rs)})
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the summary table (or JSON with every row)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heuristics", default="xla-default,start-delay,xla-default+samepeak,xla-default+alone")
    p.add_argument("--layers", default="4,8,16,32")
    p.add_argument("--ratios", default="0.25,0.5,1,2,4,8")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = sweep(args.heuristics.split(","), [int(x) for x in args.layers.split(",")],
                 [float(x) for x in args.ratios.split(",")])
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary(rows)}, indent=2))
        return 0
    print("| pattern | heuristic | modules | worst / bound | worst module | median / bound | max schedule s |")
    print("|---|---|---:|---:|---|---:|---:|")
    for r in summary(rows):
        print(f"| {r['pattern']} | {r['heuristic']} | {r['modules']} | {r['worst']:.3f} | {r['worst_module']} | "
              f"{r['median']:.3f} | {r['max_schedule_seconds']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
