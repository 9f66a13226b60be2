"""Our latency-hiding scheduler against XLA:GPU's own schedule, both run through our simulator.

For each multi-device program (data-parallel shard_map training steps on 8 devices, and the corpus's
shard_map programs): XLA:GPU compiles the unoptimized module deviceless for an H100
(../shared/tools/xla_gpu_compile.py --devices 8) and we read its scheduled optimized module. Every
computation that holds collectives (the entry, while bodies) is simulated in XLA's own instruction order;
then the same module is re-scheduled by our latency-hiding-scheduler with each heuristic and simulated
again with the same simulator, cost estimator and overlap limits. Reported per program: makespan, the
program's lower bound (`program_bounds`: valid for every order, computed with XLA's `is_sync` marks
cleared), its ratio to the basic bound, exposed and total communication (summed over the computations
with collectives; figures are per execution of each computation, a while body's trips are not applied).

XLA marks the async pairs its schedule left with nothing to overlap `is_sync`; the simulator runs those on
the compute stream. Our scheduler re-decides the marks by default (clears them, schedules, re-marks the
pairs left adjacent, as XLA's post-scheduling pass does); `NAME+keepsync` keeps XLA's marks (a marked pair
is then two ordinary instructions). `+fill` and `+keep` are the scheduler's other options
(`ScheduleOptions`).

Estimators: `xla` (default) takes each fusion's time from XLA's own per-fusion estimate and each
collective's from XLA's collective estimate, both from the tool's report, falling back to our analytical
model for the rest (custom calls, copies); for block-level `__triton` fusions XLA's `default` estimate is
unusable (hundreds of seconds), so their `indexing-cost-model` estimate is taken, as in
fusion_vs_xla.py. `analytical` is our cost model alone (it rates block-level Triton fusions by their
tiles, `cost_model/tiles.py`, within about 1% of XLA's indexing cost model on these programs).

    python3 benchmarks/schedule_vs_xla.py [--programs a,b] [--heuristics xla-default,start-delay+keepsync]
                                          [--estimator xla|analytical] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.xla_gpu import PYTHON, TOOL, available  # noqa: E402

HEURISTICS = "xla-default,start-delay,start-delay+fill,start-delay+fill+keep,xla-default+alone,xla-default+keepsync"


class XlaReportEstimator:
    """Node costs from XLA's own per-fusion / per-collective estimates, else from `fallback`."""

    def __init__(self, report: dict, fallback) -> None:
        self.fallback = fallback
        self.times: dict[str, float] = {}
        for f in report.get("fusions", []):
            t = f.get("exec_time_us", {})
            key = "indexing-cost-model" if f.get("backend_kind") == "__triton" and "indexing-cost-model" in t \
                else "default"
            self.times[f["name"]] = float(t.get(key, t.get("sol", 0.0)))
        for c in report.get("collectives", []):
            t = c.get("exec_time_us", {})
            if t:
                self.times[c["name"]] = float(t.get("default", t.get("sol", 0.0)))
        self.trips = {k["computation"]: int(k.get("times", 1))
                      for k in report.get("kernels", {}).get("per_computation", [])}
        self._loops: dict = {}

    def node_cost(self, inst) -> float:
        """XLA's estimate for fusions and synchronous collectives; ours for the rest."""
        from hlopt.scheduler.async_ops import is_async_done, is_async_start

        if is_async_start(inst) or is_async_done(inst):
            return 0.0
        if inst.name in self.times:
            return self.times[inst.name]
        if inst.opcode in ("while", "conditional", "call"):
            return self._loop_cost(inst)
        return self.fallback.node_cost(inst)

    def _loop_cost(self, inst) -> float:
        """A while/call: its computations' costs times their trips (from the report) per execution."""
        if inst not in self._loops:
            parent = self.trips.get(inst.parent.name, 1) if inst.parent is not None else 1
            self._loops[inst] = sum(self.trips.get(c.name, 1) / max(parent, 1)
                                    * sum(self.node_cost(i) for i in c.instructions)
                                    for c in inst.called_computations)
        return self._loops[inst]

    def latency(self, start, done) -> float:
        """XLA's estimate for the collective, else ours."""
        return self.times.get(start.name, self.fallback.latency(start, done))


def _has_collectives(comp) -> bool:
    from hlopt.hlo.opcodes import COLLECTIVES
    from hlopt.scheduler.async_ops import is_async_start

    return any(i.opcode in COLLECTIVES or is_async_start(i) for i in comp.instructions)


def program_bounds(module, estimator, limits: dict[str, int]) -> dict[str, tuple[float, float]]:
    """(lower bound, basic lower bound) per computation with collectives, with XLA's `is_sync` marks
    cleared: a mark only makes an order slower (the collective then also holds the compute stream), so
    the bound of the unmarked program holds for every order under any marks, XLA's included."""
    from hlopt.passes.base import non_fusion_computations
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
    from hlopt.passes.base import non_fusion_computations
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


def _train_step(microbatches: int, batch: int, seq: int, d_model: int, d_ff: int) -> str:
    from hlopt.cli.demo_program import make_train_step

    fn, args = make_train_step(microbatches, batch, seq, d_model, d_ff)
    return fn.lower(*args).as_text(dialect="hlo")


def _fsdp_mlp(layers: int = 4, width: int = 2048, batch: int = 512) -> str:
    """A 8-way FSDP MLP step in shard_map: all-gather each weight, reduce-scatter each gradient."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))

    def step(ws, x):
        def loss(ws):
            h = x
            for w in ws:
                h = jnp.tanh(h @ lax.all_gather(w, "d", tiled=True))
            return jnp.mean(h ** 2)

        g = jax.grad(loss)(ws)
        return [w - 1e-3 * gw for w, gw in zip(ws, g, strict=True)]

    ws = [jnp.ones((width, width), jnp.float32) * 0.01 for _ in range(layers)]
    x = jnp.ones((batch * 8, width), jnp.float32)
    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=([P("d")] * layers, P("d")), out_specs=[P("d")] * layers,
                              check_vma=False))
    return f.lower(ws, x).as_text(dialect="hlo")


def programs(names: list[str] | None = None) -> list[tuple[str, str]]:
    """(name, unoptimized HLO) of the 8-device programs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import conftest  # noqa: F401 - 8 CPU devices, set before jax is imported

    builders = {
        "dp_train_step_512": lambda: _train_step(4, 64, 128, 512, 2048),
        "dp_train_step_1024": lambda: _train_step(2, 64, 256, 1024, 4096),
        "fsdp_mlp_4x2048": _fsdp_mlp,
    }
    out = [(n, b()) for n, b in builders.items() if names is None or n in names]
    from corpus import corpus_texts

    out += [(e.id, e.text) for e in corpus_texts(optimized=False)
            if e.devices == 8 and (names is None or e.id in names)]
    return out


def xla_scheduled(text: str, devices: int = 8) -> tuple[str, dict]:
    """XLA:GPU's scheduled optimized module and the tool's report."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.hlo"
        src.write_text(text)
        run = subprocess.run([PYTHON, str(TOOL), str(src), "--devices", str(devices), "--out", tmp, "--json"],
                             capture_output=True, text=True, timeout=600)
        if run.returncode:
            raise RuntimeError(f"xla_gpu_compile failed:\n{run.stderr[-2000:]}")
        return (Path(tmp) / "optimized.hlo").read_text(), json.loads(run.stdout)


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
    p.add_argument("--estimator", default="xla", choices=["xla", "analytical"])
    p.add_argument("--device", default="h100")
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = p.parse_args(argv)
    if not available():
        raise SystemExit(f"needs {TOOL} and {PYTHON} (run ../shared/tools/setup_xla_gpu.sh)")
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    from hlopt.scheduler.costs import estimator_for

    heuristics = args.heuristics.split(",")
    rows = []
    for name, text in programs(args.programs.split(",") if args.programs else None):
        try:
            optimized, report = xla_scheduled(text)
        except RuntimeError as e:
            print(f"{name}: {str(e).splitlines()[-1]}", file=sys.stderr)
            continue
        base = estimator_for("analytical", args.device)
        est = XlaReportEstimator(report, base) if args.estimator == "xla" else base
        rows.append({"program": name, **evaluate(optimized, est, heuristics)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if args.markdown:
        print("| program | schedule | makespan us | lower bound us | / bound | / basic bound | exposed comm us "
              "| total comm us | vs XLA |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            for sched in ["xla", *heuristics]:
                print("| " + " | ".join(_row_cells(r, sched)) + " |")
        return 0
    from hlopt.cli.console import table_console
    from rich.table import Table

    table = Table("program", "schedule", "makespan us", "lower bound us", "/ bound", "/ basic bound",
                  "exposed comm us", "total comm us", "vs XLA",
                  title=f"schedules simulated with the {args.estimator} estimator (computations with collectives)")
    for r in rows:
        for sched in ["xla", *heuristics]:
            table.add_row(*_row_cells(r, sched))
    table_console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
