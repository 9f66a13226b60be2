"""`hlopt schedule` and `hlopt bench-schedule`: schedule, simulate, compare heuristics."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hlopt.cli.common import (
    atomic_path,
    internal_error,
    is_collection,
    load_inputs,
    nonnegative_int,
    note_written,
    output_error,
    positive_int,
    report_failures,
    run_each,
    warn_deprecated,
    write_atomic,
)
from hlopt.cli.cost import (
    add_fail_fast_flag,
    add_lenient_flag,
    add_no_verify_flag,
    add_target_flag,
    resolve_target,
)

__all__ = ["add_schedule_parsers", "add_schedule_parser", "add_bench_schedule_parser", "schedule_module", "bench_rows", "parse_synthetic", "rolled_up_simulations"]

_JSON_FIELDS = ("heuristic", "makespan_us", "lower_bound_us", "basic_lower_bound_us", "exposed_comm_us",
                "total_comm_us", "overlap_fraction",
                "peak_memory_bytes", "schedule_seconds")


def _heuristic_help() -> str:
    """The names --heuristic takes and their +suffix forms."""
    from hlopt.scheduler.heuristics import HEURISTICS
    from hlopt.scheduler.latency_hiding_scheduler import ScheduleOptions

    return (f"NAME[+SUFFIX...]; names: {', '.join(sorted(HEURISTICS))}; suffixes: "
            f"{', '.join('+' + k for k in ScheduleOptions.SUFFIXES)} (+fill: fill exposed windows, +keep: keep a "
            "faster input order, +keepsync: keep XLA's is_sync marks, +alone: the heuristic's list schedule "
            "alone, +samepeak: fill within the list schedule's peak memory)")


def _heuristic_names() -> str:
    """NAME[+SUFFIX...] with the names and suffixes, for error messages."""
    from hlopt.scheduler.heuristics import HEURISTICS
    from hlopt.scheduler.latency_hiding_scheduler import ScheduleOptions

    return (f"NAME[+SUFFIX...] with NAME one of {', '.join(sorted(HEURISTICS))} and SUFFIX one of "
            f"{', '.join('+' + k for k in ScheduleOptions.SUFFIXES)}")


def _limits_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--estimator", default="analytical", choices=["analytical", "approximate"],
                   help="analytical GPU cost model, or XLA's unit-cost ApproximateLatencyEstimator")
    p.add_argument("--overlap-limit", type=positive_int, default=1,
                   help="collectives of one type in flight at once (at least 1)")
    p.add_argument("--memory-limit", type=nonnegative_int, default=0,
                   help="bytes; reschedule under pressure (0 = none)")
    p.add_argument("--no-async", action="store_true", help="do not convert sync collectives to start/done first")
    p.add_argument("--load", action="append", metavar="FILE.py", help="load user heuristics or passes")
    add_no_verify_flag(p)


def add_schedule_parsers(sub: argparse._SubParsersAction) -> None:
    """Register the `schedule` and `bench-schedule` verbs."""
    add_schedule_parser(sub)
    add_bench_schedule_parser(sub)


def add_schedule_parser(sub: argparse._SubParsersAction) -> None:
    """Register the `schedule` verb."""
    p = sub.add_parser("schedule", help="latency-hiding schedule a module and report the simulated result")
    p.add_argument("input", help="HLO file, '-' for stdin, an XLA dump directory, or synthetic:PATTERN:LAYERS[:RATIO]")
    p.add_argument("--heuristic", default="xla-default", help=_heuristic_help())
    add_target_flag(p)
    _limits_args(p)
    p.add_argument("--stream-model", default="xla-gpu", choices=["xla-gpu", "per-type"],
                   help="the device's async streams: XLA:GPU's (one collective stream, P2P and memcpy streams; "
                        "default) or one stream per collective type (XLA's generic AsyncTracker)")
    p.add_argument("-o", "--output", help="write the scheduled module (a directory for a dump directory)")
    p.add_argument("--trace", help="write a Perfetto/Chrome trace JSON (a directory for a dump directory)")
    p.add_argument("--plot", help="write a Gantt chart PNG (a directory for a dump directory)")
    p.add_argument("--computation", help="the computation to plot (default: the entry, with its callees' "
                                         "schedules rolled up into it)")
    p.add_argument("--all-computations", action="store_true",
                   help="list every scheduled computation, reducers and other trivial ones included")
    p.add_argument("--json", action="store_true")
    add_fail_fast_flag(p)
    add_lenient_flag(p)
    p.set_defaults(fn=cmd_schedule)


def add_bench_schedule_parser(sub: argparse._SubParsersAction) -> None:
    """Register the `bench-schedule` verb."""
    p = sub.add_parser("bench-schedule", help="every module x heuristic: makespan vs lower bound, memory, time")
    p.add_argument("inputs", nargs="+", help="HLO files, '-' for stdin, dump directories, or synthetic:PATTERN:LAYERS[:RATIO] "
                                             f"(PATTERN one of {', '.join(_patterns())})")
    p.add_argument("--heuristics", default="original-order,xla-default,start-delay,critical-path,memory-first",
                   help="comma-separated; each " + _heuristic_help())
    add_target_flag(p, several=True)
    p.add_argument("--devices", dest="deprecated_devices", default=None, help=argparse.SUPPRESS)
    _limits_args(p)
    p.add_argument("--csv", help="write the rows as CSV (row by row as they finish: an interrupted run keeps them)")
    p.add_argument("--plot", help="write a comparison plot PNG")
    p.add_argument("--workers", type=positive_int, default=1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_bench)


def _patterns() -> tuple[str, ...]:
    from hlopt.scheduler.synthetic import PATTERNS

    return PATTERNS


def parse_synthetic(source: str) -> tuple[str, int, float]:
    """`synthetic:PATTERN:LAYERS[:RATIO]` -> (pattern, layers, ratio); one clear line when malformed."""
    parts = source.split(":")
    usage = f"expected synthetic:PATTERN:LAYERS[:RATIO] with PATTERN one of {', '.join(_patterns())}"
    if len(parts) > 4:
        raise SystemExit(f"hlopt: {source!r}: too many fields; {usage}")
    pattern = parts[1] if len(parts) > 1 and parts[1] else "fsdp"
    if pattern not in _patterns():
        import difflib

        close = difflib.get_close_matches(pattern, _patterns(), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise SystemExit(f"hlopt: {source!r}: unknown synthetic pattern {pattern!r}{hint} ({usage})")
    try:
        layers = int(parts[2]) if len(parts) > 2 else 8
    except ValueError:
        raise SystemExit(f"hlopt: {source!r}: LAYERS {parts[2]!r} is not an integer ({usage})") from None
    try:
        ratio = float(parts[3]) if len(parts) > 3 else 1.0
    except ValueError:
        raise SystemExit(f"hlopt: {source!r}: RATIO {parts[3]!r} is not a number ({usage})") from None
    if layers < 1 or not ratio > 0:
        raise SystemExit(f"hlopt: {source!r}: LAYERS must be at least 1 and RATIO above 0 ({usage})")
    return pattern, layers, ratio


def _load_module(source: str, lenient: bool = False, verify: bool = True):
    """A synthetic module, or the one module of a file (verified unless `verify=False`)."""
    if source.startswith("synthetic:"):
        from hlopt.scheduler.synthetic import synthetic_module

        pattern, layers, ratio = parse_synthetic(source)
        return synthetic_module(layers, pattern, comm_ratio=ratio)
    from hlopt.cli.main import parse_and_verify

    name, text = load_inputs(source)[0]
    return parse_and_verify(name, text, argparse.Namespace(lenient=lenient, verify=verify))


def schedule_module(module, heuristic: str, device: str, estimator_name: str, overlap_limit: int,
                    memory_limit: int = 0, make_async: bool = True, stream_model: str = "xla-gpu") -> dict:
    """Schedule `module` in place on the device model `stream_model` (`scheduler.async_ops.STREAM_MODELS`);
    return the JSON summary (entry first, every computation under "computations")."""
    from hlopt.scheduler.async_ops import stream_model as streams

    with streams(stream_model):
        return _schedule_module(module, heuristic, device, estimator_name, overlap_limit, memory_limit, make_async,
                                stream_model)


def _schedule_module(module, heuristic: str, device: str, estimator_name: str, overlap_limit: int,
                     memory_limit: int, make_async: bool, stream_model: str) -> dict:
    from hlopt.passes.framework.pipeline import Pipeline
    from hlopt.scheduler.async_collective_creator import AsyncCollectiveCreator
    from hlopt.scheduler.costs import estimator_for
    from hlopt.scheduler.latency_hiding_scheduler import LatencyHidingScheduler, ScheduleOptions

    passes = [AsyncCollectiveCreator()] if make_async else []
    # NAME+fill: fill exposed windows; +keep: keep a faster input order; +keepsync: keep XLA's is_sync marks;
    # +alone: the list schedule alone; +samepeak: the default fill within the list schedule's peak
    base, options = ScheduleOptions.parse(heuristic)
    lhs = LatencyHidingScheduler(heuristic=base, estimator=estimator_name, device=device,
                                 overlap_limit=overlap_limit, memory_limit=memory_limit,
                                 fill_windows=options.fill_windows, keep_input_if_faster=options.keep_input_if_faster,
                                 redecide_sync=options.redecide_sync,
                                 alternative_heuristics=",".join(options.alternatives),
                                 fill_within_memory=options.fill_within_memory, fill_budget=options.fill_budget,
                                 stream_model=stream_model, forward_schedule=options.forward)
    Pipeline(passes, verify_each=False, check_changed=False).run(module)
    estimator = estimator_for(estimator_name, device)
    bound = module_bound(module, estimator)  # before the schedule: one figure for every heuristic
    start = time.perf_counter()
    lhs.run(module)
    seconds = time.perf_counter() - start
    sims = rolled_up_simulations(module, estimator, lhs.kind_limits(), set(lhs.results))
    entry = sims[module.entry.name]
    summary = {"heuristic": heuristic, **{k: v for k, v in entry.summary().items() if k in _JSON_FIELDS},
               "schedule_seconds": seconds, "device": device, "estimator": estimator_name,
               "stream_model": stream_model,
               "computations": {k: v.summary() for k, v in sims.items()},
               "executed_computations": [c.name for c in _executed(module) if c.name in sims],
               **bound}
    summary["_sims"] = sims
    return summary


MODULE_BOUND_DOC = ("module bound: the larger of the compute stream's work alone and the busiest communication "
                    "stream's work alone (loops times their trip counts), one figure per module and GPU, the same "
                    "for every heuristic")
"""What `module_bound_us` is, for tables and plots."""


def module_bound(module, estimator) -> dict:
    """One lower bound on the makespan of every schedule of `module` (its async pairs made): the compute
    stream's work alone (every instruction that is not an async start/done or control flow, callees run as
    often as control flow runs them: loop bodies times their trip counts; conditional branches not counted)
    and the busiest communication stream's work alone (each async collective's latency on its XLA:GPU
    stream, `async_ops.async_kind`), and the larger of the two. A collective that a schedule leaves with
    nothing between its start and its done is marked sync as XLA would and runs on the compute stream: a
    schedule may then beat the communication-alone figure, never the compute-alone one by it."""
    from hlopt.scheduler.async_ops import async_kind, done_of, is_async_done, is_async_start

    compute = 0.0
    comm: dict[str, float] = {}
    for comp, runs in _runs(module):
        for inst in comp.instructions:
            if inst.opcode in _CONTROL_FLOW or is_async_done(inst):
                continue
            if is_async_start(inst):
                done = done_of(inst)
                latency = float(estimator.latency(inst, done)) if done is not None else 0.0
                kind = async_kind(inst)
                comm[kind] = comm.get(kind, 0.0) + latency * runs
            else:
                compute += float(estimator.node_cost(inst)) * runs
    comm_alone = max(comm.values(), default=0.0)
    which = "compute" if compute >= comm_alone else "communication"
    return {"module_bound_us": max(compute, comm_alone), "module_bound_kind": which,
            "compute_alone_us": compute, "comm_alone_us": comm_alone}


def _runs(module) -> list[tuple[object, int]]:
    """(computation, runs per module run) of the entry, loop bodies and conditions and called computations
    (not conditional branches: which one runs is not known)."""
    from hlopt.cost_model.model import trip_count

    out: dict = {module.entry: 1}
    order = [module.entry]
    i = 0
    while i < len(order):
        comp = order[i]
        i += 1
        for inst in comp.instructions:
            if inst.opcode not in ("call", "while"):
                continue
            for callee in inst.called_computations:
                if callee is None:
                    continue
                n = out[comp]
                if inst.opcode == "while":
                    trips = trip_count(inst)
                    n *= trips + 1 if callee is inst.attrs.get("condition") else trips
                if callee not in out:
                    order.append(callee)
                    out[callee] = 0
                out[callee] += n
    return list(out.items())


_CONTROL_FLOW = ("call", "while", "conditional")


def _executed(module) -> list:
    """The entry and the computations control flow runs from it (calls, loops, branches), callers first."""
    out, seen, i = [module.entry], {module.entry}, 0
    while i < len(out):
        for inst in out[i].instructions:
            if inst.opcode in _CONTROL_FLOW:
                for callee in inst.called_computations:
                    if callee is not None and callee not in seen:
                        seen.add(callee)
                        out.append(callee)
        i += 1
    return out


class _RolledUpEstimator:
    """An estimator whose `call`, `while` and `conditional` cost their callees' simulated (scheduled) time:
    a call its callee's makespan, a loop trips x (body + condition) + condition, a conditional its slowest
    branch. Everything else is the base estimator's."""

    def __init__(self, base, sims: dict, trips):
        self.base, self.sims, self.trips = base, sims, trips

    def node_cost(self, inst) -> float:
        runs = self.callee_runs(inst)
        if not runs:
            return self.base.node_cost(inst)
        if inst.opcode == "conditional":
            return max(self.sims[c.name].makespan_us for c, _ in runs)
        return sum(self.sims[c.name].makespan_us * n for c, n in runs)

    def latency(self, start, done) -> float:
        return self.base.latency(start, done)

    def callee_runs(self, inst) -> list[tuple[object, float]]:
        """(callee, executions per execution of `inst`) for control flow whose callees were simulated."""
        if inst.opcode not in _CONTROL_FLOW:
            return []
        callees = [c for c in inst.called_computations if c is not None]
        if not callees or any(c.name not in self.sims for c in callees):
            return []
        if inst.opcode == "while":
            trips = self.trips(inst)
            cond = inst.attrs.get("condition")
            return [(c, trips + 1 if c is cond else trips) for c in callees]
        if inst.opcode == "conditional":
            return [(c, 1.0 / len(callees)) for c in callees]
        return [(c, 1) for c in callees]


def rolled_up_simulations(module, estimator, limits: dict, scheduled: set[str]) -> dict:
    """Simulate every scheduled computation, callees first, with each caller's control-flow instructions
    taking their callees' scheduled time; a caller's exposed and total communication include its callees'
    (times their runs), and a `call`'s bar in the caller's events is replaced by the callee's events."""
    from hlopt.cost_model.model import trip_count
    from hlopt.scheduler.simulator import simulate

    sims: dict = {}
    rolled = _RolledUpEstimator(estimator, sims, trip_count)
    for comp in _callees_first(module):
        if comp.name not in scheduled:
            continue
        sim = simulate(comp, rolled, limits=limits)
        _add_callees(sim, comp, rolled)
        sims[comp.name] = sim
    return sims


def _callees_first(module) -> list:
    """Every computation, each after the computations it calls."""
    order, seen = [], set()

    def visit(comp) -> None:
        if comp in seen:
            return
        seen.add(comp)
        for inst in comp.instructions:
            for callee in inst.called_computations:
                if callee is not None:
                    visit(callee)
        order.append(comp)

    for comp in module.computations:
        visit(comp)
    return order


def _add_callees(sim, comp, rolled: _RolledUpEstimator) -> None:
    """Fold the callees' communication into `sim`, and draw a called computation's events inside the call."""
    from dataclasses import replace

    exposed = total = inner_compute = 0.0
    events = []
    for inst in comp.instructions:
        for callee, runs in rolled.callee_runs(inst):
            c = rolled.sims[callee.name]
            exposed += c.exposed_comm_us * runs
            total += c.total_comm_us * runs
            inner_compute += (c.makespan_us - c.compute_us) * runs
    for e in sim.events:
        callee = _single_call(e, comp, rolled)
        if callee is None:
            events.append(e)
        else:
            events.extend(replace(x, start=x.start + e.start, end=x.end + e.start) for x in callee.events)
    if not total and events == sim.events:
        return
    sim.events = events
    sim.exposed_comm_us += exposed
    sim.total_comm_us += total
    sim.compute_us = max(sim.compute_us - inner_compute, 0.0)
    sim.overlap_fraction = ((sim.total_comm_us - sim.exposed_comm_us) / sim.total_comm_us
                            if sim.total_comm_us > 0 else 1.0)


def _single_call(event, comp, rolled: _RolledUpEstimator):
    """The simulated callee of a `call` whose bar `event` is, else None."""
    if event.opcode != "call":
        return None
    inst = comp.get(event.name) if hasattr(comp, "get") else None
    if inst is None:
        inst = next((i for i in comp.instructions if i.name == event.name), None)
    runs = rolled.callee_runs(inst) if inst is not None else []
    return rolled.sims[runs[0][0].name] if len(runs) == 1 else None


def cmd_schedule(args: argparse.Namespace) -> int:
    """Schedule one module (or each of a dump directory) and report."""
    _load(args.load)
    target = resolve_target(args)
    _check_targets([target])
    _check_heuristic(args.heuristic)
    if args.input.startswith("synthetic:"):
        inputs, collection = [(args.input, "")], False
    else:
        inputs, collection = load_inputs(args.input), is_collection(args.input)

    def work(name: str, text: str) -> dict:
        module = _load_module(name) if name.startswith("synthetic:") else _parse_for_schedule(name, text, args)
        try:
            summary = schedule_module(module, args.heuristic, target, args.estimator, args.overlap_limit,
                                      args.memory_limit, not args.no_async, args.stream_model)
        except Exception as e:  # the heuristic and the target were checked: this is the scheduler's fault
            if os.environ.get("HLOPT_TRACEBACK"):
                raise
            raise SystemExit(internal_error(e, module=name, pass_name="latency-hiding-scheduler")) from None
        sims = summary.pop("_sims")
        _write_outputs(args, module, sims, name, collection)
        if not args.json:
            _print_summary({"module": module.name, **summary}, args.all_computations)
        return {"file": name, **summary} if collection else summary

    outcomes = run_each(inputs, work, collection, args.fail_fast)
    status = report_failures(outcomes)
    if args.json:
        results = [o.result if o.ok else {"file": o.name, "error": o.error} for o in outcomes]
        print(json.dumps(results if collection else results[0], indent=2))
    return status


def _check_heuristic(spec: str) -> None:
    """One line naming the known heuristics and suffixes for a bad --heuristic."""
    from hlopt.scheduler.heuristics import get_heuristic
    from hlopt.scheduler.latency_hiding_scheduler import ScheduleOptions

    try:
        base, _ = ScheduleOptions.parse(spec)
        get_heuristic(base)
    except ValueError as e:
        raise SystemExit(f"hlopt: --heuristic {spec!r}: {e}; a heuristic is written {_heuristic_names()}") from None


def _parse_for_schedule(name: str, text: str, args: argparse.Namespace):
    from hlopt.cli.main import parse_and_verify

    return parse_and_verify(name, text, args)


def _output_path(flag: str, value: str, name: str, collection: bool, suffix: str) -> Path:
    """`value` itself, or `value/<module file stem><suffix>` for a dump directory."""
    return Path(value) / (Path(name).stem + suffix) if collection else Path(value)


def _write_outputs(args: argparse.Namespace, module, sims: dict, name: str, collection: bool) -> None:
    from hlopt.scheduler.report import write_gantt, write_trace

    if args.output:
        write_atomic(_output_path("-o", args.output, name, collection, Path(name).suffix or ".hlo"), module.to_text())
    if args.trace:
        path = _output_path("--trace", args.trace, name, collection, ".trace.json")
        atomic_path(path, lambda tmp: write_trace(list(sims.values()), tmp))
    if args.plot:
        chosen = args.computation or module.entry.name
        if chosen not in sims:
            known = ", ".join(sorted(sims))
            raise SystemExit(f"hlopt: --computation {chosen!r}: no scheduled computation of that name in "
                             f"{module.name} (scheduled: {known})")
        path = _output_path("--plot", args.plot, name, collection, ".png")
        atomic_path(path, lambda tmp: write_gantt(sims[chosen], tmp))


def _print_summary(summary: dict, all_computations: bool = False) -> None:
    from hlopt.cli.console import table_console
    from rich.table import Table

    executed = summary.get("executed_computations") or list(summary["computations"])
    shown = list(summary["computations"]) if all_computations else executed
    hidden = len(summary["computations"]) - len(shown)
    caption = (f"{hidden} trivial computation(s) (reducers, fused or called only by collectives) hidden; "
               "--all-computations lists them" if hidden else None)
    table = Table("computation", "makespan us", "lower bound us", "exposed comm us", "overlap", "peak MiB",
                  title=f"{summary.get('module', '')}: heuristic {summary['heuristic']} on {summary['device']} ({summary['estimator']}), "
                        f"scheduled in {summary['schedule_seconds']:.3f} s; callees rolled up into callers",
                  caption=caption)
    for name in shown:
        c = summary["computations"][name]
        table.add_row(name, f"{c['makespan_us']:.2f}", f"{c['lower_bound_us']:.2f}", f"{c['exposed_comm_us']:.2f}",
                      overlap_cell(c), f"{c['peak_memory_bytes'] / 2**20:.2f}")
    table_console().print(table)


def overlap_cell(figures: dict) -> str:
    """The overlap column: a percentage (never `-0%`), or "no comm" where there is no communication to
    overlap (the JSON keeps `overlap_fraction` 1.0 there)."""
    from hlopt.scheduler.report import format_overlap

    if figures.get("total_comm_us", 1.0) <= 0:
        return "no comm"
    return format_overlap(figures["overlap_fraction"])


def _load(files: list[str] | None) -> None:
    from hlopt.cli.main import _load_plugins

    _load_plugins(files)


def _expand_inputs(inputs: list[str]) -> list[str]:
    """Files of the inputs (a directory's HLO modules); synthetic specs are checked here, files must exist."""
    from hlopt.cli.common import _looks_like_hlo

    out = []
    for source in inputs:
        p = Path(source)
        if source.startswith("synthetic:"):
            parse_synthetic(source)
            out.append(source)
        elif source == "-":
            out.append(_stdin_to_file())
        elif p.is_dir():
            files = [str(f) for f in sorted(p.iterdir()) if f.suffix in (".txt", ".hlo") and _looks_like_hlo(f)]
            if not files:
                raise SystemExit(f"hlopt: no HLO modules (.txt/.hlo files starting with 'HloModule') in directory {p}")
            out.extend(files)
        elif not p.is_file():
            raise SystemExit(f"hlopt: no such file: {source} (bench-schedule takes files, '-', dump directories "
                             "and synthetic:PATTERN:LAYERS[:RATIO])")
        else:
            out.append(source)
    return out


def _stdin_to_file() -> str:
    """Save the module on stdin as `stdin.hlo` in a fresh temporary directory (workers read files)."""
    import tempfile

    (_, text), = load_inputs("-")
    path = Path(tempfile.mkdtemp(prefix="hlopt-stdin-")) / "stdin.hlo"
    path.write_text(text)
    return str(path)


def _bench_one(job: tuple) -> dict:
    source, heuristic, device, estimator, limit, memory_limit, make_async, loads, verify = job
    _load(loads)
    module = _load_module(source, verify=verify)
    summary = schedule_module(module, heuristic, device, estimator, limit, memory_limit, make_async)
    summary.pop("_sims")
    row = {"module": Path(source).name if not source.startswith("synthetic:") else source,
           "instructions": module.instruction_count(), **{k: summary[k] for k in _JSON_FIELDS}, "device": device}
    row["makespan_over_bound"] = row["makespan_us"] / row["lower_bound_us"] if row["lower_bound_us"] else 0.0
    row["makespan_over_basic_bound"] = (row["makespan_us"] / row["basic_lower_bound_us"]
                                        if row["basic_lower_bound_us"] else 0.0)
    for key in ("module_bound_us", "module_bound_kind", "compute_alone_us", "comm_alone_us"):
        row[key] = summary[key]
    row["makespan_over_module_bound"] = (row["makespan_us"] / row["module_bound_us"]
                                         if row["module_bound_us"] else 0.0)
    return row


def bench_rows(inputs: list[str], heuristics: list[str], devices: list[str], estimator: str, limit: int,
               memory_limit: int = 0, make_async: bool = True, workers: int = 1, loads=None,
               progress: bool = True, verify: bool = True, on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Schedule and simulate every input x heuristic x device (file modules verified unless `verify=False`);
    `on_row(row)` is called as each row is done, in order."""
    jobs = [(s, h, d, estimator, limit, memory_limit, make_async, loads, verify)
            for s in _expand_inputs(inputs) for d in devices for h in heuristics]
    from rich.progress import Progress

    rows: list[dict] = []
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("scheduling", total=len(jobs))
        if workers > 1:
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(workers) as pool:
                for row in pool.map(_bench_one, jobs):
                    _add_row(rows, row, on_row)
                    bar.advance(task)
        else:
            for job in jobs:
                _add_row(rows, _bench_one(job), on_row)
                bar.advance(task)
    return rows


def _add_row(rows: list[dict], row: dict, on_row: Callable[[dict], None] | None) -> None:
    rows.append(row)
    if on_row is not None:
        on_row(row)


class _CsvRows:
    """`bench-schedule --csv`: the CSV written as rows finish (header with the first), flushed row by row, so
    that an interrupted run keeps the rows it finished."""

    def __init__(self, path: str):
        self.path = Path(path)
        if self.path.is_dir():
            raise SystemExit(f"hlopt: cannot write {path}: is a directory")
        self.file = None
        self.writer: csv.DictWriter | None = None

    def add(self, row: dict) -> None:
        """Write one row (opening the file and writing the header first)."""
        try:
            if self.writer is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.file = self.path.open("w", newline="")
                self.writer = csv.DictWriter(self.file, fieldnames=list(row))
                self.writer.writeheader()
                note_written(self.path)
            self.writer.writerow(row)
            self.file.flush()
        except OSError as e:
            raise output_error(self.path, e) from None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _bound_caption(rows: list[dict]) -> str:
    """What '/ module bound' divides by: the definition, then each module's bound and which side sets it."""
    bounds = {}
    for r in rows:
        bounds.setdefault((r["module"], r["device"]), r)
    lines = [f"/ module bound: makespan over the {MODULE_BOUND_DOC}; / schedule's bound: over the simulator's "
             "bound for that schedule's own graph (the heuristic's sync marks and callee schedules included)"]
    for (module, device), r in bounds.items():
        lines.append(f"{module} on {device}: module bound {r['module_bound_us']:.1f} us = {r['module_bound_kind']} "
                     f"alone (compute {r['compute_alone_us']:.1f} us, communication {r['comm_alone_us']:.1f} us)")
    return "\n".join(lines)


def _check_targets(targets: list[str]) -> None:
    """One line for an unknown GPU model."""
    from hlopt.cost_model.devices import get_device

    for t in targets:
        try:
            get_device(t)
        except (ValueError, OSError) as e:
            raise SystemExit(f"hlopt: --target {t!r}: {e}") from None


def cmd_bench(args: argparse.Namespace) -> int:
    """Compare heuristics on many modules."""
    _load(args.load)
    if args.deprecated_devices is not None and not args.target:
        warn_deprecated(args, "deprecated_devices", "target", "bench-schedule --devices (GPU models)",
                        "--target (or --gpu); --devices counts CPU devices elsewhere")
    targets = [t for t in (args.target or "h100").split(",") if t]
    _check_targets(targets)
    heuristics = [h for h in args.heuristics.split(",") if h]
    for h in heuristics:
        _check_heuristic(h)
    if args.plot and Path(args.plot).is_dir():
        raise SystemExit(f"hlopt: cannot write {args.plot}: is a directory")
    csv_rows = _CsvRows(args.csv) if args.csv else None
    try:
        rows = bench_rows(args.inputs, heuristics, targets, args.estimator,
                          args.overlap_limit, args.memory_limit, not args.no_async, args.workers, args.load,
                          progress=sys.stderr.isatty(), verify=args.verify,
                          on_row=csv_rows.add if csv_rows else None)
    finally:
        if csv_rows is not None:
            csv_rows.close()
    if args.plot:
        from hlopt.scheduler.report import write_comparison_plot

        atomic_path(args.plot, lambda tmp: write_comparison_plot(rows, tmp))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from hlopt.cli.console import table_console
    from rich.table import Table

    table = Table("module", "device", "heuristic", "makespan us", "/ module bound", "/ schedule's bound",
                  "exposed comm us", "overlap", "peak MiB", "sched s", caption=_bound_caption(rows),
                  caption_justify="left")
    for r in rows:
        table.add_row(r["module"], r["device"], r["heuristic"], f"{r['makespan_us']:.1f}",
                      f"{r['makespan_over_module_bound']:.3f}", f"{r['makespan_over_bound']:.3f}",
                      f"{r['exposed_comm_us']:.1f}", overlap_cell(r),
                      f"{r['peak_memory_bytes'] / 2**20:.1f}", f"{r['schedule_seconds']:.3f}")
    table_console().print(table)
    return 0
