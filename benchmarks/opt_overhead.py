"""`hlopt opt -p default` end to end on a transformer training step: the time in the passes against the
time outside them (parse, input verification, setup: parsing the pipeline spec and loading the passes, the
pipeline's bookkeeping: verify-each, which re-checks what each changing pass changed
(`hlo.verifier.verify_changes`), the honest-`changed` check, per-pass instruction counts, the fix groups'
cycle check; printing and writing the output). The first run's setup imports the passes (what a fresh
`hlopt opt` process pays); the best run by total may be that one or a later one.

    python3 benchmarks/opt_overhead.py [--instructions 13000] [--repeat 3] [--fresh N [--bytecode-cache]] [--json]

Each phase is timed as `hlopt opt` runs it (cli.main's parse_module, verification, Pipeline.run, to_text,
write), best of `--repeat` runs; the passes' own time is the sum of the PipelineResult's per-pass seconds.
Every phase is timed twice: wall clock, and this process's CPU time (`time.process_time`; the passes' by
`PassRecord.cpu_seconds`), which other sessions' load on a shared machine disturbs much less.

`--fresh N` also runs the real command N times, each in a new process
(`python3 -m hlopt.cli.main opt IN -p default -o OUT --timing`): the whole process from start to exit
(interpreter start, imports, everything above, `--timing`'s counts, and the exit), wall clock and the
child's CPU time, against the passes' total from its `--timing` table; the best run by wall clock. Where
the environment sets PYTHONDONTWRITEBYTECODE, every such process compiles hlopt's sources again;
`--bytecode-cache` runs them with a bytecode cache instead, as a pip-installed hlopt has one.

`--xla-gpu N` also compiles the same module with XLA:GPU's whole pipeline, deviceless (H100, hlopt's driver:
`runtime.xla_gpu_path.xla_gpu.run_driver`; the compile's own wall clock in the child, best of N), and reports the ratio of
hlopt's passes (and of the fresh command) to it: what a pre-compile hook adds to a compile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from hlopt.corpus.transformer import module_of_size  # noqa: E402

PHASES = ("parse", "verify", "setup", "passes", "bookkeeping", "print", "total")


def _one_run(text: str, out: Path) -> dict[str, float]:
    """Seconds of each phase of one `hlopt opt -p default` run (wall, and CPU as `cpu_<phase>`)."""
    from hlopt.cli.main import parse_module
    from hlopt.hlo.verifier import verify
    from hlopt.passes.framework.pipeline import Pipeline

    clocks = [(time.perf_counter(), time.process_time())]
    module = parse_module("step.hlo", text, False)
    clocks.append((time.perf_counter(), time.process_time()))
    verify(module)
    clocks.append((time.perf_counter(), time.process_time()))
    pipeline = Pipeline.parse("default")
    clocks.append((time.perf_counter(), time.process_time()))
    result = pipeline.run(module, input_verified=True)
    clocks.append((time.perf_counter(), time.process_time()))
    out.write_text(module.to_text())
    clocks.append((time.perf_counter(), time.process_time()))
    row: dict[str, float] = {}
    for i, prefix in ((0, ""), (1, "cpu_")):
        t = [c[i] for c in clocks]
        passes = sum(r.cpu_seconds if i else r.seconds for r in result.records)
        row.update({f"{prefix}parse": t[1] - t[0], f"{prefix}verify": t[2] - t[1], f"{prefix}setup": t[3] - t[2],
                    f"{prefix}passes": passes, f"{prefix}bookkeeping": (t[4] - t[3]) - passes,
                    f"{prefix}print": t[5] - t[4], f"{prefix}total": t[5] - t[0]})
        row[f"{prefix}outside"] = row[f"{prefix}total"] - passes
        row[f"{prefix}outside_share"] = row[f"{prefix}outside"] / row[f"{prefix}total"]
    return row


def _passes_total(timing: str) -> tuple[float, float]:
    """(wall, CPU) seconds of the passes from the `total` row of `hlopt opt --timing`'s table."""
    for line in timing.splitlines():
        found = re.match(r"total \(\d+ module\(s\)\)\s+(.*)", line)
        if found:  # the summary: passes, changed, ms, cpu ms, instructions, kernels
            fields = found.group(1).split()
            return float(fields[2]) / 1e3, float(fields[3]) / 1e3
        if line.startswith("total "):  # the per-pass table's last row (older `--timing`)
            fields = line.split()
            return float(fields[2]) / 1e3, float(fields[-1]) / 1e3
    raise RuntimeError(f"no total row in the --timing output:\n{timing}")


def _fresh_env(pycache: Path | None) -> dict[str, str]:
    """The child's environment: this checkout first on the path; with `pycache`, Python's bytecode cache on
    and kept there (what an installed package has), else the environment's own setting."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _fresh_run(src: Path, out: Path, env: dict[str, str]) -> dict[str, float]:
    """One `hlopt opt -p default` in a new process: its wall and CPU time from start to exit, the passes'."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "hlopt.cli.main", "opt", str(src), "-p", "default", "-o",
                           str(out), "--timing"], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    passes, cpu_passes = _passes_total(proc.stderr)
    return {"total": wall, "passes": passes, "outside": wall - passes, "outside_share": (wall - passes) / wall,
            "cpu_total": cpu, "cpu_passes": cpu_passes, "cpu_outside": cpu - cpu_passes,
            "cpu_outside_share": (cpu - cpu_passes) / cpu}


def xla_gpu_seconds(text: str, repeat: int) -> tuple[float, float]:
    """(wall, CPU) seconds of XLA:GPU's deviceless compile of `text` for one H100, best of `repeat`: the
    compile's own wall clock in the driver's child process, and that child's whole CPU time (loading the
    compiler plugin included; XLA compiles on several threads)."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import run_driver

    runs = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = run_driver(text, "h100").compile_seconds
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runs.append((wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)))
    return min(runs)


def measure(instructions: int, repeat: int, fresh: int = 0, bytecode_cache: bool = False,
            xla_gpu: int = 0) -> dict:
    """The best of `repeat` runs (by total), with the module's size; with `fresh`, the best of that many
    new-process runs of the command under "fresh" (`bytecode_cache`: after one unmeasured run that fills
    a bytecode cache, as a pip-installed hlopt has one)."""
    from hlopt import hlo

    text, layers = module_of_size(instructions)
    size = hlo.parse(text).instruction_count()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [_one_run(text, Path(tmp) / "out.hlo") for _ in range(repeat)]
        src = Path(tmp) / "step.hlo"
        src.write_text(text)
        env = _fresh_env(Path(tmp) / "pycache" if bytecode_cache else None)
        if fresh and bytecode_cache:
            _fresh_run(src, Path(tmp) / "fresh.hlo", env)
        fresh_runs = [_fresh_run(src, Path(tmp) / "fresh.hlo", env) for _ in range(fresh)]
    best = min(runs, key=lambda r: r["total"])
    row = {"instructions": size, "layers": layers, **best}
    if fresh_runs:
        row["fresh"] = min(fresh_runs, key=lambda r: r["total"])
    if xla_gpu:
        xla, xla_cpu = row["xla_gpu_compile"], row["cpu_xla_gpu_compile"] = xla_gpu_seconds(text, xla_gpu)
        row["passes_vs_xla_gpu"] = row["passes"] / xla
        row["cpu_passes_vs_xla_gpu"] = row["cpu_passes"] / xla_cpu
        if fresh_runs:
            row["fresh_vs_xla_gpu"] = row["fresh"]["total"] / xla
            row["fresh_passes_vs_xla_gpu"] = row["fresh"]["passes"] / xla
            row["cpu_fresh_vs_xla_gpu"] = row["fresh"]["cpu_total"] / xla_cpu
    return row


def main() -> int:
    """Run and print markdown tables (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--instructions", type=int, default=13_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fresh", type=int, default=0, help="also run the command this many times in new processes")
    ap.add_argument("--bytecode-cache", action="store_true",
                    help="fresh runs with Python's bytecode cache on (filled by one unmeasured run first), even "
                         "where the environment sets PYTHONDONTWRITEBYTECODE")
    ap.add_argument("--xla-gpu", type=int, default=0, metavar="N",
                    help="also time XLA:GPU's deviceless compile of the module (best of N) and report the ratio")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    row = measure(args.instructions, args.repeat, args.fresh, args.bytecode_cache, args.xla_gpu)
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    cols = [*PHASES, "outside"]
    print("| instructions | clock | " + " | ".join(f"{c} (s)" for c in cols) + " | outside share |")
    print("|---:|---|" + "---:|" * len(cols) + "---:|")
    for clock, prefix in (("wall", ""), ("CPU", "cpu_")):
        print(f"| {row['instructions']} | {clock} | " + " | ".join(f"{row[prefix + c]:.2f}" for c in cols)
              + f" | {row[prefix + 'outside_share']:.0%} |")
    if "fresh" in row:
        f = row["fresh"]
        cache = "on" if args.bytecode_cache else "as the environment has it"
        print(f"\nfresh process (`python3 -m hlopt.cli.main opt ... --timing`, start to exit; bytecode cache "
              f"{cache}):\n")
        print("| clock | total (s) | passes (s) | outside (s) | outside share |\n|---|---:|---:|---:|---:|")
        for clock, prefix in (("wall", ""), ("CPU", "cpu_")):
            print(f"| {clock} | {f[prefix + 'total']:.2f} | {f[prefix + 'passes']:.2f} | {f[prefix + 'outside']:.2f} "
                  f"| {f[prefix + 'outside_share']:.0%} |")
    if "xla_gpu_compile" in row:
        print(f"\nXLA:GPU's deviceless compile of the same module (H100): {row['xla_gpu_compile']:.2f} s wall, "
              f"{row['cpu_xla_gpu_compile']:.2f} s CPU; hlopt's passes (one process) {row['passes_vs_xla_gpu']:.2f}x "
              f"of it by wall clock, {row['cpu_passes_vs_xla_gpu']:.2f}x by CPU", end="")
        if "fresh_vs_xla_gpu" in row:
            print(f"; the fresh command's passes {row['fresh_passes_vs_xla_gpu']:.2f}x, its whole run "
                  f"{row['fresh_vs_xla_gpu']:.2f}x", end="")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
