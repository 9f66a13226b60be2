"""Scheduling time at scale: the latency-hiding scheduler (and its `+fill` post-pass) on big modules.

- synthetic FSDP / mixed modules of many layers (`scheduler.synthetic`, 20k+ instructions, a collective
  per ~10 instructions; `--layers 1500,9000` adds ~90-100k-instruction ones);
- the transformer training steps of corpus/transformer.py (20k and 100k instructions, no collectives).
Reported: instructions, seconds in the pass (list schedule, plus fill where asked), makespan / lower bound.

    python3 benchmarks/schedule_scale.py [--layers 1500[,9000]] [--sizes 20k,100k] [--heuristics xla-default,xla-default+fill]
                                         [--json]
"""

from __future__ import annotations

import argparse
import json


def _row(label: str, module, heuristic: str) -> dict:
    import gc

    from hlopt.cli.schedule import schedule_module

    gc.collect()  # the previous rows' modules are garbage: do not charge their collection to this one
    count = module.instruction_count()
    summary = schedule_module(module, heuristic, "h100", "analytical", 1)
    bound = summary["lower_bound_us"]
    return {"module": label, "instructions": count, "heuristic": heuristic,
            "schedule_seconds": summary["schedule_seconds"],
            "makespan_over_bound": summary["makespan_us"] / bound if bound else 0.0}


def rows(layers: list[int], sizes: list[str], heuristics: list[str]) -> list[dict]:
    """Schedule every module with every heuristic."""
    from hlopt.corpus.transformer import SIZES, module_of_size
    from hlopt.scheduler.synthetic import synthetic_module

    from hlopt import hlo

    out = []
    for n in layers:
        for pattern in ("fsdp", "mixed"):
            for h in heuristics:
                out.append(_row(f"synthetic:{pattern}:{n}", synthetic_module(n, pattern, hidden=256, batch=256), h))
    for size in sizes:
        text, _ = module_of_size(SIZES[size])
        for h in heuristics:
            out.append(_row(f"transformer {size}", hlo.parse(text), h))
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the table (or JSON)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="1500", help="comma-separated layer counts of the synthetic modules")
    p.add_argument("--sizes", default="20k,100k")
    p.add_argument("--heuristics", default="xla-default,xla-default+fill")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = rows([int(n) for n in args.layers.split(",") if n], [s for s in args.sizes.split(",") if s], args.heuristics.split(","))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print("| module | instructions | heuristic | schedule s | makespan / bound |")
    print("|---|---:|---|---:|---:|")
    for r in out:
        print(f"| {r['module']} | {r['instructions']} | {r['heuristic']} | {r['schedule_seconds']:.2f} | "
              f"{r['makespan_over_bound']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
