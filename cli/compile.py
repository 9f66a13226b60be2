"""`hlopt compile IN --target h100 --out DIR`: hlopt's fusion and schedule kept in an XLA:GPU executable.

Deviceless, through hlopt's XLA:GPU driver (`runtime.xla_gpu`, `runtime.reemit`). Writes DIR/hlopt.hlo (the
scheduled module handed to XLA's backend), DIR/final.hlo (XLA's final module), DIR/executable.bin (the
serialized executable), DIR/xla_default.hlo (XLA's own compile of the same input) and DIR/report.json
(XLA's estimates for ours and for its default compile, their ratio, the fidelity report).
Exit status: 0 done, 1 bad input or a failed step (named), 3 no XLA:GPU compiler (the message names the
install command).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_compile_parser", "cmd_compile", "write_outputs"]


def add_compile_parser(sub: argparse._SubParsersAction) -> None:
    """Register the `compile` verb."""
    from hlopt.runtime.reemit import AFTER_XLA

    p = sub.add_parser("compile", help="compile for XLA:GPU keeping hlopt's fusions and schedule (deviceless)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="HLO text module (as jax lowers it)")
    p.add_argument("--target", required=True, help="GPU: h100, h200, b200, a100")
    p.add_argument("--devices", type=int, default=None,
                   help="number of GPUs (SPMD partitions; default: as many as the module's shardings span)")
    p.add_argument("-p", "--pipeline", default=AFTER_XLA,
                   help=f"hlopt's passes on XLA's module, after XLA's HLO passes (default {AFTER_XLA})")
    p.add_argument("--xla-flags", default="", help="XLA options for every XLA:GPU run; write it with '=': --xla-flags='--xla_a=1 --xla_b=false'")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--json", action="store_true", help="print report.json instead of a summary")
    p.set_defaults(fn=cmd_compile)


def write_outputs(result, out: Path) -> dict[str, Path]:
    """Write a ReemitResult's files into `out`; name -> path."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"hlopt": out / "hlopt.hlo", "final": out / "final.hlo", "executable": out / "executable.bin",
             "xla_default": out / "xla_default.hlo", "report": out / "report.json"}
    paths["hlopt"].write_text(result.hlopt_text)
    paths["final"].write_text(result.final_text)
    paths["executable"].write_bytes(result.executable)
    paths["xla_default"].write_text(result.xla_default.final_text)
    paths["report"].write_text(json.dumps(result.report, indent=1))
    return paths


def cmd_compile(args: argparse.Namespace) -> int:
    """Run the XLA:GPU path on one file."""
    from hlopt.hlo.parser import parse
    from hlopt.runtime.reemit import compile_for_gpu
    from hlopt.runtime.xla_gpu import GpuCompilerMissing, check_target

    try:
        check_target(args.target)
        path = Path(args.input)
        module = parse(path.read_text(), filename=str(path))
        result = compile_for_gpu(module, args.target, args.devices, after=args.pipeline, xla_flags=args.xla_flags)
    except GpuCompilerMissing as e:
        print(f"hlopt compile: {e}", file=sys.stderr)
        return 3
    except (ValueError, OSError, RuntimeError) as e:  # HloParseError is a ValueError
        print(f"hlopt compile: error: {e}", file=sys.stderr)
        return 1
    paths = write_outputs(result, Path(args.out))
    if args.json:
        print(json.dumps(result.report, indent=1))
    else:
        print(result.summary())
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
