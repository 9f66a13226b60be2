"""Collective pipelining across loop iterations: hlopt's path against XLA:GPU, deviceless, 8 H100s.

    python3 benchmarks/pipeline_vs_xla.py [--programs fsdp_scan,dp_scan] [--target h100] [--numerics] [--json]
    python3 benchmarks/pipeline_vs_xla.py --simulated [--programs ...] [--json]   # hlopt's simulator, no XLA:GPU
    python3 benchmarks/pipeline_vs_xla.py --double-buffering   # hlopt compile with/without XLA's double buffering

For each scanned 8-device program of `corpus/pipeline_programs.py` (FSDP and data-parallel layer stacks, their
remat variants, gradient accumulation), the makespan XLA's estimates give (`runtime.xla_gpu_path.xla_gpu.estimate`: the final
module simulated in its own order, XLA's per-fusion and per-collective estimates, launch overhead on the compute
stream) of:

- `xla-default`: XLA:GPU's default compile (its collective pipeliner is off by default in this version);
- `xla-pipelined`: XLA:GPU with `--xla_gpu_enable_pipelined_all_gather`, `_reduce_scatter` and `_all_reduce`;
- `xla-pipelined+ours`: XLA's passes with its pipeliner on, then hlopt's fusion and scheduler (the re-emission path
  of `runtime.xla_gpu_path.reemit` with those flags and step 1 without hlopt's own `collective-pipeliner`, so that the loops
  are pipelined once, by XLA), the executable's final module;
- `hlopt`: `hlopt compile` as users run it (`runtime.xla_gpu_path.reemit.compile_for_gpu` with its default pipelines: hlopt's
  own collective pipelining before XLA when the cost model says it pays), the executable's final module.

`--configs` also takes `hlopt-no-pipeliner` (`hlopt` with step 1 less its `collective-pipeliner` passes) and
`hlopt-every-move` (the pipeliners without their cost model: every move XLA's pass would make).
Ratios are to `xla-default`. With `--numerics` the module hlopt hands to XLA (after step 1) runs on 8 CPU devices
with the program's own arguments and is compared with the program under jax. Needs the XLA:GPU compiler
(`pip install 'hlopt[gpu-compile]'`).

`--simulated` needs no XLA:GPU compiler: the `default` pipeline less the scheduler runs without the pipeliner, as it
is (each move only where hlopt's cost model says it pays) and with every move (`cost_model` off); then hlopt's
scheduler (`xla-default` heuristic, H100 analytical model) gives the simulated makespan of the step (loops times
their trip counts) and its exposed communication.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hlopt.corpus import use_cpu_devices

use_cpu_devices()  # 8 CPU devices and JAX_PLATFORMS=cpu, before jax is imported

#: XLA:GPU's flags that switch its collective pipeliner on, per collective kind.
PIPELINED_FLAGS = ("--xla_gpu_enable_pipelined_all_gather=true --xla_gpu_enable_pipelined_reduce_scatter=true "
                   "--xla_gpu_enable_pipelined_all_reduce=true")
CONFIGS = ("xla-default", "xla-pipelined", "xla-pipelined+ours", "hlopt")
#: configurations `--configs` also takes (not run by default)
EXTRA_CONFIGS = ("hlopt-no-pipeliner", "hlopt-every-move")


def _passes(spec: str) -> list:
    """A pipeline spec's elements, as hlopt's spec parser reads it (named pipelines expanded)."""
    from hlopt.passes.framework.pipeline import parse_pipeline

    return parse_pipeline(spec)


def _spec(passes: list) -> str:
    """The spec string of pipeline elements."""
    from hlopt.passes.framework.pipeline import Pipeline

    return Pipeline(passes).spec


def without_pipeliner(spec: str) -> str:
    """`spec` less its `collective-pipeliner` passes (step 1 where XLA's pipeliner does the pipelining)."""
    return _spec([p for p in _passes(spec) if p.name != "collective-pipeliner"])


def every_move(spec: str) -> str:
    """`spec` with its `collective-pipeliner` passes free of the cost model: every move XLA's pass would make."""
    import dataclasses

    return _spec([dataclasses.replace(p, cost_model="") if p.name == "collective-pipeliner" else p
                  for p in _passes(spec)])


def _collectives_in_loops(module) -> int:
    """Collective ops left inside while bodies (async pairs counted once)."""
    bodies = {inst.attrs["body"] for inst in module.instructions() if inst.opcode == "while"}
    kinds = ("all-gather", "reduce-scatter", "all-reduce", "collective-permute", "all-to-all")
    return sum(1 for c in bodies for i in c.instructions
               if i.opcode in kinds or (i.opcode.endswith("-start") and i.opcode[:-6] in kinds))


def measure(name: str, target: str, configs: tuple[str, ...], numerics: bool) -> dict:
    """One program's row: makespan per configuration, ratios to XLA's default, collectives left in loops."""
    from hlopt.corpus.pipeline_programs import capture
    from hlopt.hlo.parser import parse
    from hlopt.runtime.xla_gpu_path.reemit import BEFORE_XLA, compile_for_gpu
    from hlopt.runtime.xla_gpu_path.xla_gpu import estimate, run_driver

    text = capture(name)
    row: dict = {"program": name, "makespan_us": {}, "collectives_in_loops": {}, "seconds": {}}

    def record(config: str, final_module) -> None:
        row["makespan_us"][config] = round(estimate(final_module, target, 8).modeled_us, 1)
        row["collectives_in_loops"][config] = _collectives_in_loops(final_module)

    for config in configs:
        started = time.perf_counter()
        try:
            if config in ("xla-default", "xla-pipelined"):
                flags = PIPELINED_FLAGS if config == "xla-pipelined" else ""
                record(config, run_driver(text, target, 8, xla_flags=flags).final)
            else:
                xla_pipelines = config == "xla-pipelined+ours"
                before = {"xla-pipelined+ours": without_pipeliner, "hlopt-no-pipeliner": without_pipeliner,
                          "hlopt-every-move": every_move}.get(config, str)(BEFORE_XLA)
                result = compile_for_gpu(parse(text), target, 8, xla_flags=PIPELINED_FLAGS if xla_pipelines else "",
                                         before=before)
                record(config, result.final.final)
                if config == "hlopt" and numerics:
                    row["numerics"] = _numerics(name, text)
        except Exception as e:
            row["makespan_us"][config] = None
            row.setdefault("errors", {})[config] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        row["seconds"][config] = round(time.perf_counter() - started, 1)
    base = row["makespan_us"].get("xla-default")
    row["ratio"] = {c: (round(v / base, 3) if v and base else None) for c, v in row["makespan_us"].items()}
    return row


def _numerics(name: str, text: str) -> str:
    """The program's outputs under jax against the module hlopt hands to XLA (step 1), on 8 CPU devices, with the
    program's own arguments (random ones would break the replication its shardings promise: a replicated
    parameter must hold one value on every device)."""
    import jax
    import numpy as np
    from hlopt.corpus.pipeline_programs import build
    from hlopt.hlo.parser import parse
    from hlopt.passes.framework.pipeline import run_pipeline
    from hlopt.runtime.xla_gpu_path.reemit import BEFORE_XLA

    from hlopt import runtime

    fn, args = build(name)
    ours = parse(text)
    run_pipeline(ours, BEFORE_XLA)
    want = [np.asarray(x) for x in jax.tree.leaves(fn(*args))]
    got = runtime.execute(ours, [np.asarray(x) for x in jax.tree.leaves(args)])
    return "ok" if runtime.compare(want, got, rtol=1e-4, atol=1e-4).ok else "DIFF"


def _captured(name: str):  # noqa: ANN202 - a Module
    """The program's module, each collective on a channel of its own (jax gives every shard_map collective
    id 1; see the pipeliner's tests)."""
    from hlopt.corpus.pipeline_programs import capture

    import hlopt

    module = hlopt.parse(capture(name))
    for n, inst in enumerate(i for i in module.instructions() if isinstance(i.attrs.get("channel_id"), int)):
        inst.attrs["channel_id"] = n + 1
    return module


def simulated(names: list[str]) -> list[dict]:
    """hlopt's simulated makespan per program: `default` less the scheduler, without the pipeliner, as it is and
    with every move."""
    from hlopt.cli.schedule import schedule_module
    from hlopt.passes.framework.pipeline import run_pipeline

    default = [p for p in _passes("default") if p.name != "latency-hiding-scheduler"]
    variants = {"without pipeliner": without_pipeliner(_spec(default)), "default (cost model)": _spec(default),
                "every move": every_move(_spec(default))}
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


def table(rows: list[dict]) -> str:
    """Rows as a markdown table, one column per key."""
    keys = list(rows[0])
    return "\n".join(["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys),
                      *("| " + " | ".join(str(row[k]) for k in keys) + " |" for row in rows)])


def markdown(rows: list[dict], configs: tuple[str, ...]) -> str:
    """The README table."""
    numerics = any("numerics" in r for r in rows)
    head = "| program | " + " | ".join(f"{c} (us)" for c in configs) + " | hlopt / xla-default | in-loop collectives |"
    lines = [head + (" numerics |" if numerics else ""), "|---|" + "---:|" * (len(configs) + 2) + ("---|" if numerics else "")]
    for r in rows:
        cells = [f"{r['makespan_us'][c]:.1f}" if r["makespan_us"].get(c) else "fails" for c in configs]
        ratio = r["ratio"].get("hlopt")
        loops = " / ".join(str(r["collectives_in_loops"].get(c, "-")) for c in configs)
        lines.append(f"| {r['program']} | " + " | ".join(cells) + f" | {ratio if ratio else '-'} | {loops} |"
                     + (f" {r.get('numerics', '')} |" if numerics else ""))
    return "\n".join(lines)


#: `--double-buffering`: scanned steps at other sizes, layer counts and device counts (program, devices, sizes)
DOUBLE_BUFFERING_SHAPES = (
    ("fsdp_scan", 8, {"layers": 6, "d": 256, "d_ff": 1024}),
    ("fsdp_scan", 8, {"layers": 3}),
    ("fsdp_scan", 8, {"layers": 8, "seq": 256}),
    ("fsdp_scan_remat", 8, {"layers": 5, "d": 384, "d_ff": 1536}),
    ("dp_scan", 8, {"layers": 6, "d": 256, "d_ff": 1024}),
    ("fsdp_scan", 4, {"layers": 4}),
    ("dp_scan", 4, {"layers": 4}),
)


def double_buffering_row(name: str, devices: int, sizes: dict, target: str) -> str:
    """One markdown row: XLA's estimate of `hlopt compile`'s final module with XLA's loop double buffering off
    and on (`compile_for_gpu(double_buffering=False/True)`; its default, "best", keeps the faster), as ratios
    to XLA:GPU's default compile of the same program."""
    import hlopt.corpus.pipeline_programs as programs
    from hlopt.hlo.parser import parse
    from hlopt.runtime.xla_gpu_path.reemit import compile_for_gpu
    from hlopt.runtime.xla_gpu_path.xla_gpu import estimate

    programs.DEVICES = devices
    text = programs.capture(name, **sizes)
    times = []
    for double_buffering in (False, True):
        result = compile_for_gpu(parse(text), target, devices, double_buffering=double_buffering)
        times.append(estimate(result.final.final, target, devices).modeled_us)
    base = estimate(result.xla_default.final, target, devices).modeled_us
    shape = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return (f"| {name} | {devices} | {shape} | {base:.1f} | {times[0]:.1f} ({times[0] / base:.3f}) | "
            f"{times[1]:.1f} ({times[1] / base:.3f}) |")


def main(argv: list[str] | None = None) -> int:
    from hlopt.corpus.pipeline_programs import PROGRAMS
    from hlopt.runtime.xla_gpu_path.xla_gpu import available

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--target", default="h100")
    parser.add_argument("--numerics", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--simulated", action="store_true",
                        help="hlopt's simulator on the pipeliner's variants instead (no XLA:GPU compiler needed)")
    parser.add_argument("--double-buffering", action="store_true",
                        help="hlopt compile without and with XLA's loop double buffering, on steps of other shapes")
    args = parser.parse_args(argv)
    if args.simulated:
        rows = simulated([n for n in args.programs.split(",") if n])
        print(json.dumps(rows, indent=1) if args.json else table(rows))
        return 0
    if not available():
        print("the XLA:GPU compiler is not installed: pip install 'hlopt[gpu-compile]'", file=sys.stderr)
        return 2
    if args.double_buffering:
        print("| program | devices | sizes | XLA default (us) | without (us) | with (us) |")
        print("|---|---:|---|---:|---:|---:|")
        for name, devices, sizes in DOUBLE_BUFFERING_SHAPES:
            print(double_buffering_row(name, devices, sizes, args.target), flush=True)
        return 0
    configs = tuple(args.configs.split(","))
    unknown = [c for c in configs if c not in (*CONFIGS, *EXTRA_CONFIGS)]
    if unknown:
        parser.error(f"unknown configuration {', '.join(unknown)} (known: {', '.join((*CONFIGS, *EXTRA_CONFIGS))})")
    rows = [measure(n, args.target, configs, args.numerics) for n in args.programs.split(",")]
    print(json.dumps(rows, indent=1) if args.json else markdown(rows, configs))
    errors = [f"{r['program']}/{c}: {e}" for r in rows for c, e in r.get("errors", {}).items()]
    for line in errors:
        print(line, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
