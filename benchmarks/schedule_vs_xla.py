"""Our latency-hiding scheduler against XLA:GPU's own schedule, measured on XLA:GPU's final modules.

For each multi-device program (data-parallel shard_map training steps on 8 devices, an FSDP MLP, and the
corpus's 8-device programs): XLA:GPU compiles the unoptimized module deviceless for an H100 through
hlopt's own driver (`runtime.xla_gpu_path.xla_gpu.run_driver`, 8 devices); its final module (the one its executable
runs) gives `XLA order`. Every computation that holds collectives (the entry, while bodies) is simulated
on XLA:GPU's stream model (`scheduler.async_ops`: one collective stream) in XLA's own order; then:

- `NAME` rows: the same module re-scheduled by our latency-hiding-scheduler with heuristic NAME and
  simulated again with the same simulator, estimates and overlap limit;
- `NAME@exe` rows: the executable path of `hlopt compile --target h100` (`runtime.xla_gpu_path.reemit.compile_for_gpu`:
  XLA's passes without its fusion and scheduler, our fusion and our scheduler with heuristic NAME, XLA's
  backend only); the final module of that executable is simulated the same way (its fusions are ours, so
  its lower bound is its own). Its loops may differ from XLA's: where `hlopt compile` kept XLA's double-buffer
  unrolling, a loop body holds two iterations and runs half the trips, so its per-execution figures are not
  comparable to XLA's order; the whole program with trip counts applied (report.json's `modeled_us`, ours and
  XLA's default compile's) follows the table for each `@exe` row.

Reported per program: makespan, the program's lower bound (`program_bounds`: valid for every order,
computed with XLA's `is_sync` marks cleared), its ratio to the basic bound, exposed and total communication
(summed over the computations with collectives; figures are per execution of each computation, a while
body's trips are not applied).

XLA marks the async pairs its schedule left with nothing to overlap `is_sync`; the simulator runs those on
the compute stream. Our scheduler re-decides the marks by default (clears them, schedules, re-marks the
pairs left adjacent, as XLA's post-scheduling pass does); `NAME+keepsync` keeps XLA's marks (a marked pair
is then two ordinary instructions). `+fill` and `+keep` are the scheduler's other options
(`ScheduleOptions`).

Estimators: `xla` (default) is `runtime.xla_gpu_path.xla_gpu.XlaEstimateLatency`: each fusion's time from XLA's own
estimate in the final module's backend_config (the indexing cost model's for block-level `__triton`
fusions, whose default estimate is unusable), each collective's from XLA's `sol` estimate, plus the launch
overhead; our analytical model where XLA gives none. `analytical` is our cost model alone.

    python3 benchmarks/schedule_vs_xla.py [--programs a,b] [--heuristics xla-default,start-delay+keepsync]
                                          [--exe xla-default] [--estimator xla|analytical] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HEURISTICS = "xla-default,start-delay,start-delay+fill,start-delay+fill+keep,xla-default+alone,xla-default+keepsync"
#: Heuristics measured through the executable path (`NAME@exe` rows).
EXE_HEURISTICS = "xla-default"


def _has_collectives(comp) -> bool:
    from hlopt.hlo.opcodes import COLLECTIVES
    from hlopt.scheduler.async_ops import is_async_start

    return any(i.opcode in COLLECTIVES or is_async_start(i) for i in comp.instructions)


def program_bounds(module, estimator, limits: dict[str, int]) -> dict[str, tuple[float, float]]:
    """(lower bound, basic lower bound) per computation with collectives, with XLA's `is_sync` marks
    cleared: a mark only makes an order slower (the collective then also holds the compute stream), so
    the bound of the unmarked program holds for every order under any marks, XLA's included."""
    from hlopt.passes.framework.base import non_fusion_computations
    from hlopt.scheduler.simulator import simulate
    from hlopt.scheduler.sync_marks import clear_sync_marks

    out = {}
    for comp in non_fusion_computations(module):
        if _has_collectives(comp):
            clear_sync_marks(comp)
            s = simulate(comp, estimator, limits=limits)
            out[comp.name] = (s.lower_bound_us, s.basic_lower_bound_us)
    return out


def evaluate(text: str, estimator, heuristics: list[str], overlap_limit: int = 1) -> dict:
    """Simulate XLA's order of the scheduled module `text`, then ours per heuristic, same simulator.

    A heuristic named `NAME+keep` is NAME with `keep_faster`: per computation, XLA's order is kept where
    it simulates faster than ours; `NAME+fill` adds the `fill_exposed_windows` post-pass. Returns {"xla": figures, heuristic: figures, ...}; figures sum makespan,
    lower bound and exposed
    communication over the computations holding collectives, with `computations` per name."""
    from hlopt.passes.framework.base import non_fusion_computations
    from hlopt.scheduler.heuristics import get_heuristic
    from hlopt.scheduler.latency_hiding_scheduler import (
        ScheduleOptions,
        _limits,
        finish_computation,
        schedule_with_options,
    )
    from hlopt.scheduler.simulator import simulate

    from hlopt import hlo

    limits = _limits(overlap_limit, {})

    def figures(module) -> dict:
        comps = {c.name: simulate(c, estimator, limits=limits) for c in non_fusion_computations(module)
                 if _has_collectives(c)}
        for c in bounds:  # the program's bound, the same for every schedule (sync marks are decisions)
            comps[c].lower_bound_us, comps[c].basic_lower_bound_us = bounds[c]
            comps[c].release_tail_bound_us = bounds[c][0]
        return {"makespan_us": sum(s.makespan_us for s in comps.values()),
                "lower_bound_us": sum(s.lower_bound_us for s in comps.values()),
                "basic_lower_bound_us": sum(s.basic_lower_bound_us for s in comps.values()),
                "exposed_comm_us": sum(s.exposed_comm_us for s in comps.values()),
                "total_comm_us": sum(s.total_comm_us for s in comps.values()),
                "computations": {k: {f: v for f, v in s.summary().items() if f != "computation"}
                                 for k, s in comps.items()}}

    bounds = program_bounds(hlo.parse(text), estimator, limits)
    out = {"xla": figures(hlo.parse(text))}
    for name in heuristics:
        module = hlo.parse(text)
        base, options = ScheduleOptions.parse(name)
        heuristic = get_heuristic(base)
        for comp in non_fusion_computations(module):
            if _has_collectives(comp):
                result = schedule_with_options(comp, estimator, heuristic, limits, options)
                finish_computation(comp, result, options)
        out[name] = figures(module)
    return out


def xla_scheduled(text: str, devices: int = 8, target: str = "h100") -> str:
    """XLA:GPU's final module (the module its executable runs) for the unoptimized `text`, through hlopt's
    driver."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import run_driver

    return run_driver(text, target, devices).final_text


def executable_module(text: str, heuristic: str, devices: int = 8, target: str = "h100") -> str:
    """The final module of the executable `hlopt compile --target` builds for `text` with our scheduler's
    heuristic `heuristic` (`runtime.xla_gpu_path.reemit.compile_for_gpu`)."""
    return executable_compile(text, heuristic, devices, target).final_text


def executable_compile(text: str, heuristic: str, devices: int = 8, target: str = "h100"):
    """`compile_for_gpu`'s result for `text` with our scheduler's heuristic `heuristic` (its report has the whole
    program's modeled time, ours and XLA's default compile's, trip counts applied)."""
    from hlopt.runtime.xla_gpu_path.reemit import AFTER_XLA, compile_for_gpu

    after = AFTER_XLA.replace("latency-hiding-scheduler", f"latency-hiding-scheduler{{heuristic={heuristic}}}")
    return compile_for_gpu(text, target, devices, after=after)


def estimator_of(text: str, name: str, device: str = "h100"):
    """`xla` (XLA's own estimates in the module, `XlaEstimateLatency`) or `analytical` for a final module."""
    from hlopt.cost_model.devices import get_device
    from hlopt.runtime.xla_gpu_path.xla_gpu import XlaEstimateLatency
    from hlopt.scheduler.costs import estimator_for

    if name == "analytical":
        return estimator_for("analytical", device)
    from hlopt import hlo

    module = hlo.parse(text)
    devices = int(module.config.get("replica_count", 1)) * int(module.config.get("num_partitions", 1))
    return XlaEstimateLatency(device, float(get_device(device).kernel_launch_us), devices)


def executable_figures(text: str, estimator, overlap_limit: int = 1) -> dict:
    """`evaluate`'s figures of one final module in its own order (its own bounds)."""
    return evaluate(text, estimator, [], overlap_limit)["xla"]


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "-"


def _row_cells(row: dict, sched: str) -> list[str]:
    """One table row: a program's figures under one schedule."""
    f, xla = row[sched], row["xla"]["makespan_us"]
    return [row["program"], "XLA order" if sched == "xla" else sched, f"{f['makespan_us']:.1f}",
            f"{f['lower_bound_us']:.1f}", _ratio(f["makespan_us"], f["lower_bound_us"]),
            _ratio(f["makespan_us"], f["basic_lower_bound_us"]), f"{f['exposed_comm_us']:.1f}",
            f"{f['total_comm_us']:.1f}", _ratio(f["makespan_us"], xla)]


def main(argv: list[str] | None = None) -> int:
    """Compare the schedules and print a table (or JSON)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--programs", help="comma-separated program names")
    p.add_argument("--heuristics", default=HEURISTICS)
    p.add_argument("--exe", default=EXE_HEURISTICS, help="heuristics measured on executables ('' = none)")
    p.add_argument("--estimator", default="xla", choices=["xla", "analytical"])
    p.add_argument("--device", default="h100")
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = p.parse_args(argv)
    from hlopt.runtime.xla_gpu_path.xla_gpu import INSTALL_COMMAND, available

    if not available():
        raise SystemExit(f"needs the XLA:GPU compiler ({INSTALL_COMMAND})")
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    heuristics = [h for h in args.heuristics.split(",") if h]
    exe = [h for h in args.exe.split(",") if h]
    rows = []
    from hlopt.corpus.training_steps import eight_device_steps

    for name, text in eight_device_steps(args.programs.split(",") if args.programs else None):
        try:
            optimized = xla_scheduled(text, target=args.device)
        except RuntimeError as e:
            print(f"{name}: {str(e).splitlines()[-1]}", file=sys.stderr)
            continue
        row = {"program": name, **evaluate(optimized, estimator_of(optimized, args.estimator, args.device),
                                           heuristics)}
        for h in exe:
            try:
                compiled = executable_compile(text, h, target=args.device)
            except Exception as e:
                print(f"{name} {h}@exe: {type(e).__name__}: {str(e).splitlines()[-1]}", file=sys.stderr)
                continue
            final = compiled.final_text
            row[f"{h}@exe"] = {**executable_figures(final, estimator_of(final, args.estimator, args.device)),
                               "program_us": compiled.report["ours"]["modeled_us"],
                               "xla_default_program_us": compiled.report["xla_default"]["modeled_us"]}
        rows.append(row)
        print(f"{name}: done", file=sys.stderr, flush=True)
    heuristics = heuristics + [f"{h}@exe" for h in exe]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if args.markdown:
        print("| program | schedule | makespan us | lower bound us | / bound | / basic bound | exposed comm us "
              "| total comm us | vs XLA |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            for sched in ["xla", *heuristics]:
                if sched in r:
                    print("| " + " | ".join(_row_cells(r, sched)) + " |")
        _print_programs(rows, exe)
        return 0
    from hlopt.cli.console import table_console
    from rich.table import Table

    table = Table("program", "schedule", "makespan us", "lower bound us", "/ bound", "/ basic bound",
                  "exposed comm us", "total comm us", "vs XLA",
                  title=f"schedules simulated with the {args.estimator} estimator (computations with collectives)")
    for r in rows:
        for sched in ["xla", *heuristics]:
            if sched in r:
                table.add_row(*_row_cells(r, sched))
    table_console().print(table)
    _print_programs(rows, exe)
    return 0


def _print_programs(rows: list[dict], exe: list[str]) -> None:
    """The `@exe` rows' whole programs, trip counts applied (report.json's figures), against XLA's default."""
    lines = [(r["program"], h, r[f"{h}@exe"]) for r in rows for h in exe if f"{h}@exe" in r]
    if not lines:
        return
    print("\n| program | executable | whole program us (trip counts applied) | XLA:GPU default us | ratio |")
    print("|---|---|---:|---:|---:|")
    for program, h, f in lines:
        print(f"| {program} | {h}@exe | {f['program_us']:.1f} | {f['xla_default_program_us']:.1f} | "
              f"{_ratio(f['program_us'], f['xla_default_program_us'])} |")


if __name__ == "__main__":
    raise SystemExit(main())
