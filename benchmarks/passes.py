"""Time of each pass, and of the pipeline `call-inliner,dce,cse,algebraic-simplifier`, per module size;
the fusion passes on the module after `call-inliner,simplify` (untimed), then `dce` and the
latency-hiding scheduler on their result, as `-p default` runs them; and `-p default` as a whole (the sum
of its passes' seconds, verify-each off). Seconds are CPU seconds of this process (`time.process_time`,
`PassRecord.cpu_seconds`): the shared machine's load disturbs them much less than wall clock.

    python3 benchmarks/passes.py [--sizes 1k,5k,20k,100k] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from hlopt.corpus.transformer import SIZES, module_of_size

PASSES = ["call-inliner", "dce", "cse", "tuple-simplifier", "algebraic-simplifier"]
PIPELINE = "call-inliner,dce,cse,algebraic-simplifier"
FUSION_PASSES = ["priority-fusion", "multi-output-fusion"]  # after call-inliner,simplify (+ priority-fusion)
#: after the fusion passes, as `-p default` ends (column names: the pass, "(after fusion)" for dce)
LATE_PASSES = [("dce", "dce (after fusion)"), ("latency-hiding-scheduler", "latency-hiding-scheduler")]
DEFAULT = "default (sum of passes)"


def measure(size: str) -> dict:
    """One row: seconds per pass (each on a fresh parse) and for the whole pipeline."""
    from hlopt.passes.framework.pipeline import Pipeline

    from hlopt import hlo

    text, _ = module_of_size(SIZES[size])
    row: dict = {"size": size, "instructions": hlo.parse(text).instruction_count()}
    for name in PASSES + [PIPELINE]:
        module = hlo.parse(text)
        row[name] = _cpu_seconds(Pipeline.parse(name, verify_each=False, check_changed=False), module)
    module = hlo.parse(text)
    Pipeline.parse("call-inliner,simplify", verify_each=False, check_changed=False).run(module)
    row["instructions_to_fuse"] = module.instruction_count()
    for name in FUSION_PASSES:  # multi-output-fusion runs on priority-fusion's result
        row[name] = _cpu_seconds(Pipeline.parse(name, verify_each=False, check_changed=False), module)
    for name, column in LATE_PASSES:
        row[column] = _cpu_seconds(Pipeline.parse(name, verify_each=False, check_changed=False), module)
    row[DEFAULT] = _cpu_seconds(Pipeline.parse("default", verify_each=False, check_changed=False), hlo.parse(text))
    row["us_per_instr_pipeline"] = row[PIPELINE] / row["instructions"] * 1e6
    row["us_per_instr_default"] = row[DEFAULT] / row["instructions"] * 1e6
    return row


def _cpu_seconds(pipeline, module) -> float:
    """CPU seconds of the pipeline's passes on `module` (their `PassRecord.cpu_seconds`, summed)."""
    return sum(r.cpu_seconds for r in pipeline.run(module).records)


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
    cols = PASSES + [PIPELINE] + FUSION_PASSES + [c for _, c in LATE_PASSES] + [DEFAULT]
    print("| module | instructions (to fuse) | " + " | ".join(f"{c} (s)" for c in cols)
          + " | pipeline us/instr | default us/instr |")
    print("|---|---:|" + "---:|" * len(cols) + "---:|---:|")
    for r in rows:
        print(f"| {r['size']} | {r['instructions']} ({r['instructions_to_fuse']}) | "
              + " | ".join(f"{r[c]:.3f}" for c in cols)
              + f" | {r['us_per_instr_pipeline']:.1f} | {r['us_per_instr_default']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
