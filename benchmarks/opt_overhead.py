"""`hlopt opt -p default` end to end on a transformer training step: the time in the passes against the
time outside them (parse, input verification, setup: parsing the pipeline spec and loading the passes, the
pipeline's bookkeeping: verify-each, which re-checks what each changing pass changed
(`hlo.verifier.verify_changes`), the honest-`changed` check, per-pass instruction counts, the fix groups'
cycle check; printing and writing the output). The first run's setup imports the passes (what a fresh
`hlopt opt` process pays); the best run by total may be that one or a later one.

    python3 benchmarks/opt_overhead.py [--instructions 13000] [--repeat 3] [--json]

Each phase is timed as `hlopt opt` runs it (cli.main's parse_module, verification, Pipeline.run, to_text,
write), best of `--repeat` runs; the passes' own time is the sum of the PipelineResult's per-pass seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import module_of_size  # noqa: E402


def _one_run(text: str, out: Path) -> dict[str, float]:
    """Seconds of each phase of one `hlopt opt -p default` run."""
    from hlopt.cli.main import parse_module
    from hlopt.hlo.verifier import verify
    from hlopt.passes.pipeline import Pipeline

    t0 = time.perf_counter()
    module = parse_module("step.hlo", text, False)
    t1 = time.perf_counter()
    verify(module)
    t2 = time.perf_counter()
    pipeline = Pipeline.parse("default")
    t3 = time.perf_counter()
    result = pipeline.run(module, input_verified=True)
    t4 = time.perf_counter()
    out.write_text(module.to_text())
    t5 = time.perf_counter()
    passes = sum(r.seconds for r in result.records)
    return {"parse": t1 - t0, "verify": t2 - t1, "setup": t3 - t2, "passes": passes,
            "bookkeeping": (t4 - t3) - passes, "print": t5 - t4, "total": t5 - t0}


def measure(instructions: int, repeat: int) -> dict:
    """The best of `repeat` runs (by total), with the module's size."""
    from hlopt import hlo

    text, layers = module_of_size(instructions)
    size = hlo.parse(text).instruction_count()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [_one_run(text, Path(tmp) / "out.hlo") for _ in range(repeat)]
    best = min(runs, key=lambda r: r["total"])
    best["outside"] = best["total"] - best["passes"]
    return {"instructions": size, "layers": layers, **best, "outside_share": best["outside"] / best["total"]}


def main() -> int:
    """Run and print a markdown table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--instructions", type=int, default=13_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    row = measure(args.instructions, args.repeat)
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    cols = ["parse", "verify", "setup", "passes", "bookkeeping", "print", "total", "outside"]
    print("| instructions | " + " | ".join(f"{c} (s)" for c in cols) + " | outside share |")
    print("|---:|" + "---:|" * len(cols) + "---:|")
    print(f"| {row['instructions']} | " + " | ".join(f"{row[c]:.2f}" for c in cols)
          + f" | {row['outside_share']:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
