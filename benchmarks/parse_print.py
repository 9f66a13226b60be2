"""Parse and print time per instruction, against XLA's C++ parser and printer on the same text.

    python3 benchmarks/parse_print.py [--sizes 1k,5k,20k,100k] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

from hlopt.corpus.transformer import SIZES, module_of_size


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(size: str, repeat: int) -> dict:
    """One row: our parse/print and XLA's, per instruction."""
    from hlopt.runtime._xla import xla_parse

    from hlopt import hlo

    text, layers = module_of_size(SIZES[size])
    module = hlo.parse(text)
    n = module.instruction_count()
    xla_module = xla_parse(text)
    ours_parse = _best(lambda: hlo.parse(text), repeat)
    ours_print = _best(module.to_text, repeat)
    xla_parse_s = _best(lambda: xla_parse(text), repeat)
    xla_print_s = _best(xla_module.to_string, repeat)
    return {
        "size": size, "layers": layers, "instructions": n,
        "parse_us_per_instr": ours_parse / n * 1e6, "print_us_per_instr": ours_print / n * 1e6,
        "xla_parse_us_per_instr": xla_parse_s / n * 1e6, "xla_print_us_per_instr": xla_print_s / n * 1e6,
        "parse_ratio": ours_parse / xla_parse_s, "print_ratio": ours_print / xla_print_s,
    }


def main() -> int:
    """Run and print the table (markdown) or JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1k,5k,20k,100k")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(s, args.repeat) for s in args.sizes.split(",")]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| module | instructions | parse us/instr | XLA parse us/instr | parse ratio | print us/instr | "
          "XLA print us/instr | print ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['size']} ({r['layers']} layers) | {r['instructions']} | {r['parse_us_per_instr']:.2f} | "
              f"{r['xla_parse_us_per_instr']:.2f} | {r['parse_ratio']:.2f}x | {r['print_us_per_instr']:.2f} | "
              f"{r['xla_print_us_per_instr']:.2f} | {r['print_ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
