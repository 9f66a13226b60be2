"""Our cost model against XLA:GPU's own estimates, fusion by fusion (deviceless; no GPU needed).

Every corpus program (corpus/programs.py; multi-device ones partitioned over 8 GPUs) is compiled by XLA's
real GPU compiler for the chosen GPU through hlopt's XLA:GPU driver (`hlopt.runtime.xla_gpu_path.xla_gpu`). For every fusion of
XLA's optimized module that carries XLA's "default" GpuPerformanceModel estimate (`reification_cost`),
`cost_model` times the same fusion (`KernelModel.estimate`, without launch overhead, as XLA's per-fusion
number has none) and we report the distribution of ours / XLA's (median, p10, p90) per program, per
emitter kind and overall, and the module totals (each fusion times its executions, while bodies by their
known trip counts). Fusions XLA estimates at 0 us cannot form a ratio and are counted apart.

    python3 benchmarks/cost_vs_xla.py [--spec h100_sxm|h200|b200] [--json] [--programs a,b]

Install the compiler once: python3 -m hlopt.runtime.xla_gpu_path.xla_gpu install (HLOPT_XLA_GPU_PYTHON overrides).

`--analysis` needs no GPU tool: per corpus module (the SPMD programs of corpus/programs_extra.py included,
unoptimized = before SPMD partitioning, and XLA:CPU's optimized module), the totals `hlopt cost --json` prints
(`Cost.xla_totals`) against XLA's own HloCostAnalysis (jaxlib's `hlo_module_cost_analysis`), and the flops /
bytes our model counts when it sizes opaque custom calls (Sharding, LAPACK) instead of XLA's -1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor

from hlopt.corpus.xla_reference import available, xla_gpu_compile

#: XLA target-config spec -> our device.
SPEC_DEVICE = {"h100_sxm": "h100", "h200": "h200", "b200": "b200"}


def compile_for_gpu(text: str, spec: str, devices: int) -> tuple[dict, str]:
    """XLA:GPU's report and optimized module for one program."""
    try:
        report = xla_gpu_compile(text, spec, devices=devices)
    except RuntimeError as e:
        raise RuntimeError(str(e).strip().splitlines()[-1] if str(e).strip() else "failed") from None
    return report, report["optimized_text"]


def _default_estimate(inst) -> float | None:
    try:
        cfg = inst.backend_config_json()
    except ValueError:
        return None
    if not isinstance(cfg, dict):
        return None
    for entry in cfg.get("reification_cost", []):
        if not entry.get("name"):
            return float(entry["exec_time_us"])
    return None


def measure(name: str, text: str, devices: int, spec: str) -> dict:
    """Per-fusion (kind, ours, XLA's, executions) and totals for one program."""
    from hlopt.cost_model.devices import get_device
    from hlopt.cost_model.kernel import KernelModel

    from hlopt import hlo

    try:
        report, optimized = compile_for_gpu(text, spec, devices)
    except RuntimeError as e:
        return {"program": name, "error": str(e)[-200:]}
    module = hlo.parse(optimized)
    times = {f["name"]: f.get("times", 1) for f in report.get("fusions", [])}
    model = KernelModel(get_device(SPEC_DEVICE[spec]))
    fusions = []
    for inst in module.instructions():
        if inst.opcode != "fusion":
            continue
        xla_us = _default_estimate(inst)
        est = model.estimate(inst)
        if xla_us is None or est is None:
            continue
        fusions.append({"name": inst.name, "emitter": est.launch.emitter, "ours_us": est.exec_us,
                        "xla_us": xla_us, "times": times.get(inst.name, 1)})
    return {"program": name, "fusions": fusions,
            "ours_total_us": sum(f["ours_us"] * f["times"] for f in fusions),
            "xla_total_us": sum(f["xla_us"] * f["times"] for f in fusions)}


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ratios(fusions: list[dict]) -> list[float]:
    """ours / XLA's, for fusions XLA does not estimate at 0."""
    return [f["ours_us"] / f["xla_us"] for f in fusions if f["xla_us"] > 0]


def _row(label: str, rs: list[float], n_zero: int, ours: str = "", xla: str = "") -> str:
    if not rs:
        return f"| {label} | 0 | {n_zero} | | | | | {ours} | {xla} |"
    within = sum(0.85 <= r <= 1.15 for r in rs) / len(rs)
    return (f"| {label} | {len(rs)} | {n_zero} | {statistics.median(rs):.3f} | {quantile(rs, 0.1):.3f} | "
            f"{quantile(rs, 0.9):.3f} | {within:.0%} | {ours} | {xla} |")


def print_markdown(rows: list[dict]) -> None:
    """Per program, per emitter and overall."""
    print("| program | fusions | XLA 0 us | median ours/XLA | p10 | p90 | within 15% | total ours us | total XLA us |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    every: list[dict] = []
    for r in rows:
        if "error" in r:
            print(f"| {r['program']} | XLA:GPU failed: {r['error']} | | | | | | | |")
            continue
        every += r["fusions"]
        zero = sum(f["xla_us"] <= 0 for f in r["fusions"])
        print(_row(r["program"], ratios(r["fusions"]), zero, f"{r['ours_total_us']:.3f}", f"{r['xla_total_us']:.3f}"))
    ours = sum(f["ours_us"] * f["times"] for f in every)
    xla = sum(f["xla_us"] * f["times"] for f in every)
    print(_row("**all**", ratios(every), sum(f["xla_us"] <= 0 for f in every), f"{ours:.3f}", f"{xla:.3f}"))
    print()
    print("| emitter | fusions | XLA 0 us | median ours/XLA | p10 | p90 | within 15% | total ours us | total XLA us |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind in sorted({f["emitter"] for f in every}):
        sub = [f for f in every if f["emitter"] == kind]
        print(_row(kind, ratios(sub), sum(f["xla_us"] <= 0 for f in sub),
                   f"{sum(f['ours_us'] * f['times'] for f in sub):.3f}",
                   f"{sum(f['xla_us'] * f['times'] for f in sub):.3f}"))


def corpus(names: list[str] | None) -> list[tuple[str, str, int]]:
    """(name, unoptimized HLO, devices) of the corpus programs."""
    from hlopt.corpus import use_cpu_devices

    use_cpu_devices()  # 8 CPU devices, set before jax is imported
    from hlopt.corpus.programs import corpus_texts

    return [(e.id, e.text, e.devices) for e in corpus_texts(optimized=False) if names is None or e.id in names]


def analysis_rows(names: list[str] | None) -> list[dict]:
    """Per corpus module: `hlopt cost` totals, XLA's HloCostAnalysis, and our model's sized counts."""
    from hlopt.corpus import use_cpu_devices
    from hlopt.cost_model.analysis import module_cost
    from hlopt.runtime._xla import XlaError, cost_analysis

    from hlopt import hlo

    use_cpu_devices()  # 8 CPU devices, set before jax is imported
    from hlopt.corpus.programs import corpus_texts
    from hlopt.corpus.programs_extra import extra_corpus_texts

    rows = []
    for e in [*corpus_texts(), *extra_corpus_texts()]:
        if names is not None and e.id.removesuffix(".opt") not in names:
            continue
        try:
            xla = cost_analysis(e.text)
        except XlaError as err:
            rows.append({"module": e.id, "error": str(err).splitlines()[-1][:200]})
            continue
        cost = module_cost(hlo.parse(e.text))
        rows.append({"module": e.id, **{f"ours_{k}": v for k, v in cost.xla_totals().items()},
                     "xla_flops": xla.get("flops", 0.0), "xla_bytes_accessed": xla.get("bytes accessed", 0.0),
                     "model_flops": cost.flops, "model_bytes_accessed": cost.bytes_accessed})
    return rows


def print_analysis(rows: list[dict]) -> None:
    """One markdown row per module: flops delta, bytes relative delta (ours vs XLA), and the sized counts."""
    print("| module | flops XLA | Δ flops | bytes XLA | Δ bytes | opaque | model flops | model bytes (Δ vs XLA) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['module']} | XLA rejects: {r['error']} | | | | | | |")
            continue
        xb = r["xla_bytes_accessed"]

        def rel(v: float, ref: float = xb) -> str:
            return f"{(v - ref) / ref:+.1%}" if ref else f"{v - ref:+.0f}"

        print(f"| {r['module']} | {r['xla_flops']:.0f} | {r['ours_flops'] - r['xla_flops']:+.0f} | {xb:.0f} | "
              f"{rel(r['ours_bytes_accessed'])} | {r['ours_opaque_instructions']:.0f} | {r['model_flops']:.0f} | "
              f"{r['model_bytes_accessed']:.0f} ({rel(r['model_bytes_accessed'])}) |")


def main() -> int:
    """Print the markdown tables (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="h100_sxm", choices=sorted(SPEC_DEVICE))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--programs", help="comma-separated corpus program names")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--analysis", action="store_true",
                    help="flops/bytes totals against XLA's HloCostAnalysis (no GPU tool needed)")
    args = ap.parse_args()
    if args.analysis:
        rows = analysis_rows(args.programs.split(",") if args.programs else None)
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print_analysis(rows)
        return 0
    if not available():
        print("XLA:GPU compiler not installed: run python3 -m hlopt.runtime.xla_gpu_path.xla_gpu install", file=sys.stderr)
        return 1
    programs = corpus(args.programs.split(",") if args.programs else None)
    with ThreadPoolExecutor(args.workers) as pool:
        rows = list(pool.map(lambda p: measure(p[0], p[1], p[2], args.spec), programs))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_markdown(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
