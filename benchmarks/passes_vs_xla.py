"""Each pass of `hlopt opt -p default` against the same pass of XLA:GPU's own compile of the same module: the
ratio of hlopt's Python to XLA's C++, pass by pass.

    python3 benchmarks/passes_vs_xla.py [--instructions 20000 | --hlo FILE] [--target h100] [--repeat 1] [--json]

hlopt's side runs as `hlopt opt -p default` does (parse, input verification, `Pipeline.run` with verify-each);
each pass's seconds are its `PassRecord`'s (wall clock and this process's CPU time), summed over the times it
ran. XLA's side is one deviceless XLA:GPU compile (`runtime.xla_gpu_path.xla_gpu.run_driver(...,
pass_times=True)`): XLA records when each of its HLO passes started and ended in the module metadata it dumps
(`--xla_dump_module_metadata`), and the pass's seconds are the difference, summed over the times it ran. Best of
`--repeat` on each side (by hlopt's passes in total; by XLA's whole compile).

What the two sides run differs: XLA runs a pass on its own module at that point of its pipeline (after layout
assignment, its normalizations, its GEMM rewrites...), runs some passes many more times (`algsimp`, `dce`,
`cse`), and may spread a pass over several threads (its priority fusion computes priorities in parallel); its
times are wall clock. XLA's metadata does not list the latency-hiding scheduler (XLA:GPU schedules after the
passes it records). The fusion passes run once on each side on a module of about the same size, so theirs is
the closest comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

#: hlopt's pass -> the name XLA gives the same pass (`HloPassInterface::name()`), for the passes of `-p default`
XLA_NAMES = {
    "call-inliner": "call-inliner",
    "algebraic-simplifier": "algsimp",
    "conditional-simplifier": "simplify-conditional",
    "tuple-simplifier": "tuple-simplifier",
    "cse": "cse",
    "dce": "dce",
    "block-scaling-rewriter": "block-scaling-rewriter",
    "while-loop-all-reduce-code-motion": "while-loop-all-reduce-code-motion",
    "collective-pipeliner": "collective-pipeliner-forward",
    "while-loop-trip-count-annotator": "while-loop-trip-count-annotator",
    "dot-strength-reduction": "dot-strength-reduction",
    "select-and-scatter-expander": "select_and_scatter_expander",
    "scatter-simplifier": "scatter_simplifier",
    "priority-fusion": "priority-fusion",
    "multi-output-fusion": "multi_output_fusion",
    "latency-hiding-scheduler": "latency-hiding-scheduler",
}


#: passes that took less than this (s) on either side get no ratio (a clock's noise)
_SHORTEST = 0.001


def hlopt_pass_seconds(text: str, filename: str = "<text>") -> dict[str, dict[str, float]]:
    """hlopt pass name -> {"runs", "seconds", "cpu_seconds"} for one `hlopt opt -p default` run on `text`
    (passes skipped by a fix group's no-change check not counted); `filename` names it in a parse error."""
    from hlopt.hlo import parse, verify
    from hlopt.passes.framework.pipeline import Pipeline

    module = parse(text, filename=filename)
    verify(module)
    result = Pipeline.parse("default").run(module, input_verified=True)
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"runs": 0, "seconds": 0.0, "cpu_seconds": 0.0})
    for record in result.records:
        if record.skipped:
            continue
        row = out[record.name.split("{")[0]]  # `collective-pipeliner{op=...}`: the pass, whatever its options
        row["runs"] += 1
        row["seconds"] += record.seconds
        row["cpu_seconds"] += record.cpu_seconds
    return dict(out)


def xla_pass_seconds(text: str, target: str) -> tuple[float, dict[str, dict[str, float]]]:
    """(XLA:GPU's whole deviceless compile in seconds, XLA pass name -> {"runs", "seconds"})."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import run_driver

    result = run_driver(text, target, pass_times=True)
    # a nested pipeline (XLA's `simplification` fix point) is recorded as a pass of the pipeline around it and
    # its passes again under its own name: counted once, by its passes; `pipeline-start` marks where one begins
    pipelines = {t.pipeline for t in result.pass_times} | {"pipeline-start"}
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"runs": 0, "seconds": 0.0})
    for t in result.pass_times:
        if t.name in pipelines:
            continue
        out[t.name]["runs"] += 1
        out[t.name]["seconds"] += t.seconds
    return result.compile_seconds, dict(out)


def measure(text: str, target: str, repeat: int, filename: str = "<text>") -> dict:
    """Both sides, best of `repeat` each, and the rows of the comparison."""
    best_hlopt = min((hlopt_pass_seconds(text, filename) for _ in range(repeat)),
                     key=lambda row: sum(r["seconds"] for r in row.values()))
    best_xla = min((xla_pass_seconds(text, target) for _ in range(repeat)), key=lambda got: got[0])
    xla_compile, xla = best_xla
    rows = []
    for name, ours in best_hlopt.items():
        xla_name = XLA_NAMES.get(name)
        theirs = xla.get(xla_name) if xla_name else None
        rows.append({"pass": name, "runs": ours["runs"], "seconds": ours["seconds"], "cpu_seconds": ours["cpu_seconds"],
                     "xla_pass": xla_name, "xla_runs": theirs["runs"] if theirs else 0,
                     "xla_seconds": theirs["seconds"] if theirs else None,
                     "ratio": ours["seconds"] / theirs["seconds"] if theirs and min(theirs["seconds"], ours["seconds"])
                     >= _SHORTEST else None})
    passes = sum(r["seconds"] for r in best_hlopt.values())
    return {"target": target, "rows": rows, "hlopt_passes": passes,
            "hlopt_cpu_passes": sum(r["cpu_seconds"] for r in best_hlopt.values()),
            "xla_compile": xla_compile, "xla_recorded_passes": sum(r["seconds"] for r in xla.values()),
            "passes_vs_xla_compile": passes / xla_compile,
            "xla_top": sorted(({"pass": k, **v} for k, v in xla.items()), key=lambda r: -r["seconds"])[:10]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--instructions", type=int, default=20_000, help="size of the corpus transformer step")
    source.add_argument("--hlo", help="an HLO text module instead")
    ap.add_argument("--target", default="h100", help="XLA:GPU target (h100, h200, b200, a100)")
    ap.add_argument("--repeat", type=int, default=1, help="best of this many runs on each side")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    started = time.perf_counter()
    try:  # a module either side refuses, or no GPU compiler: its message, not a traceback
        from hlopt.corpus.transformer import step_or_file

        text, what = step_or_file(args.instructions, args.hlo)
        got = measure(text, args.target, args.repeat, args.hlo or "<text>")
    except (OSError, ValueError, RuntimeError) as e:  # (HloParseError, HloVerifyError, GpuCompilerMissing among them)
        print(f"passes_vs_xla: error: {e}", file=sys.stderr)
        return 2
    got["module"] = what
    if args.json:
        print(json.dumps(got, indent=2))
        return 0
    print(f"{what}; XLA:GPU {args.target}, deviceless (measured in {time.perf_counter() - started:.0f} s)\n")
    print("| hlopt pass | runs | hlopt wall (s) | hlopt CPU (s) | XLA pass | runs | XLA wall (s) | hlopt / XLA |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for r in got["rows"]:
        xla = f"{r['xla_seconds']:.3f}" if r["xla_seconds"] is not None else "not recorded"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "(under 1 ms)" if r["xla_seconds"] is not None else ""
        print(f"| {r['pass']} | {r['runs']} | {r['seconds']:.3f} | {r['cpu_seconds']:.3f} | {r['xla_pass'] or ''} | "
              f"{r['xla_runs'] or ''} | {xla} | {ratio} |")
    print(f"\nhlopt's passes {got['hlopt_passes']:.2f} s wall ({got['hlopt_cpu_passes']:.2f} s CPU); XLA:GPU's whole "
          f"compile {got['xla_compile']:.2f} s, of which its recorded HLO passes {got['xla_recorded_passes']:.2f} s; "
          f"hlopt's passes {got['passes_vs_xla_compile']:.2f}x of XLA's compile")
    print("XLA's slowest recorded passes: " + ", ".join(f"{r['pass']} {r['seconds']:.2f} s" for r in got["xla_top"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
