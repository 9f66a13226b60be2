"""`hlopt opt -p default` on a transformer training step, counted in instructions executed instead of seconds:
each phase (parse, input verification, the passes, verify-each, print) and a whole fresh `hlopt opt` process,
under valgrind's callgrind. On a shared machine whose speed drifts from minute to minute (other tenants, a
slower host) seconds compare badly across runs; these counts repeat to about 0.05%, so two versions of the code
(two checkouts, each running this script) compare reliably. Instructions are not seconds: memory stalls and
cache misses are not in them.

    python3 benchmarks/instruction_counts.py [--instructions 20000] [--jobs 2] [--no-fresh] [--json]

Each phase is the difference between two child processes that stop one step apart (imports; + parse; + input
verification; + `Pipeline.run` without verify-each; the same with it; + print) and then end without the
interpreter's teardown (as the `hlopt` command does), all with a bytecode cache warmed first, as a pip-installed
hlopt has one; the children import hlopt from this script's checkout (its root on PYTHONPATH), so that running the
script in two checkouts compares their code. Under callgrind a process runs about 50 times slower: a 20k-instruction
step takes a few minutes with two jobs. Needs `valgrind` on the PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the child stages, each doing what the one before it does and one step more
STAGES = ("import", "parse", "verify", "passes", "verify-each", "print")
#: phase -> (stage it ends with, stage before it)
PHASES = {
    "parse": ("parse", "import"),
    "input verification": ("verify", "parse"),
    "passes (loading them included)": ("passes", "verify"),
    "verify-each": ("verify-each", "passes"),
    "print": ("print", "verify-each"),
}
_REFS_RE = re.compile(r"I\s+refs:\s+([\d,]+)")


def run_stage(stage: str, path: str) -> object:
    """What one child does: `hlopt opt`'s steps up to `stage` on the module in `path` (as cli.main runs them);
    returns what it made, for the caller to keep until it exits (freeing it is no phase of the command)."""
    import gc

    from hlopt.hlo import parse, verify
    from hlopt.passes.framework.pipeline import Pipeline

    gc.disable()  # as the pipeline and the parser keep it while they run: no collection in between either
    if stage == "import":
        return None
    module = parse(Path(path).read_text())
    if stage == "parse":
        return module
    verify(module)
    if stage == "verify":
        return module
    Pipeline.parse("default", verify_each=stage != "passes").run(module, input_verified=True)
    if stage == "print":
        return module, module.to_text()
    return module


def _count(argv: list[str], env: dict[str, str]) -> int:
    """Instructions a child process executes (callgrind's total)."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
                          env=env, capture_output=True, text=True, check=False)
    found = _REFS_RE.search(done.stderr)
    if done.returncode != 0 or found is None:
        tail = "\n".join(done.stderr.splitlines()[-5:])
        raise SystemExit(f"instruction_counts: {' '.join(argv[:3])} ... failed (status {done.returncode}):\n{tail}")
    return int(found.group(1).replace(",", ""))


def measure(instructions: int, jobs: int, fresh: bool) -> dict[str, float]:
    """Billions of instructions per phase (and of a whole fresh `hlopt opt` process)."""
    from hlopt.corpus.transformer import module_of_size

    with tempfile.TemporaryDirectory() as tmp:
        step = Path(tmp, "step.hlo")
        step.write_text(module_of_size(instructions)[0])
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp, "pycache"))
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        script = str(Path(__file__).resolve())
        opt = [sys.executable, "-m", "hlopt.cli.main", "opt", str(step), "-p", "default", "-o", str(Path(tmp, "o.hlo"))]
        runs = {stage: [sys.executable, script, "--child", stage, str(step)] for stage in STAGES}
        for warm in (opt, runs["print"]):  # the bytecode cache: every module a child imports, this script's too
            subprocess.run(warm, env=env, capture_output=True, check=True)
        if fresh:
            runs["fresh"] = opt
        with ThreadPoolExecutor(max(jobs, 1)) as pool:
            counts = dict(zip(runs, pool.map(lambda argv: _count(argv, env), runs.values()), strict=True))
    out = {phase: (counts[end] - counts[start]) / 1e9 for phase, (end, start) in PHASES.items()}
    out["parse to print"] = (counts["print"] - counts["import"]) / 1e9
    if fresh:
        out["a fresh hlopt opt process"] = counts["fresh"] / 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instructions", type=int, default=20000)
    ap.add_argument("--jobs", type=int, default=2, help="child processes under callgrind at once")
    ap.add_argument("--no-fresh", action="store_true", help="leave out the whole fresh `hlopt opt` process")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("STAGE", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kept = run_stage(*args.child)
        sys.stdout.flush()
        os._exit(0 if kept is not None or args.child[0] == "import" else 1)  # no teardown, as `hlopt opt` ends
    if shutil.which("valgrind") is None:
        raise SystemExit("instruction_counts: valgrind is not on the PATH (callgrind counts the instructions)")
    got = measure(args.instructions, args.jobs, not args.no_fresh)
    if args.json:
        print(json.dumps({"instructions": args.instructions, "billions": got}, indent=2))
        return
    print(f"| phase of `hlopt opt -p default`, {args.instructions}-instruction step | instructions (G) |")
    print("|---|---:|")
    for phase, n in got.items():
        print(f"| {phase} | {n:.3f} |")


if __name__ == "__main__":
    main()
