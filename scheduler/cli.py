"""`hlopt schedule` and `hlopt bench-schedule`: schedule, simulate, compare heuristics."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

__all__ = ["add_schedule_parsers", "schedule_module", "bench_rows"]

_JSON_FIELDS = ("heuristic", "makespan_us", "lower_bound_us", "basic_lower_bound_us", "exposed_comm_us",
                "overlap_fraction",
                "peak_memory_bytes", "schedule_seconds")


def _limits_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="h100", help="device of the cost model (h100, h200, b200, a100)")
    p.add_argument("--estimator", default="analytical", choices=["analytical", "approximate"],
                   help="analytical GPU cost model, or XLA's unit-cost ApproximateLatencyEstimator")
    p.add_argument("--overlap-limit", type=int, default=1, help="collectives of one type in flight at once")
    p.add_argument("--memory-limit", type=int, default=0, help="bytes; reschedule under pressure (0 = none)")
    p.add_argument("--no-async", action="store_true", help="do not convert sync collectives to start/done first")
    p.add_argument("--load", action="append", metavar="FILE.py", help="load user heuristics or passes")


def add_schedule_parsers(sub: argparse._SubParsersAction) -> None:
    """Register the `schedule` and `bench-schedule` verbs."""
    p = sub.add_parser("schedule", help="latency-hiding schedule a module and report the simulated result")
    p.add_argument("input")
    p.add_argument("--heuristic", default="xla-default")
    _limits_args(p)
    p.add_argument("-o", "--output", help="write the scheduled module")
    p.add_argument("--trace", help="write a Perfetto/Chrome trace JSON")
    p.add_argument("--plot", help="write a Gantt chart PNG of the entry computation")
    p.add_argument("--json", action="store_true")
    from hlopt.cli.main import add_lenient_flag

    add_lenient_flag(p)
    p.set_defaults(fn=cmd_schedule)

    p = sub.add_parser("bench-schedule", help="every module x heuristic: makespan vs lower bound, memory, time")
    p.add_argument("inputs", nargs="+", help="HLO files, dump directories, or synthetic:PATTERN:LAYERS[:RATIO]")
    p.add_argument("--heuristics", default="original-order,xla-default,start-delay,critical-path,memory-first",
                   help="comma-separated; suffixes +fill (fill exposed windows), +keep (keep a faster input order), "
                        "+keepsync (keep XLA's is_sync marks instead of re-deciding them), "
                        "+alone (the heuristic's list schedule alone: no alternative heuristics, no memory-neutral fill)")
    p.add_argument("--devices", default="h100", help="comma-separated devices of the cost model")
    _limits_args(p)
    p.add_argument("--csv", help="write the rows as CSV")
    p.add_argument("--plot", help="write a comparison plot PNG")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_bench)


def _load_module(source: str, lenient: bool = False):
    from hlopt import hlo

    if source.startswith("synthetic:"):
        from hlopt.scheduler.synthetic import synthetic_module

        parts = source.split(":")
        pattern = parts[1] if len(parts) > 1 else "fsdp"
        layers = int(parts[2]) if len(parts) > 2 else 8
        ratio = float(parts[3]) if len(parts) > 3 else 1.0
        return synthetic_module(layers, pattern, comm_ratio=ratio)
    return hlo.parse_file(source, lenient=lenient)


def schedule_module(module, heuristic: str, device: str, estimator_name: str, overlap_limit: int,
                    memory_limit: int = 0, make_async: bool = True) -> dict:
    """Schedule `module` in place; return the JSON summary (entry first, every computation under "computations")."""
    from hlopt.passes.pipeline import Pipeline
    from hlopt.scheduler.async_collective_creator import AsyncCollectiveCreator
    from hlopt.scheduler.costs import estimator_for
    from hlopt.scheduler.latency_hiding_scheduler import LatencyHidingScheduler, ScheduleOptions
    from hlopt.scheduler.simulator import simulate

    passes = [AsyncCollectiveCreator()] if make_async else []
    # NAME+fill: fill exposed windows; +keep: keep a faster input order; +keepsync: keep XLA's is_sync marks;
    # +alone: the list schedule alone; +samepeak: the default fill within the list schedule's peak
    base, options = ScheduleOptions.parse(heuristic)
    lhs = LatencyHidingScheduler(heuristic=base, estimator=estimator_name, device=device,
                                 overlap_limit=overlap_limit, memory_limit=memory_limit,
                                 fill_windows=options.fill_windows, keep_input_if_faster=options.keep_input_if_faster,
                                 redecide_sync=options.redecide_sync,
                                 alternative_heuristics=",".join(options.alternatives),
                                 fill_within_memory=options.fill_within_memory, fill_budget=options.fill_budget)
    Pipeline(passes, verify_each=False, check_changed=False).run(module)
    start = time.perf_counter()
    lhs.run(module)
    seconds = time.perf_counter() - start
    estimator = estimator_for(estimator_name, device)
    limits = lhs.kind_limits()
    sims = {c.name: simulate(c, estimator, limits=limits) for c in module.computations if c.name in lhs.results}
    entry = sims[module.entry.name]
    summary = {"heuristic": heuristic, **{k: v for k, v in entry.summary().items() if k in _JSON_FIELDS},
               "schedule_seconds": seconds, "device": device, "estimator": estimator_name,
               "computations": {k: v.summary() for k, v in sims.items()}}
    summary["_sims"] = sims
    return summary


def cmd_schedule(args: argparse.Namespace) -> int:
    """Schedule one module and report."""
    _load(args.load)
    try:
        module = _load_module(args.input, getattr(args, "lenient", False))
    except Exception as e:  # noqa: BLE001 - parse errors are reported plainly
        raise SystemExit(f"hlopt: {e}") from None
    try:
        summary = schedule_module(module, args.heuristic, args.device, args.estimator, args.overlap_limit,
                                  args.memory_limit, not args.no_async)
    except ValueError as e:  # an unknown heuristic or option
        raise SystemExit(f"hlopt: {e}") from None
    sims = summary.pop("_sims")
    if args.output:
        Path(args.output).write_text(module.to_text())
    if args.trace:
        from hlopt.scheduler.report import write_trace

        write_trace(list(sims.values()), args.trace)
    if args.plot:
        from hlopt.scheduler.report import write_gantt

        write_gantt(sims[module.entry.name], args.plot)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary)
    return 0


def _print_summary(summary: dict) -> None:
    from hlopt.cli.console import table_console
    from rich.table import Table

    table = Table("computation", "makespan us", "lower bound us", "exposed comm us", "overlap", "peak MiB",
                  title=f"heuristic {summary['heuristic']} on {summary['device']} ({summary['estimator']}), "
                        f"scheduled in {summary['schedule_seconds']:.3f} s")
    for name, c in summary["computations"].items():
        table.add_row(name, f"{c['makespan_us']:.2f}", f"{c['lower_bound_us']:.2f}", f"{c['exposed_comm_us']:.2f}",
                      f"{c['overlap_fraction']:.0%}", f"{c['peak_memory_bytes'] / 2**20:.2f}")
    table_console().print(table)


def _load(files: list[str] | None) -> None:
    from hlopt.passes.registry import load_plugin_file

    for f in files or []:
        load_plugin_file(f)


def _expand_inputs(inputs: list[str]) -> list[str]:
    out = []
    for source in inputs:
        p = Path(source)
        if p.is_dir():
            out.extend(str(f) for f in sorted(p.iterdir()) if f.suffix in (".txt", ".hlo")
                       and f.read_text(errors="ignore").lstrip().startswith("HloModule"))
        else:
            out.append(source)
    return out


def _bench_one(job: tuple) -> dict:
    source, heuristic, device, estimator, limit, memory_limit, make_async, loads = job
    _load(loads)
    module = _load_module(source)
    summary = schedule_module(module, heuristic, device, estimator, limit, memory_limit, make_async)
    summary.pop("_sims")
    row = {"module": Path(source).name if not source.startswith("synthetic:") else source,
           "instructions": module.instruction_count(), **{k: summary[k] for k in _JSON_FIELDS}, "device": device}
    row["makespan_over_bound"] = row["makespan_us"] / row["lower_bound_us"] if row["lower_bound_us"] else 0.0
    row["makespan_over_basic_bound"] = (row["makespan_us"] / row["basic_lower_bound_us"]
                                        if row["basic_lower_bound_us"] else 0.0)
    return row


def bench_rows(inputs: list[str], heuristics: list[str], devices: list[str], estimator: str, limit: int,
               memory_limit: int = 0, make_async: bool = True, workers: int = 1, loads=None,
               progress: bool = True) -> list[dict]:
    """Schedule and simulate every input x heuristic x device."""
    jobs = [(s, h, d, estimator, limit, memory_limit, make_async, loads)
            for s in _expand_inputs(inputs) for d in devices for h in heuristics]
    from rich.progress import Progress

    rows: list[dict] = []
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("scheduling", total=len(jobs))
        if workers > 1:
            with ProcessPoolExecutor(workers) as pool:
                for row in pool.map(_bench_one, jobs):
                    rows.append(row)
                    bar.advance(task)
        else:
            for job in jobs:
                rows.append(_bench_one(job))
                bar.advance(task)
    return rows


def cmd_bench(args: argparse.Namespace) -> int:
    """Compare heuristics on many modules."""
    _load(args.load)
    rows = bench_rows(args.inputs, args.heuristics.split(","), args.devices.split(","), args.estimator,
                      args.overlap_limit, args.memory_limit, not args.no_async, args.workers, args.load,
                      progress=sys.stderr.isatty())
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if args.plot:
        from hlopt.scheduler.report import write_comparison_plot

        write_comparison_plot(rows, args.plot)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from hlopt.cli.console import table_console
    from rich.table import Table

    table = Table("module", "device", "heuristic", "makespan us", "/ bound", "/ basic bound",
                  "exposed comm us", "overlap", "peak MiB", "sched s")
    for r in rows:
        table.add_row(r["module"], r["device"], r["heuristic"], f"{r['makespan_us']:.1f}",
                      f"{r['makespan_over_bound']:.3f}", f"{r['makespan_over_basic_bound']:.3f}",
                      f"{r['exposed_comm_us']:.1f}", f"{r['overlap_fraction']:.0%}",
                      f"{r['peak_memory_bytes'] / 2**20:.1f}", f"{r['schedule_seconds']:.3f}")
    table_console().print(table)
    return 0
