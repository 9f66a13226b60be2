"""`hlopt tune` on the scanned 8-device training steps (FSDP, data parallelism), deviceless H100.

    python3 benchmarks/tune_programs.py [--programs fsdp_scan,dp_scan] [--trials 30] [--workers 2] [--out DIR]
                                        [--budget-s S] [--markdown]

For each program of `corpus/pipeline_programs.py` (captured as `hlopt tune` users capture them), one search
over hlopt's default space (`runtime/tuning/tune_default_space.yaml`, seed 0), its trials kept in DIR/<program>/ (a second
run resumes them: the same command prints the table again without compiling). The table: XLA:GPU's default
configuration (trial 0), the best configuration of XLA:GPU alone (its XLA_FLAGS) and the best overall, each by
XLA's estimates (what the search minimizes, as `hlopt compile` reports it) and by hlopt's analytical makespan of
the same final module, with the ratio to the default. Needs the XLA:GPU compiler and optuna.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hlopt.corpus import use_cpu_devices

use_cpu_devices()  # 8 CPU devices and JAX_PLATFORMS=cpu, before jax is imported


def tune_program(name: str, trials: int, workers: int, out: Path, budget_s: float | None) -> Any:
    """The (resumed) search of one program."""
    from hlopt.corpus.pipeline_programs import DEVICES, capture
    from hlopt.runtime.tuning.tune import Tuner
    from hlopt.runtime.tuning.tune_report import write_outputs
    from hlopt.runtime.tuning.tune_space import default_space

    text = capture(name)
    tuner = Tuner(name, [(f"{name}.hlo", text)], out / name, default_space(), "h100", DEVICES, trials, budget_s,
                  workers, on_record=lambda r, _: print(f"{name} trial {r['trial']}: {r.get('objective_us')} us "
                                                       f"[{r['status']}] {r['config']}", file=sys.stderr))
    result = tuner.run()
    write_outputs(result, DEVICES)
    return result


def row(result: Any) -> dict[str, Any]:
    """One program's figures: default, best XLA alone, best overall, best by makespan (trial numbers, us)."""
    default, best_xla, best = result.default(), result.best("xla"), result.best()
    by_makespan = min(result.ok(), key=lambda r: (r["makespan_us"], r["trial"]))
    return {"program": result.name, "trials": len(result.records),
            "failed": sum(r["status"] == "failed" for r in result.records),
            "default": default, "best_xla": best_xla, "best": best, "best_makespan": by_makespan}


def _cell(r: dict[str, Any], default: dict[str, Any], key: str) -> str:
    return f"{r[key]:.1f} ({r[key] / default[key]:.3f})"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README table."""
    lines = ["| program | trials | XLA defaults: XLA est. / our makespan (us) | best XLA alone: XLA est. / our makespan "
             "(us, ratio) | its XLA_FLAGS | best overall: XLA est. / our makespan (us, ratio) | its configuration |",
             "|---|---:|---:|---:|---|---:|---|"]
    for r in rows:
        d, x, b = r["default"], r["best_xla"], r["best"]
        lines.append(f"| {r['program']} | {r['trials']} | {d['modeled_us']:.1f} / {d['makespan_us']:.1f} | "
                     f"{_cell(x, d, 'modeled_us')} / {_cell(x, d, 'makespan_us')} | `{x['xla_flags'] or '(none)'}` | "
                     f"{_cell(b, d, 'modeled_us')} / {_cell(b, d, 'makespan_us')} | trial {b['trial']}: {b['config']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run (or resume) the searches and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--programs", default="fsdp_scan,dp_scan")
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=None)
    p.add_argument("--out", default="tune-programs")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    from hlopt.runtime.xla_gpu_path.xla_gpu import INSTALL_COMMAND, available

    if not available():
        print(f"needs the XLA:GPU compiler: {INSTALL_COMMAND}", file=sys.stderr)
        return 3
    rows = [row(tune_program(n, args.trials, args.workers, Path(args.out), args.budget_s))
            for n in args.programs.split(",")]
    if args.markdown:
        print(markdown(rows))
    else:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
