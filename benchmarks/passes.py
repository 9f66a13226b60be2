"""Time of each pass, and of the pipeline `call-inliner,dce,cse,algebraic-simplifier`, per module size;
the fusion passes on the module after `call-inliner,simplify` (untimed), as a pipeline would run them.

    python3 benchmarks/passes.py [--sizes 1k,5k,20k,100k] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import SIZES, module_of_size  # noqa: E402

PASSES = ["call-inliner", "dce", "cse", "tuple-simplifier", "algebraic-simplifier"]
PIPELINE = "call-inliner,dce,cse,algebraic-simplifier"
FUSION_PASSES = ["priority-fusion", "multi-output-fusion"]  # after call-inliner,simplify (+ priority-fusion)


def measure(size: str) -> dict:
    """One row: seconds per pass (each on a fresh parse) and for the whole pipeline."""
    from hlopt.passes.pipeline import Pipeline

    from hlopt import hlo

    text, _ = module_of_size(SIZES[size])
    row: dict = {"size": size, "instructions": hlo.parse(text).instruction_count()}
    for name in PASSES + [PIPELINE]:
        module = hlo.parse(text)
        pipeline = Pipeline.parse(name, verify_each=False, check_changed=False)
        start = time.perf_counter()
        pipeline.run(module)
        row[name] = time.perf_counter() - start
    module = hlo.parse(text)
    Pipeline.parse("call-inliner,simplify", verify_each=False, check_changed=False).run(module)
    row["instructions_to_fuse"] = module.instruction_count()
    for name in FUSION_PASSES:  # multi-output-fusion runs on priority-fusion's result
        pipeline = Pipeline.parse(name, verify_each=False, check_changed=False)
        start = time.perf_counter()
        pipeline.run(module)
        row[name] = time.perf_counter() - start
    row["us_per_instr_pipeline"] = row[PIPELINE] / row["instructions"] * 1e6
    return row


def main() -> int:
    """Run and print a markdown table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1k,5k,20k,100k")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(s) for s in args.sizes.split(",")]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    cols = PASSES + [PIPELINE] + FUSION_PASSES
    print("| module | instructions (to fuse) | " + " | ".join(f"{c} (s)" for c in cols) + " | pipeline us/instr |")
    print("|---|---:|" + "---:|" * len(cols) + "---:|")
    for r in rows:
        print(f"| {r['size']} | {r['instructions']} ({r['instructions_to_fuse']}) | "
              + " | ".join(f"{r[c]:.3f}" for c in cols) + f" | {r['us_per_instr_pipeline']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
