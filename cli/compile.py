"""`hlopt compile IN --target h100 --out DIR`: hlopt's fusion and schedule kept in an XLA:GPU executable.

Deviceless, through hlopt's XLA:GPU driver (`runtime.xla_gpu_path.xla_gpu`, `runtime.xla_gpu_path.reemit`). Writes DIR/hlopt.hlo (the
scheduled module handed to XLA's backend), DIR/final.hlo (XLA's final module of it), DIR/executable.bin (the
serialized executable kept by the guard: ours, or XLA's default compile where XLA's own estimates rate it
faster; `--no-guard` keeps ours), DIR/xla_default.hlo (XLA's own compile of the same input), DIR/report.json
(XLA's estimates for ours and for its default compile, their ratio, "guard": which was kept, the fidelity
report) and DIR/signature.json (target, devices, argument and result shapes: `hlopt run DIR --inputs X.npz`
and `runtime.load(DIR)` run it on a GPU host). IN may be an XLA dump directory: every module is compiled into DIR/<module file stem>/, each with
its own result; a module that fails is named with its reason and the others go on.
Exit status: 0 done, 1 bad input or a failed step (named), 3 no XLA:GPU compiler (the message names the
install command).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_compile_parser", "cmd_compile", "write_outputs", "prepare_out", "add_run_parser", "cmd_run"]


def add_compile_parser(sub: argparse._SubParsersAction) -> None:
    """Register the `compile` verb."""
    from hlopt.runtime.xla_gpu_path.reemit import AFTER_XLA

    p = sub.add_parser("compile", help="compile for XLA:GPU keeping hlopt's fusions and schedule (deviceless)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="HLO text module (as jax lowers it), or an XLA dump directory")
    p.add_argument("--target", required=True, help="GPU: h100, h200, b200, a100")
    p.add_argument("--devices", type=int, default=None,
                   help="number of GPUs (SPMD partitions; default: as many as the module's shardings span)")
    p.add_argument("-p", "--pipeline", default=AFTER_XLA,
                   help=f"hlopt's passes on XLA's module, after XLA's HLO passes (default {AFTER_XLA})")
    p.add_argument("--xla-flags", default="", help="XLA options for every XLA:GPU run; write it with '=': --xla-flags='--xla_a=1 --xla_b=false'")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--json", action="store_true", help="print report.json instead of a summary")
    p.add_argument("--no-guard", dest="guard", action="store_false",
                   help="keep hlopt's executable even where XLA's estimates rate XLA's default compile faster")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first module that fails (dump directories)")
    p.set_defaults(fn=cmd_compile)


def write_outputs(result, out: Path) -> dict[str, Path]:
    """Write a ReemitResult's files into `out` (atomically, one by one); name -> path. executable.bin is the
    executable the guard kept (`ReemitResult.kept_result`)."""
    from hlopt.cli.common import atomic_path

    out.mkdir(parents=True, exist_ok=True)
    from hlopt.runtime.xla_gpu_path.saved import SIGNATURE_FILE, signature_of

    paths = {"hlopt": out / "hlopt.hlo", "final": out / "final.hlo", "executable": out / "executable.bin",
             "xla_default": out / "xla_default.hlo", "report": out / "report.json", "signature": out / SIGNATURE_FILE}
    signature = signature_of(result.hlopt_module, result.target, result.devices, result.kept)
    contents: dict[str, str | bytes] = {
        "hlopt": result.hlopt_text, "final": result.final_text, "executable": result.kept_result.executable,
        "xla_default": result.xla_default.final_text, "report": json.dumps(result.report, indent=1),
        "signature": json.dumps(signature.as_dict(), indent=1)}
    for name, path in paths.items():
        data = contents[name]
        atomic_path(path, lambda tmp, data=data: Path(tmp).write_bytes(data) if isinstance(data, bytes)
                    else Path(tmp).write_text(data))
    return paths


def prepare_out(out: Path) -> None:
    """Check, before compiling, that the output folder can be made and written (what this makes is removed
    again); SystemExit with one line naming the folder and why it cannot be."""
    made = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".hlopt-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise SystemExit(f"hlopt compile: error: --out {out}: cannot write there ({e.strerror or e})") from None
    finally:
        for folder in made:  # deepest first
            if folder.is_dir():
                folder.rmdir()


def cmd_compile(args: argparse.Namespace) -> int:
    """Run the XLA:GPU path on one file, or on every module of a dump directory."""
    from hlopt.cli.common import is_collection, load_inputs, report_failures, run_each
    from hlopt.passes.framework.pipeline import parse_pipeline
    from hlopt.runtime.xla_gpu_path.xla_gpu import GpuCompilerMissing, check_target, require_compiler

    try:
        check_target(args.target)
        parse_pipeline(args.pipeline)  # a bad spec fails before anything else
    except ValueError as e:
        print(f"hlopt compile: error: {e}", file=sys.stderr)
        return 1
    try:
        require_compiler()
    except GpuCompilerMissing as e:
        print(f"hlopt compile: {e}", file=sys.stderr)
        return 3
    collection = is_collection(args.input)
    inputs = load_inputs(args.input)
    out = Path(args.out)
    results = []

    def work(name: str, text: str):
        target = out / Path(name).name.removesuffix(".txt").removesuffix(".hlo") if collection else out
        try:
            result = _compile_one(name, text, args)
        except (ValueError, OSError, RuntimeError) as e:  # HloParseError is a ValueError
            message = str(e).strip()
            raise SystemExit(f"hlopt compile: error: {message if message.startswith(name) else f'{name}: {message}'}"
                             ) from None
        paths = write_outputs(result, target)
        results.append((name, result, paths))
        return result.report

    try:
        prepare_out(out)
        outcomes = run_each(inputs, work, collection, args.fail_fast)
    except SystemExit as e:  # one module's error, one line
        if e.code in (None, 0):
            raise
        print(e.code, file=sys.stderr)
        return 1
    if args.json:
        reports = [o.result if o.ok else {"file": o.name, "error": o.error} for o in outcomes]
        print(json.dumps(reports if collection else reports[0], indent=1))
    else:
        for name, result, paths in results:
            if collection:
                print(f"{name}:")
            print(result.summary())
            print("wrote " + ", ".join(str(p) for p in paths.values()))
    return report_failures(outcomes)


def _compile_one(name: str, text: str, args: argparse.Namespace):
    from hlopt.hlo.parser import parse
    from hlopt.runtime.xla_gpu_path.reemit import compile_for_gpu

    module = parse(text, filename=name)
    return compile_for_gpu(module, args.target, args.devices, after=args.pipeline, xla_flags=args.xla_flags,
                           guard=args.guard)


# ----------------------------------------------------------------------------- hlopt run


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    """Register the `run` verb: an executable `hlopt compile` wrote, run on this machine's GPU."""
    p = sub.add_parser("run", help="run what `hlopt compile` wrote on this machine's GPU",
                       description="Load DIR/executable.bin (written by `hlopt compile`) on this machine's GPU and "
                                   "run it on the arrays of an .npz (sorted by key, checked against "
                                   "DIR/signature.json); without the GPU it was compiled for, one line says so.")
    p.add_argument("directory", help="a folder `hlopt compile --out` wrote")
    p.add_argument("--inputs", required=True, help=".npz with one array per argument (sorted by key)")
    p.add_argument("-o", "--output", help="write the results to this .npz (result_0, result_1, ...)")
    p.set_defaults(fn=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """Check the inputs against the signature, load the executable, run it, print or save the results."""
    import numpy as np
    from hlopt.runtime.xla_gpu_path.saved import NoGpuError, check_inputs, load, read_signature

    try:
        signature = read_signature(args.directory)
        with np.load(args.inputs) as data:
            inputs = [data[k] for k in sorted(data.files)]
        check_inputs(signature, inputs)
        results = load(args.directory).run(inputs)
    except (ValueError, OSError, NoGpuError) as e:
        print(f"hlopt run: error: {e}", file=sys.stderr)
        return 1
    if args.output:
        np.savez(args.output, **{f"result_{i}": r for i, r in enumerate(results)})
    for i, r in enumerate(results):
        print(f"result {i}: {r.dtype}{list(r.shape)}")
    return 0
