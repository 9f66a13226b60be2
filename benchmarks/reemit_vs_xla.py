"""hlopt + XLA:GPU (the re-emission path of `runtime.xla_gpu_path.reemit`) against XLA:GPU alone, deviceless, per program.

    python3 benchmarks/reemit_vs_xla.py [--programs a,b] [--larger] [--collective] [--unseen] [--numerics] [--target h100] [--xla-flags=...] [--json]

For each corpus program (corpus/programs.py; 8-device ones on 8 GPUs): whether the path compiles (else the
step that failed), how many of hlopt's launches the final module kept, whether their order was kept
(moves attributed to a named backend step are allowed), the modeled time of ours and of XLA's default
compile by XLA's own estimates (the module simulated in its order: per-fusion estimates and launch overhead on the
compute stream, collectives on XLA's `sol` estimates on their own streams; `runtime.xla_gpu_path.xla_gpu.estimate`) and
their ratio, and
the wall time of the whole path (with --numerics: XLA's step-2 module and our rewrite of it run on XLA:CPU
with the same inputs and compared, cuDNN/cuBLAS calls lowered back to convolution/dot). "no estimate" counts launches XLA gives no estimate of (library calls,
bare sorts, collectives): they count only their launch overhead, on both sides. Needs the XLA:GPU compiler (`pip install 'hlopt[gpu-compile]'`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from hlopt.corpus import use_cpu_devices

use_cpu_devices()  # 8 CPU devices and JAX_PLATFORMS=cpu, before jax is imported

#: A few small programs: a convolution, a scan, a training step, a collective program.
DEFAULT_PROGRAMS = ["mlp_grad", "conv_net_grad", "scan_rnn", "elementwise_math", "transformer_train_step",
                    "shmap_psum_in_scan"]


def numerics(result) -> str:
    """XLA's step-2 module and our rewrite of it run on XLA:CPU with the same inputs: "ok", "DIFF" or why not."""
    from hlopt.runtime import run_and_compare
    from hlopt.runtime.execution.gpu_library_calls import lower_library_calls

    try:
        stage, ours = lower_library_calls(result.xla_stage.final), lower_library_calls(result.hlopt_module)
        return "ok" if run_and_compare(stage, ours, rtol=1e-4, atol=1e-4).ok else "DIFF"
    except Exception as e:
        return f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:60]})"


def collective_texts() -> dict[str, tuple[str, int]]:
    """The 8-way FSDP MLP step of schedule_vs_xla.py: name -> (text, devices)."""
    from hlopt.corpus.training_steps import eight_device_steps as programs

    return {name: (text, 8) for name, text in programs(["fsdp_mlp_4x2048"])}


def measure(name: str, target: str, xla_flags: str, text_and_devices: tuple[str, int] | None = None,
            check_numerics: bool = False) -> dict:
    """One row."""
    from hlopt.corpus.programs import program_text
    from hlopt.runtime.xla_gpu_path.reemit import compile_for_gpu

    text, devices = text_and_devices or program_text(name)
    row: dict = {"program": name, "devices": devices}
    started = time.perf_counter()
    try:
        result = compile_for_gpu(text, target, devices, xla_flags=xla_flags)
    except RuntimeError as e:
        row.update(compiles=False, error=str(e).splitlines()[0][:200], seconds=time.perf_counter() - started)
        return row
    kept = result.report["fidelity"]["summary"]
    row.update(compiles=True, seconds=time.perf_counter() - started, launches=kept["launches"],
               launches_kept=kept["kept"], moved=kept["moved"], moved_unattributed=kept["moved_unattributed"],
               order_kept=kept["order_kept"], ours_us=result.report["ours"]["modeled_us"],
               xla_us=result.report["xla_default"]["modeled_us"], ratio=result.ratio,
               ours_launches=result.report["ours"]["dynamic_launches"],
               xla_launches=result.report["xla_default"]["dynamic_launches"],
               ours_unestimated=result.report["ours"]["unestimated_launches"],
               xla_unestimated=result.report["xla_default"]["unestimated_launches"],
               compile_seconds=result.report["compile_seconds"])
    if check_numerics:
        row["numerics"] = numerics(result)
    return row


def table(rows: list[dict]) -> str:
    """The Markdown table."""
    numerics = any("numerics" in r for r in rows)
    lines = ["| program | devices | compiles | launches kept | order kept (moved) | ours, us (launches) "
             "| XLA, us (launches) | ratio | no estimate (ours/XLA) | compile s |" + (" numerics |" if numerics else ""),
             "|---|---:|---|---:|---|---:|---:|---:|---:|---:|" + ("---|" if numerics else "")]
    for r in rows:
        if not r["compiles"]:
            lines.append(f"| {r['program']} | {r['devices']} | no: {r['error']} | | | | | | | {r['seconds']:.1f} |")
            continue
        lines.append(f"| {r['program']} | {r['devices']} | yes | {r['launches_kept']}/{r['launches']} | "
                     f"{'yes' if r['order_kept'] else 'no'} ({r['moved']}) | {r['ours_us']:.1f} ({r['ours_launches']}) | "
                     f"{r['xla_us']:.1f} ({r['xla_launches']}) | {r['ratio']:.2f} | "
                     f"{r['ours_unestimated']}/{r['xla_unestimated']} | {r['seconds']:.1f} |"
                     + (f" {r.get('numerics', '')} |" if numerics else ""))
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    if ratios:
        lines.append(f"\nmedian ratio {statistics.median(ratios):.2f}, max {max(ratios):.2f}; "
                     f"{sum(r['compiles'] for r in rows)}/{len(rows)} programs compile")
    return "\n".join(lines)


def main() -> int:
    """Print the table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", help=f"comma-separated corpus programs (default {','.join(DEFAULT_PROGRAMS)}; "
                    "--programs= for none)")
    ap.add_argument("--target", default="h100")
    ap.add_argument("--xla-flags", default="")
    ap.add_argument("--larger", action="store_true", help="add the two larger training steps (hlopt.corpus.training_steps)")
    ap.add_argument("--collective", action="store_true", help="add the 8-way FSDP step (hlopt.corpus.training_steps)")
    ap.add_argument("--unseen", action="store_true",
                    help="add the programs written after the corpus (corpus/unseen_programs.py)")
    ap.add_argument("--numerics", action="store_true",
                    help="also run XLA's step-2 module and our rewrite of it on XLA:CPU and compare")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from hlopt.runtime.xla_gpu_path.xla_gpu import INSTALL_COMMAND, available

    if not available():
        print(f"reemit_vs_xla: no XLA:GPU compiler; install it: {INSTALL_COMMAND}", file=sys.stderr)
        return 2
    names = [n for n in args.programs.split(",") if n] if args.programs is not None else DEFAULT_PROGRAMS
    rows = [measure(n, args.target, args.xla_flags, None, args.numerics) for n in names]
    if args.larger:
        from hlopt.corpus.training_steps import larger_texts

        rows += [measure(n, args.target, args.xla_flags, t, args.numerics) for n, t in larger_texts().items()]
    if args.collective:
        rows += [measure(n, args.target, args.xla_flags, t, args.numerics) for n, t in collective_texts().items()]
    if args.unseen:
        from hlopt.corpus.unseen_programs import unseen_texts

        rows += [measure(n, args.target, args.xla_flags, t, args.numerics) for n, t in unseen_texts().items()]
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0 if all(r["compiles"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
