"""The simulator against an independent replay of XLA:GPU's final module, and our schedule against XLA's.

Every corpus program (corpus/programs.py, 8-device programs included) and every pipeline program
(corpus/pipeline_programs.py, compiled by XLA:GPU by default and with its collective pipeliner on) is
compiled deviceless for an H100 by hlopt's own driver (`runtime.xla_gpu_path.xla_gpu.run_driver`). On XLA's own
per-instruction estimates (`XlaEstimateLatency`: XLA's fusion estimates, its collective `sol` estimates,
plus the launch overhead):

- `simulated`: the simulator's makespan of XLA's final module in XLA's order (`simulate` of the entry, while
  loops by their simulated bodies), on XLA:GPU's stream model;
- `replay`: `scheduler.replay` of the same module, an event replay of XLA:GPU's streams sharing nothing
  with the simulator but the estimates; `diff` is simulated / replay - 1;
- `ours`: the replay after our latency-hiding-scheduler re-scheduled every non-fusion computation of XLA's
  module (the pass's defaults, XLA's estimates) on the given stream model; `ours/xla` its ratio to the
  replay of XLA's order.

    python3 benchmarks/stream_replay.py [--programs a,b] [--stream-model xla-gpu|per-type] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

__all__ = ["compare", "reschedule", "programs", "PIPELINER_FLAGS"]

#: XLA's collective pipeliner, on for the kinds the pipeline programs hold.
PIPELINER_FLAGS = ("--xla_gpu_enable_pipelined_all_gather=true --xla_gpu_enable_pipelined_reduce_scatter=true "
                   "--xla_gpu_enable_pipelined_all_reduce=true")


def _estimator(module, target: str):
    from hlopt.cost_model.devices import get_device
    from hlopt.runtime.xla_gpu_path.xla_gpu import XlaEstimateLatency

    devices = int(module.config.get("replica_count", 1)) * int(module.config.get("num_partitions", 1))
    return XlaEstimateLatency(target, float(get_device(target).kernel_launch_us), devices)


def reschedule(module, estimator, target: str = "h100", stream_model: str = "xla-gpu") -> None:
    """Our latency-hiding-scheduler (the pass's defaults) on every non-fusion computation of `module`, in
    place, with `estimator`'s times."""
    from hlopt.passes.framework.base import non_fusion_computations
    from hlopt.scheduler.async_ops import stream_model as streams
    from hlopt.scheduler.heuristics import get_heuristic
    from hlopt.scheduler.latency_hiding_scheduler import (
        LatencyHidingScheduler,
        finish_computation,
        schedule_with_options,
        scheduler_memory_limit,
    )

    lhs = LatencyHidingScheduler(device=target, stream_model=stream_model)
    options = replace(lhs.schedule_options(), fill_memory_limit=scheduler_memory_limit(module, target))
    with streams(stream_model):
        for comp in non_fusion_computations(module):
            result = schedule_with_options(comp, estimator, get_heuristic(lhs.heuristic), lhs.kind_limits(), options)
            finish_computation(comp, result, options)


def compare(final_text: str, target: str = "h100", stream_model: str = "xla-gpu") -> dict:
    """simulated, replay, diff, ours and ours/xla (module docstring) of one XLA:GPU final module."""
    from hlopt.hlo.parser import parse
    from hlopt.scheduler.replay import replay_module

    module = parse(final_text)
    simulated = _estimator(module, target).computation_us(module.entry)
    xla = replay_module(module, _estimator(module, target)).makespan_us
    reschedule(module, _estimator(module, target), target, stream_model)
    ours = replay_module(module, _estimator(module, target)).makespan_us
    return {"simulated_us": simulated, "replay_us": xla, "diff": simulated / xla - 1.0 if xla else 0.0,
            "ours_us": ours, "ours_vs_xla": ours / xla if xla else 1.0}


def programs(names: list[str] | None = None, pipelines: bool = True) -> list[tuple[str, str, int, str]]:
    """(name, unoptimized HLO, devices, XLA flags) of the corpus programs XLA:GPU compiles (corpus/programs.py
    and the sharded-jit programs of corpus/programs_extra.py; LAPACK custom calls have no GPU handler) and, with `pipelines`, the pipeline programs twice (XLA's default compile and
    `PIPELINER_FLAGS`)."""
    from hlopt.corpus import use_cpu_devices

    use_cpu_devices()  # 8 CPU devices, set before jax is imported
    from hlopt.corpus.programs import corpus_texts
    from hlopt.corpus.programs_extra import extra_corpus_texts

    entries = [*corpus_texts(optimized=False), *(e for e in extra_corpus_texts() if not e.optimized)]
    out = [(e.id, e.text, e.devices, "") for e in entries
           if "lapack" not in e.text and (names is None or e.id in names)]
    if pipelines:
        from hlopt.corpus.pipeline_programs import DEVICES, PROGRAMS, capture

        for name in PROGRAMS:
            for tag, flags in (("", ""), ("+pipelined", PIPELINER_FLAGS)):
                if names is None or name + tag in names:
                    out.append((name + tag, capture(name), DEVICES, flags))
    return out


def run(names: list[str] | None, target: str, stream_model: str) -> list[dict]:
    """One row per program (`compare`), XLA:GPU compiling each through `run_driver`."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import run_driver

    rows = []
    for name, text, devices, flags in programs(names):
        final = run_driver(text, target, devices, xla_flags=flags).final_text
        rows.append({"program": name, "devices": devices, **compare(final, target, stream_model)})
        print(f"{name}: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    """The README table."""
    lines = ["| program | devices | simulated (µs) | replay (µs) | diff | ours (µs) | ours / XLA |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['program']} | {r['devices']} | {r['simulated_us']:.1f} | {r['replay_us']:.1f} | "
                     f"{100 * r['diff']:+.2f}% | {r['ours_us']:.1f} | {r['ours_vs_xla']:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print it."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--programs", help="comma-separated names (default: all)")
    p.add_argument("--target", default="h100")
    p.add_argument("--stream-model", default="xla-gpu", choices=["xla-gpu", "per-type"])
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    names = args.programs.split(",") if args.programs else None
    rows = run(names, args.target, args.stream_model)
    print(json.dumps(rows, indent=1) if args.json else markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
