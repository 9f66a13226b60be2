"""The compile time a GPU user pays: `hlopt.hook("default")` vs plain `jax.jit`, through jax's deviceless AOT.

    python3 benchmarks/gpu_hook_compile_time.py [--programs a,b] [--repeat 1] [--no-guard] [--json]

Each program is compiled for an H100 topology (`jax.experimental.topologies`, no GPU needed) with plain
`jax.jit(f).lower(*specs).compile()` and under the hook (`jax.clear_caches()` before every compile), guard
included unless `--no-guard`. Programs: the single-device corpus programs (hlopt.corpus.programs) and the
user-shaped programs of hlopt.corpus.user_programs (an 8-device data-parallel step among them). Per program:
both times (best of `--repeat`, plain and hooked alternating), their ratio, and where the hooked time went: step 1
before XLA, steps 2-4 inside XLA's compile with step 3's passes and the backend-only compile (up to its
post-scheduler stage) apart, the guard (wall time of both compiles, and how long ours waited at its stage for
XLA's default to reach its own), which was kept. Needs jax-cuda12-plugin.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _programs(mesh1, mesh8) -> dict:
    """name -> (jitted function, ShapeDtypeStruct arguments)."""
    import jax
    from hlopt.corpus import programs as corpus
    from hlopt.corpus import user_programs as user
    from jax.sharding import PartitionSpec as P

    out = {}
    for prog in corpus.PROGRAMS:
        if prog.devices != 1:
            continue
        fn, args = prog.build()
        out[prog.name] = ((fn if hasattr(fn, "lower") else jax.jit(fn)), user.specs_of(mesh1, args))
    for name, build in user.PROGRAMS.items():
        fn, args = build()
        out[f"user:{name}"] = (jax.jit(fn), user.specs_of(mesh1, args))
    step, (p, x, y) = user.mlp_step()
    out["user:dp_step_8"] = (jax.jit(step), (user.specs_of(mesh8, p), *user.specs_of(mesh8, (x, y), lambda a: P("x"))))
    return out


def _time(compile_fn) -> float:
    import jax

    jax.clear_caches()
    started = time.perf_counter()
    compile_fn()
    return time.perf_counter() - started


def measure(name: str, fn, specs, guard: bool, repeat: int) -> dict:
    """Plain and hooked compile times (best of `repeat`, the two alternating so that both meet the same load)
    and the best hooked one's breakdown."""
    import hlopt

    plain, hooked, record, warned = float("inf"), float("inf"), None, 0
    for _ in range(repeat):
        plain = min(plain, _time(lambda: fn.lower(*specs).compile()))
        with warnings.catch_warnings(record=True) as caught, hlopt.hook("default", guard=guard) as h:
            warnings.simplefilter("always")
            seconds = _time(lambda: fn.lower(*specs).compile())
        warned += len(caught)
        if seconds < hooked:
            hooked, record = seconds, h.records[-1]
    after = record.after_xla
    row = {"program": name, "plain_s": round(plain, 3), "hooked_s": round(hooked, 3),
           "ratio": round(hooked / plain, 2), "step1_s": round(record.seconds, 3),
           "xla_compile_s": after.get("compile_seconds"), "step3_s": after.get("seconds"),
           "backend_only_s": after.get("backend_only_seconds"), "guard_s": record.guard.get("seconds"),
           "guard_wait_s": record.guard.get("waited_seconds"), "kept": record.guard.get("kept"),
           "fell_back": record.gpu_fell_back, "warnings": warned}
    return row


def main(argv: list[str] | None = None) -> int:
    """Command line entry (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", default="", help="comma-separated names (default: all)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-guard", dest="guard", action="store_false")
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args(argv)
    from hlopt.runtime.xla_gpu_path import xla_gpu
    from jax.experimental import topologies
    from jax.sharding import Mesh

    if not xla_gpu.plugin_installed():
        print(f"needs {xla_gpu.PLUGIN_REQUIREMENT}", file=sys.stderr)
        return 3
    config = xla_gpu.spec_path("h100").read_text()
    meshes = [Mesh(topologies.get_topology_desc(topology_name="h100", platform="cuda", target_config=config,
                                                topology=f"1x1x{n}").devices, ("x",)) for n in (1, 8)]
    programs = _programs(*meshes)
    wanted = [p for p in a.programs.split(",") if p] or list(programs)
    rows = []
    for name in wanted:
        fn, specs = programs[name]
        rows.append(measure(name, fn, specs, a.guard, a.repeat))
        if not a.json:
            r = rows[-1]
            print(f"| {name} | {r['plain_s']:.2f} | {r['hooked_s']:.2f} | {r['ratio']:.2f}x | {r['step1_s']:.2f} | "
                  f"{r['xla_compile_s']} | {r['step3_s']} | {r['backend_only_s']} | {r['guard_s']} | "
                  f"{r['guard_wait_s']} | {r['kept']} |", flush=True)
    ratios = [r["ratio"] for r in rows]
    summary = {"programs": len(rows), "median_ratio": round(statistics.median(ratios), 2),
               "worst_ratio": max(ratios), "worst": rows[ratios.index(max(ratios))]["program"],
               "fell_back": [r["program"] for r in rows if r["fell_back"]],
               "warned": [r["program"] for r in rows if r["warnings"]]}
    if a.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
    else:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
