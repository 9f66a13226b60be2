"""collective-pipeliner on the scanned training steps of corpus/pipeline_programs.py (8 devices, d=512).

For each program, the `default` pipeline (less the scheduler) with the pipeliner as the default runs it (each
move only where hlopt's cost model says it pays), without the pipeliner, and with every move XLA would make
(`cost_model` off); then hlopt's scheduler (`xla-default` heuristic, H100 analytical model) and its
simulated makespan of the step (loops times their trip counts) and exposed communication.

    python3 benchmarks/collective_pipeliner.py [--programs fsdp_scan,dp_scan] [--json]

`--xla`: XLA's own estimates instead (deviceless XLA:GPU, H100, `runtime.reemit.compile_for_gpu`: hlopt's
passes before XLA, then XLA:GPU's passes, then hlopt's fusion and scheduler; needs the gpu-compile python,
minutes per program): hlopt before XLA without and with the pipeliner, and XLA:GPU's default compile with
and without its pipelining flags (`--xla_gpu_enable_pipelined_all_gather/_reduce_scatter/_all_reduce`).
"""

from __future__ import annotations

import argparse
import json
import os
import re

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

XLA_PIPELINING = ("--xla_gpu_enable_pipelined_all_gather=true --xla_gpu_enable_pipelined_reduce_scatter=true "
                  "--xla_gpu_enable_pipelined_all_reduce=true")
PIPELINERS = re.compile(r"collective-pipeliner\{[^}]*\},")


def _captured(name: str):
    from hlopt.corpus.pipeline_programs import capture

    import hlopt

    module = hlopt.parse(capture(name))
    for n, inst in enumerate(i for i in module.instructions() if isinstance(i.attrs.get("channel_id"), int)):
        inst.attrs["channel_id"] = n + 1  # jax gives every shard_map collective id 1 (see the tests)
    return module


def simulated(names: list[str]) -> list[dict]:
    """hlopt's simulated makespan per program and variant."""
    from hlopt.cli.schedule import schedule_module
    from hlopt.passes.pipeline import NAMED_PIPELINES, run_pipeline

    default = NAMED_PIPELINES["default"].replace(",latency-hiding-scheduler", "")
    variants = {"without pipeliner": PIPELINERS.sub("", default), "default (cost model)": default,
                "every move": default.replace(",cost_model=h100", "")}
    rows = []
    for name in names:
        base = _captured(name)
        for label, spec in variants.items():
            module = base.clone()
            result = run_pipeline(module, spec, verify_each=False)
            moved = sum(1 for r in result.records if r.name.startswith("collective-pipeliner") and r.changed)
            summary = schedule_module(module, "xla-default", "h100", "analytical", 1)
            rows.append({"program": name, "variant": label, "makespan_us": round(summary["makespan_us"], 1),
                         "exposed_comm_us": round(summary["exposed_comm_us"], 1), "pipeliner_runs_changed": moved})
    return rows


def xla_estimates(names: list[str]) -> list[dict]:
    """XLA's estimates (deviceless XLA:GPU) per program and variant."""
    from hlopt.passes.pipeline import NAMED_PIPELINES
    from hlopt.runtime import reemit

    without = PIPELINERS.sub("", reemit.BEFORE_XLA)  # BEFORE_XLA runs the pipeliners (cost model) since it has them
    assert NAMED_PIPELINES["default"] and without != reemit.BEFORE_XLA
    variants = {"hlopt without pipeliner": (without, ""),
                "hlopt + pipeliner (cost model)": (reemit.BEFORE_XLA, ""),
                "hlopt + pipeliner (every move)": (reemit.BEFORE_XLA.replace(",cost_model=h100", ""), ""),
                "XLA:GPU with its pipelining flags": (without, XLA_PIPELINING)}
    rows = []
    for name in names:
        base = _captured(name)
        for label, (before, flags) in variants.items():
            result = reemit.compile_for_gpu(base.clone(), target="h100", before=before, xla_flags=flags)
            report = result.report
            rows.append({"program": name, "variant": label, "hlopt_us": report["ours"]["modeled_us"],
                         "xla_default_us": report["xla_default"]["modeled_us"], "ratio": report["ratio"]})
    return rows


def main(argv: list[str] | None = None) -> None:
    """Print the table (markdown) or JSON rows."""
    from hlopt.corpus.pipeline_programs import PROGRAMS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--xla", action="store_true", help="XLA's estimates (deviceless XLA:GPU) instead")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    names = [n for n in args.programs.split(",") if n]
    rows = xla_estimates(names) if args.xla else simulated(names)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
