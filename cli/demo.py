"""`hlopt demo`: capture a data-parallel transformer step on 8 CPU devices, optimize, schedule, check.

Writes ./hlopt-demo/: the captured and optimized HLO, a Perfetto trace and a Gantt chart.
"""

from __future__ import annotations

import time
from pathlib import Path

__all__ = ["run_demo", "demo_pipeline"]

#: The demo's pipeline: the default one minus the scheduler (run separately to report on it).
DEMO_PASSES = ["call-inliner", "simplify", "block-scaling-rewriter", "while-loop-all-reduce-code-motion", "simplify",
               "fusion", "dce"]


def demo_pipeline() -> str:
    """DEMO_PASSES restricted to the passes this installation has."""
    from hlopt.passes.framework.pipeline import NAMED_PIPELINES
    from hlopt.passes.framework.registry import registered_passes

    known = registered_passes()
    return ",".join(p for p in DEMO_PASSES if p in known or p in NAMED_PIPELINES)


def _collective_count(module) -> int:
    from hlopt.hlo.opcodes import COLLECTIVES

    return sum(1 for i in module.instructions() if i.opcode in COLLECTIVES)


def _loop_collectives(module) -> int:
    """Collectives executed inside while loops (bodies and everything they call)."""
    from hlopt.hlo.opcodes import COLLECTIVES

    work = [i.get("body") for i in module.instructions() if i.opcode == "while" and i.get("body") is not None]
    seen = set(work)
    while work:
        for callee in work.pop().called_computations():
            if callee not in seen:
                seen.add(callee)
                work.append(callee)
    return sum(1 for c in seen for i in c.instructions if i.opcode in COLLECTIVES)


def _has_cost_model() -> bool:
    try:
        from hlopt.cost_model import get_cost_model  # noqa: F401
    except ImportError:
        return False
    return True


def _modeled_time(module, device: str) -> float | None:
    try:
        from hlopt.cost_model import module_time_us
    except ImportError:
        return None
    return module_time_us(module, device)


def xla_gpu_headline(module, target: str, devices: int) -> str:
    """XLA:GPU alone against hlopt + XLA:GPU on `module` (deviceless, by XLA's own estimates), one line; or,
    without the compiler, which comparison the demo prints instead."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import INSTALL_COMMAND, available
    from rich.markup import escape

    if not available():
        return (f"XLA:GPU compiler not installed ({escape(INSTALL_COMMAND)}): the time above is hlopt's analytical "
                f"model of the captured module (unfused) and of hlopt's output, not XLA:GPU's")
    from hlopt.runtime.xla_gpu_path.reemit import compile_for_gpu

    try:
        report = compile_for_gpu(module, target, devices).report
    except Exception as e:  # noqa: BLE001 - the headline reports the failure and the demo goes on
        return escape(f"XLA:GPU compile failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
    xla, ours = report["xla_default"], report["ours"]
    return (f"[bold]XLA:GPU alone vs hlopt + XLA:GPU[/bold] ({target} x{devices}, deviceless, XLA's own "
            f"estimates): {xla['modeled_us']:.1f} us ({xla['dynamic_launches']} launches) -> {ours['modeled_us']:.1f} "
            f"us ({ours['dynamic_launches']} launches), {report['ratio']:.2f}x")


def run_demo(out_dir: Path, device: str = "h100", xla_gpu: bool = True) -> int:
    """Run the demo; return a process exit code. `xla_gpu`: compare with XLA:GPU's own compile when its
    deviceless compiler is installed."""
    import jax
    import numpy as np
    from hlopt.cli.demo_program import DEMO_DEVICES, make_train_step
    from hlopt.cli.schedule import schedule_module
    from hlopt.passes.framework.pipeline import Pipeline
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Column, Table
    from rich.text import Text

    from hlopt import hlo, runtime

    console = Console()
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    step, args = make_train_step()
    console.rule("[bold]hlopt demo[/bold]: data-parallel transformer step, 8 CPU devices")
    module = runtime.capture(step, *args)
    (out_dir / "captured.hlo").write_text(module.to_text())
    hlo.verify(module)
    console.print(f"captured [bold]{escape(module.name)}[/bold]: {module.instruction_count()} instructions, "
                  f"{len(module.computations)} computations, {_collective_count(module)} collectives "
                  f"({_loop_collectives(module)} inside while loops)")
    before_time = _modeled_time(module, device)

    optimized = module.clone()
    pipeline = Pipeline.parse(demo_pipeline(), verify_each=True)
    result = pipeline.run(optimized)
    table = Table("changed", "ms", "instructions")
    table.columns.insert(0, Column("pass", no_wrap=True))
    for r in result.records:
        table.add_row(Text(r.label), str(r.changed),
                      f"{r.seconds * 1e3:.1f}", f"{r.instructions_before} -> {r.instructions_after}")
    console.print(table)
    console.print(f"collectives inside loops: {_loop_collectives(module)} -> {_loop_collectives(optimized)}")

    flat_inputs = [np.asarray(x) for x in jax.tree.leaves(args)]
    expected = [np.asarray(x) for x in jax.tree.leaves(step(*args))]
    actual = runtime.execute(optimized, flat_inputs, devices=DEMO_DEVICES)
    cmp = runtime.compare(expected, actual, rtol=2e-4, atol=2e-5)
    console.print(("[green]numerics match jax[/green]" if cmp.ok else "[red]numerics differ from jax[/red]")
                  + f" ({len(expected)} outputs)")
    if not cmp.ok:
        console.print(str(cmp), markup=False)

    scheduled = optimized.clone()
    estimator = "analytical" if _has_cost_model() else "approximate"
    summary = schedule_module(scheduled, "xla-default", device, estimator, overlap_limit=1)
    sims = summary.pop("_sims")
    (out_dir / "optimized.hlo").write_text(scheduled.to_text())
    from hlopt.scheduler.report import format_overlap, write_gantt, write_trace

    write_trace(list(sims.values()), out_dir / "trace.json")
    busiest = max(sims.values(), key=lambda s: (s.total_comm_us, s.makespan_us))
    write_gantt(busiest, out_dir / "gantt.png")
    console.print(f"schedule of {escape(busiest.computation)} ({device}, {estimator} estimator): makespan "
                  f"{busiest.makespan_us:.1f} us, lower bound {busiest.lower_bound_us:.1f} us, exposed communication "
                  f"{busiest.exposed_comm_us:.1f} us of {busiest.total_comm_us:.1f} us, overlap "
                  f"{format_overlap(busiest.overlap_fraction)}")
    after_time = _modeled_time(scheduled, device)
    if before_time is not None and after_time is not None:
        console.print(f"modeled {device} time (hlopt's analytical model; before = the captured module, unfused): "
                      f"{before_time:.1f} us -> {after_time:.1f} us")
    if xla_gpu:
        console.print(xla_gpu_headline(module, device, DEMO_DEVICES))
    console.print(f"wrote {escape(str(out_dir))}/captured.hlo, optimized.hlo, trace.json, gantt.png "
                  f"in {time.perf_counter() - t0:.1f} s")
    return 0 if cmp.ok else 1
