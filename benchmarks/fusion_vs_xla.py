"""Our priority-fusion + multi-output-fusion against XLA:GPU's own, both rated by XLA's cost model.

For each program (the corpus's single-device programs plus two larger training steps): XLA:GPU compiles
the unoptimized module with its own fusion passes (deviceless H100, hlopt's XLA:GPU driver, `hlopt.runtime.xla_gpu_path.xla_gpu`);
then XLA:GPU compiles *our* fused module with its fusion passes off, so XLA's own model rates our
fusions. Columns: kernels launched (static count), bytes accessed (HloCostAnalysis of the optimized
module) and XLA's modeled time: the sum over fusions of their `default` estimate (the
`indexing-cost-model` one for block-level `__triton` fusions, whose default is unusable), times trips.

Both sides compile with Triton GEMMs off (`--xla_gpu_enable_triton_gemm=false`: dots become cuBLAS
calls, outside the fusion sum) and without the Triton softmax/normalization rewriter: those fuse GEMM
epilogues and whole softmax/layer-norm blocks into Triton kernels, which hlopt's passes do not emit, so
the comparison is between the two priority fusions themselves. The last column is XLA's default
(Triton on) for reference.

What our module goes through before XLA sees it: `call-inliner,simplify,fusion` (XLA:GPU's pre-fusion
rewrites dot-strength-reduction, select-and-scatter-expander and scatter-simplifier, then priority-fusion and
multi-output-fusion), then every layout is set to the default (row-major) one and XLA's
`layout-assignment` is switched off with the fusion passes: XLA's layout assignment clears the layouts
inside pre-existing fusions and its later passes abort on them (see docs/notes/priority-fusion.md).
`computation-deduplicator` is off too: it would share identical fused computations between fusions,
which XLA's verifier rejects. Neither changes kernels: layouts stay logical, dedup only renames.

    python3 benchmarks/fusion_vs_xla.py [--programs a,b] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from hlopt.corpus.training_steps import larger_programs
from hlopt.corpus.xla_reference import available, corpus_programs, xla_gpu_compile
from hlopt.runtime.xla_gpu_path.xla_gpu import KEEP_OUR_FUSIONS as KEEP_OURS

OUR_PIPELINE = "call-inliner,simplify,fusion"
NO_TRITON_FLAGS = "--xla_gpu_enable_triton_gemm=false"
NO_TRITON_PASSES = "triton-softmax-rewriter"
#: Programs XLA:GPU cannot compile at all (LAPACK custom calls have no CUDA handler).
SKIP = {"linalg", "lapack_batched"}


def default_layouts(text: str) -> str:
    """The module with every array shape in the default layout (layouts are physical only)."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import default_layouts as in_place

    from hlopt import hlo

    return in_place(hlo.parse(text)).to_text()


def modeled_time_us(report: dict) -> float:
    """XLA's modeled time: per fusion the default estimate (indexing model for block-level Triton)."""
    total = 0.0
    for f in report.get("fusions", []):
        est = f.get("exec_time_us", {})
        col = "indexing-cost-model" if f.get("backend_kind") == "__triton" and "indexing-cost-model" in est \
            else "default"
        total += float(est.get(col) or 0.0) * float(f.get("times") or 1)
    return total


def ours(text: str) -> str:
    """Our fused module, as handed to XLA."""
    from hlopt.passes.framework.pipeline import run_pipeline

    from hlopt import hlo

    module = hlo.parse(text)
    run_pipeline(module, OUR_PIPELINE)
    return default_layouts(module.to_text())


def compile_without_triton(text: str, disable: str = "") -> dict:
    """XLA:GPU's report for `text` compiled with Triton GEMMs and Triton softmax fusion off."""
    passes = ",".join(p for p in (NO_TRITON_PASSES, disable) if p)
    return xla_gpu_compile(text, disable_passes=passes, xla_flags=NO_TRITON_FLAGS)


def measure(name: str, text: str) -> dict:
    """One row of the table."""
    row: dict = {"program": name}
    row["xla_triton_time_us"] = modeled_time_us(xla_gpu_compile(text))
    xla = compile_without_triton(text)
    row.update(xla_kernels=xla["kernels"]["static"]["total"], xla_bytes=xla["cost_analysis"]["bytes_accessed"],
               xla_time_us=modeled_time_us(xla))
    fused = ours(text)
    try:
        mine = compile_without_triton(fused, KEEP_OURS)
    except RuntimeError as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip() and "@" not in ln and "cudart" not in ln]
        row["error"] = (lines[-1] if lines else str(e))[:160]
        return row
    row.update(our_kernels=mine["kernels"]["static"]["total"], our_bytes=mine["cost_analysis"]["bytes_accessed"],
               our_time_us=modeled_time_us(mine))
    row["time_ratio"] = row["our_time_us"] / row["xla_time_us"] if row["xla_time_us"] else float("nan")
    return row


def table(rows: list[dict]) -> str:
    """Markdown table with a summary line."""
    out = ["| program | kernels XLA | kernels ours | bytes XLA | bytes ours | modeled us XLA | modeled us ours "
           "| ratio | XLA with Triton, us |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['program']} | {r['xla_kernels']} | - | {r['xla_bytes']:.0f} | - "
                       f"| {r['xla_time_us']:.3f} | XLA rejected ours: {r['error']} | - | {r['xla_triton_time_us']:.3f} |")
            continue
        out.append(f"| {r['program']} | {r['xla_kernels']} | {r['our_kernels']} | {r['xla_bytes']:.0f} "
                   f"| {r['our_bytes']:.0f} | {r['xla_time_us']:.3f} | {r['our_time_us']:.3f} "
                   f"| {r['time_ratio']:.2f} | {r['xla_triton_time_us']:.3f} |")
    ratios = [r["time_ratio"] for r in rows if r.get("time_ratio") == r.get("time_ratio") and "time_ratio" in r]
    if ratios:
        out.append(f"\nmedian ratio {statistics.median(ratios):.3f}, max {max(ratios):.3f} over "
                   f"{len(ratios)} programs ({len(rows) - len(ratios)} not rated)")
    return "\n".join(out)


def main() -> int:
    """Print the table (markdown) or JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", help="comma-separated program names (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not available():
        print("XLA:GPU compiler not installed: run python3 -m hlopt.runtime.xla_gpu_path.xla_gpu install", file=sys.stderr)
        return 1
    wanted = set(args.programs.split(",")) if args.programs else None
    programs = [p for p in corpus_programs() + larger_programs() if p[0] not in SKIP]
    rows = [measure(n, t) for n, t in programs if wanted is None or n in wanted]
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
