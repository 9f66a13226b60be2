"""Our fusions, rated by XLA:GPU and by hlopt's model, through the whole `hlopt compile` path (deviceless).

    python3 benchmarks/fusion_parity.py [--programs a,b] [--corpus] [--unseen] [--fusion-programs]
                                        [--worst 20] [--json OUT] [--target h100]

Each program goes through `runtime.xla_gpu_path.reemit.compile_for_gpu` (hlopt's fusions and schedule handed to XLA:GPU's
backend) with `--xla_gpu_enable_triton_gemm=false` on both sides. Per program: the modeled time of ours and of
XLA:GPU's default compile by XLA's own estimates (as `report.json`), their ratio, launches per execution, and
hlopt's own model (`cost_model`, what `hlopt cost` prints) summed over the same launches of both final modules.
Per fusion: every fusion of ours that XLA's final module kept (same name as in the module we handed over, a
generic emitter or a block-level Triton fusion; library calls left out), our estimate (`KernelModel.estimate`,
no launch overhead) beside XLA's (`runtime.xla_gpu_path.xla_gpu.estimate_of`: the `reification_cost` of its backend_config,
the indexing cost model's for Triton fusions). The distribution of ours/XLA and the worst fusions, with their
fused computations, follow. Targets (issue #31): median |ours/XLA - 1| <= 10%, 95% within +-25%, none where
XLA rates ours above 1.5x our estimate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from hlopt.corpus import use_cpu_devices

use_cpu_devices()  # 8 CPU devices and JAX_PLATFORMS=cpu, before jax is imported

XLA_FLAGS = "--xla_gpu_enable_triton_gemm=false"
#: the corpus programs of benchmarks/reemit_vs_xla.py's default run
CORPUS = ["mlp_grad", "conv_net_grad", "scan_rnn", "while_fori_cond", "sort_topk_argmax", "gather_scatter",
          "pad_slice_dus", "elementwise_math", "transformer_train_step"]


def texts(args: argparse.Namespace) -> dict[str, tuple[str, int]]:
    """name -> (HLO text, devices) of the programs asked for."""
    from hlopt.corpus.programs import program_text
    from hlopt.corpus.training_steps import larger_texts

    out: dict[str, tuple[str, int]] = {}
    if args.corpus:
        out.update({n: program_text(n) for n in CORPUS})
        out.update(larger_texts())
    if args.unseen:
        from hlopt.corpus.unseen_programs import unseen_texts

        out.update({n: t for n, t in unseen_texts().items() if t[1] == 1})
    if args.fusion_programs:
        from hlopt.corpus.fusion_programs import fusion_texts

        out.update(fusion_texts())
    if args.programs:
        from hlopt.corpus.fusion_programs import FUSION_PROGRAMS, fusion_texts
        from hlopt.corpus.unseen_programs import UNSEEN, unseen_texts

        larger = None
        for n in args.programs.split(","):
            if n in FUSION_PROGRAMS:
                out[n] = fusion_texts([n])[n]
            elif n in UNSEEN:
                out[n] = unseen_texts([n])[n]
            elif n in ("transformer_step_2x512", "mlp_step_3x1024"):
                larger = larger or larger_texts()
                out[n] = larger[n]
            else:
                out[n] = program_text(n)
    return out


def _our_model_us(module, target: str) -> float:
    """hlopt's model over a final module's launches (each launch once per execution, launch overhead in)."""
    from hlopt.cost_model import get_cost_model
    from hlopt.runtime.xla_gpu_path.xla_gpu import executed_computations, launch_kind

    model = get_cost_model(target)
    return sum(times * model.node_time_us(inst) for comp, times in executed_computations(module)
               for inst in comp.instructions if launch_kind(inst) is not None)


def _emitter_kind(inst) -> str:
    try:
        cfg = inst.backend_config_json()
    except ValueError:
        return ""
    return ((cfg or {}).get("fusion_backend_config") or {}).get("kind", "") if isinstance(cfg, dict) else ""


def fusion_rows(result, target: str) -> list[dict]:
    """Our fusions kept in XLA's final module, with both estimates."""
    from hlopt.cost_model.devices import get_device
    from hlopt.cost_model.kernel import KernelModel
    from hlopt.runtime.xla_gpu_path.xla_gpu import estimate_of

    ours = {i.name for i in result.hlopt_module.instructions() if i.opcode == "fusion"}
    model = KernelModel(get_device(target))
    rows = []
    for inst in result.final.final.instructions():
        if inst.opcode != "fusion" or inst.name not in ours:
            continue
        kind = _emitter_kind(inst)
        if kind and kind != "__triton" and not kind.startswith("k"):
            continue  # a library call XLA made (cuBLAS, cuDNN, custom fusions)
        xla_us, est = estimate_of(inst), model.estimate(inst)
        if xla_us is None or est is None or xla_us <= 0:
            continue
        rows.append({"name": inst.name, "emitter": est.launch.emitter, "ours_us": est.exec_us, "xla_us": xla_us,
                     "ratio": est.exec_us / xla_us, "text": inst.attrs["calls"].to_text()})
    return rows


def measure(name: str, text: str, devices: int, target: str, dump: str | None = None) -> dict:
    """One program's row and its fusions (with `dump`: the three modules written to DUMP/NAME/)."""
    from hlopt.runtime.xla_gpu_path.reemit import compile_for_gpu

    try:
        result = compile_for_gpu(text, target, devices, xla_flags=XLA_FLAGS)
    except RuntimeError as e:
        return {"program": name, "error": str(e).splitlines()[0][:200]}
    rep = result.report
    if dump:
        out = Path(dump) / name
        out.mkdir(parents=True, exist_ok=True)
        (out / "hlopt.hlo").write_text(result.hlopt_text)
        (out / "final.hlo").write_text(result.final_text)
        (out / "xla_default.hlo").write_text(result.xla_default.final_text)
    return {"program": name, "ratio": result.ratio, "ours_us": rep["ours"]["modeled_us"],
            "xla_us": rep["xla_default"]["modeled_us"], "ours_launches": rep["ours"]["dynamic_launches"],
            "xla_launches": rep["xla_default"]["dynamic_launches"],
            "ours_model_us": _our_model_us(result.final.final, target),
            "xla_model_us": _our_model_us(result.xla_default.final, target),
            "fusions": fusion_rows(result, target)}


def summary(rows: list[dict], worst: int) -> str:
    """The program table, the parity distribution and the worst fusions (Markdown)."""
    out = ["| program | ours, XLA est. us (launches) | XLA default, XLA est. us (launches) | ratio "
           "| ours, hlopt est. us | XLA default, hlopt est. us | fusions rated | median ours/XLA |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    every = []
    for r in rows:
        if "error" in r:
            out.append(f"| {r['program']} | failed: {r['error']} | | | | | | |")
            continue
        every += [f | {"program": r["program"]} for f in r["fusions"]]
        med = statistics.median([f["ratio"] for f in r["fusions"]]) if r["fusions"] else float("nan")
        out.append(f"| {r['program']} | {r['ours_us']:.1f} ({r['ours_launches']}) | {r['xla_us']:.1f} "
                   f"({r['xla_launches']}) | {r['ratio']:.3f} | {r['ours_model_us']:.1f} | {r['xla_model_us']:.1f} | "
                   f"{len(r['fusions'])} | {med:.3f} |")
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    if ratios:
        out.append(f"\nprograms: median ratio {statistics.median(ratios):.3f}, max {max(ratios):.3f}, "
                   f"{sum(x <= 0.98 for x in ratios)}/{len(ratios)} at or below 0.98, "
                   f"{sum(x > 1.02 for x in ratios)} above 1.02")
    if every:
        fr = [f["ratio"] for f in every]
        dev = [abs(x - 1) for x in fr]
        out.append(f"fusions: {len(fr)}; median |ours/XLA - 1| {statistics.median(dev):.1%}; "
                   f"within +-25% {sum(d <= 0.25 for d in dev) / len(dev):.1%}; "
                   f"XLA above 1.5x ours: {sum(x < 1 / 1.5 for x in fr)}")
        out.append("\n| program | fusion | emitter | ours us | XLA us | ours/XLA |\n|---|---|---|---:|---:|---:|")
        ranked = sorted(every, key=lambda f: -abs(f["ratio"] - 1))[:worst]
        out += [f"| {f['program']} | {f['name']} | {f['emitter']} | {f['ours_us']:.3f} | {f['xla_us']:.3f} | "
                f"{f['ratio']:.3f} |" for f in ranked]
        out.append("")
        for f in ranked:
            out.append(f"--- {f['program']} / {f['name']} (ours {f['ours_us']:.3f} us, XLA {f['xla_us']:.3f} us)\n"
                       f"{f['text']}")
    return "\n".join(out)


def main() -> int:
    """Print the tables (and write the rows as JSON)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", default="", help="comma-separated names: corpus, larger steps, unseen or fusion_programs")
    ap.add_argument("--corpus", action="store_true", help="reemit_vs_xla.py's corpus programs and larger steps")
    ap.add_argument("--unseen", action="store_true", help="the 1-device programs of corpus/unseen_programs.py")
    ap.add_argument("--fusion-programs", action="store_true", help="corpus/fusion_programs.py")
    ap.add_argument("--worst", type=int, default=20)
    ap.add_argument("--target", default="h100")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--dump", help="write each program's hlopt.hlo, final.hlo and xla_default.hlo under DUMP/NAME/")
    args = ap.parse_args()
    from hlopt.runtime.xla_gpu_path.xla_gpu import INSTALL_COMMAND, available

    if not available():
        print(f"fusion_parity: no XLA:GPU compiler; install it: {INSTALL_COMMAND}", file=sys.stderr)
        return 2
    rows = []
    for name, (text, devices) in texts(args).items():
        rows.append(measure(name, text, devices, args.target, args.dump))
        print(f"{name}: {rows[-1].get('ratio', rows[-1].get('error'))}", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(summary(rows, args.worst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
