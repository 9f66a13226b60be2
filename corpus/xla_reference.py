"""XLA's real GPU compiler, deviceless, through hlopt's own driver (`hlopt.runtime.xla_gpu_path.xla_gpu.run_driver`).

`xla_gpu_compile` returns the report the benchmarks and tests read, built from XLA's final module: fusions
(name, computation, times run, kind, backend_kind, exec_time_us per XLA cost model), kernel launch counts
(static and dynamic), collectives, XLA's cost analysis (flops, bytes accessed) and the optimized text.
Install the compiler once with `python3 -m hlopt.runtime.xla_gpu_path.xla_gpu install`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["xla_gpu_compile", "available", "corpus_programs", "report_of"]

def available() -> bool:
    """True when hlopt's XLA:GPU driver (the CUDA plugin's compiler) is installed."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import available as driver_available

    return driver_available()


def xla_gpu_compile(hlo_text: str, spec: str = "h100_sxm", disable_passes: str | None = None,
                    xla_flags: str = "", devices: int = 1) -> dict:
    """XLA:GPU's compile of this module (deviceless) as a report (see the module docstring)."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import run_driver

    result = run_driver(hlo_text, spec, devices, disable_passes=disable_passes or "",
                        xla_flags=xla_flags)
    report = report_of(result.final)
    report.update(devices=devices, memory=result.memory, warnings=result.warnings,
                  cost_analysis={k: result.cost_analysis.get(k, 0.0)
                                 for k in ("flops", "bytes_accessed", "transcendentals")},
                  cost_analysis_source=result.cost_analysis.get("source", ""),
                  optimized_text=result.final_text)
    return report


def _fusion_entry(inst: Any, comp: Any, times: int) -> dict:
    from hlopt.runtime.xla_gpu_path.xla_gpu import xla_estimates

    try:
        cfg = inst.backend_config_json() or {}
    except ValueError:
        cfg = {}
    backend = (cfg.get("fusion_backend_config") or {}).get("kind", "") if isinstance(cfg, dict) else ""
    return {"name": inst.name, "computation": comp.name, "times": times, "kind": str(inst.attrs.get("kind", "")),
            "backend_kind": backend, "exec_time_us": xla_estimates(inst)}


def _collective_entry(inst: Any, comp: Any, launches: list[tuple[Any, str | None]], pos: int) -> dict:
    from hlopt.runtime.xla_gpu_path.xla_gpu import xla_estimates

    done = next((j for j, (d, _) in enumerate(launches) if d.opcode.endswith("-done")
                 and d.operands and d.operands[0] is inst), pos)
    between = sum(kind is not None for _, kind in launches[pos + 1:done])
    try:
        cfg = inst.backend_config_json() or {}
    except ValueError:
        cfg = {}
    is_sync = (cfg.get("collective_backend_config") or {}).get("is_sync") if isinstance(cfg, dict) else None
    mode = ("synchronous op" if done == pos else "sync (is_sync=true)" if is_sync
            else f"overlapped with {between} launches" if between else "async, nothing scheduled in between")
    return {"name": inst.name, "op": inst.opcode, "is_sync": is_sync, "computation": comp.name, "mode": mode,
            "exec_time_us": xla_estimates(inst)}


def report_of(module: Any) -> dict:
    """Kernel counts, fusions with XLA's estimates and collectives of XLA's final module."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import executed_computations, launch_kind

    per_comp, fusions, collectives = [], [], []
    static, dynamic, others = Counter(), Counter(), Counter()
    for comp, times in executed_computations(module):
        launches = [(inst, launch_kind(inst)) for inst in comp.instructions]
        counts: Counter = Counter()
        for pos, (inst, kind) in enumerate(launches):
            if kind is None:
                continue
            counts[kind] += 1
            if kind == "other":
                others[inst.opcode] += 1
            elif kind == "fusion":
                fusions.append(_fusion_entry(inst, comp, times))
            elif kind == "collective":
                collectives.append(_collective_entry(inst, comp, launches, pos))
        counts["total"] = sum(counts.values())
        static.update(counts)
        dynamic.update({k: v * times for k, v in counts.items()})
        per_comp.append({"computation": comp.name, "times": times, **counts})
    models = dict.fromkeys(m for f in fusions for m in f["exec_time_us"])

    def total(weighted: bool) -> dict[str, float]:
        return {m: round(sum((f["exec_time_us"].get(m) or 0) * (f["times"] if weighted else 1) for f in fusions), 3)
                for m in models}

    return {"module": module.name,
            "kernels": {"per_computation": per_comp, "static": dict(static), "dynamic": dict(dynamic),
                        "other_ops": dict(others)},
            "fusions": fusions, "fusion_exec_time_us_sum": total(False),
            "fusion_exec_time_us_sum_x_trips": total(True), "collectives": collectives,
            "async_collective_pairs": sum(c["op"].endswith("-start") for c in collectives)}


def corpus_programs(names: list[str] | None = None) -> list[tuple[str, str]]:
    """(name, unoptimized HLO) of single-device corpus programs."""
    from hlopt.corpus import use_cpu_devices

    use_cpu_devices()  # before jax is imported
    from hlopt.corpus.programs import corpus_texts

    return [(e.id, e.text) for e in corpus_texts(optimized=False)
            if e.devices == 1 and (names is None or e.id in names)]
