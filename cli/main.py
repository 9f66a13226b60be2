"""The `hlopt` command line: opt, check, stats, passes, cost, schedule, demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["main", "build_parser"]


def _ensure_cpu_devices(n: int = 8) -> None:
    """Ask XLA:CPU for `n` devices; must run before jax is imported."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags and "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={n}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


# ----------------------------------------------------------------------------- inputs


def _looks_like_hlo(path: Path) -> bool:
    try:
        with path.open() as f:
            return f.read(4096).lstrip().startswith("HloModule")
    except (OSError, UnicodeDecodeError):
        return False


def load_inputs(source: str) -> list[tuple[str, str]]:
    """(name, text) of each module: a file, '-' for stdin, or every HLO module in an XLA dump directory."""
    if source == "-":
        return [("stdin", sys.stdin.read())]
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".txt", ".hlo") and _looks_like_hlo(p))
        if not files:
            raise SystemExit(f"hlopt: no HLO modules in directory {path}")
        return [(str(p), p.read_text()) for p in files]
    if not path.exists():
        raise SystemExit(f"hlopt: no such file: {path}")
    return [(str(path), path.read_text())]


def _parse(name: str, text: str):
    from hlopt import hlo

    try:
        return hlo.parse(text, filename=name)
    except hlo.HloParseError as e:
        raise SystemExit(str(e)) from None


def _verify(module) -> None:
    from hlopt import hlo

    try:
        hlo.verify(module)
    except (ImportError, AttributeError):
        return
    except Exception as e:  # HloVerifyError
        raise SystemExit(f"hlopt: module {module.name} does not verify:\n{e}") from None


def _load_plugins(files: list[str] | None) -> None:
    from hlopt.passes.registry import load_plugin_file

    for f in files or []:
        try:
            load_plugin_file(f)
        except FileNotFoundError as e:
            raise SystemExit(f"hlopt: {e}") from None


def _build_pipeline(args: argparse.Namespace):
    from hlopt.passes.config import ConfigError, load_pipeline_config
    from hlopt.passes.pipeline import Pipeline, PipelineError, parse_pipeline

    try:
        if getattr(args, "config", None):
            pipeline = load_pipeline_config(args.config)
        elif args.pipeline:
            pipeline = Pipeline(parse_pipeline(args.pipeline))
        else:
            return None
    except (PipelineError, ConfigError) as e:
        raise SystemExit(f"hlopt: {e}") from None
    pipeline.verify_each = getattr(args, "verify_each", True)
    if getattr(args, "dump_dir", None):
        pipeline.dump_dir = Path(args.dump_dir)
    pipeline.timing = getattr(args, "timing", False)
    return pipeline


def _run_pipeline(pipeline, module):
    from hlopt.passes.pipeline import PassFailure

    try:
        return pipeline.run(module)
    except PassFailure as e:
        raise SystemExit(f"hlopt: {e}") from None


# ----------------------------------------------------------------------------- verbs


def cmd_opt(args: argparse.Namespace) -> int:
    """Parse, verify, run a pipeline, print."""
    _load_plugins(args.load)
    inputs = load_inputs(args.input)
    out_is_dir = args.output and (len(inputs) > 1 or Path(args.input).is_dir())
    if out_is_dir:
        Path(args.output).mkdir(parents=True, exist_ok=True)
    for name, text in inputs:
        module = _parse(name, text)
        _verify(module)
        pipeline = _build_pipeline(args)
        result = _run_pipeline(pipeline, module) if pipeline else None
        if args.explain and pipeline is not None:
            _print_explanations(pipeline)
        out_text = module.to_text()
        if out_is_dir:
            (Path(args.output) / Path(name).name).write_text(out_text)
        elif args.output:
            Path(args.output).write_text(out_text)
        else:
            sys.stdout.write(out_text)
        if result is not None and args.timing:
            print(f"# {name}\n{result.timing_table()}", file=sys.stderr)
    return 0


def _print_explanations(pipeline) -> None:
    for p in pipeline.passes:
        fn = getattr(p, "explain_lines", None)
        if callable(fn):
            for line in fn():
                print(line, file=sys.stderr)


def cmd_check(args: argparse.Namespace) -> int:
    """Run the module before and after the pipeline on XLA CPU with the same inputs; compare."""
    _ensure_cpu_devices(max(8, args.devices or 1))
    _load_plugins(args.load)
    import numpy as np

    from hlopt import runtime

    reports = []
    failed = False
    for name, text in load_inputs(args.input):
        module = _parse(name, text)
        _verify(module)
        original = module.clone()
        pipeline = _build_pipeline(args)
        if pipeline is not None:
            _run_pipeline(pipeline, module)
        if args.inputs:
            data = np.load(args.inputs)
            inputs = [data[k] for k in sorted(data.files, key=_natural_key)]
        else:
            inputs = runtime.random_inputs(original, seed=args.seed)
        try:
            expected = runtime.execute(original, inputs, devices=args.devices)
            actual = runtime.execute(module, inputs, devices=args.devices) if pipeline is not None else expected
        except Exception as e:  # noqa: BLE001 - XLA's rejection, reported plainly
            raise SystemExit(f"hlopt: XLA could not run {name}: {e}") from None
        cmp = runtime.compare(expected, actual, rtol=args.rtol, atol=args.atol)
        failed |= not cmp.ok
        reports.append({"module": name, "ok": bool(cmp.ok), "outputs": len(expected), "report": str(cmp),
                        "pipeline": pipeline.spec if pipeline is not None else None})
        if not args.json:
            status = "OK" if cmp.ok else "MISMATCH"
            print(f"{status}: {name}: {len(expected)} output(s) compared"
                  + (f" after pipeline {pipeline.spec}" if pipeline is not None else ""))
            if not cmp.ok:
                print(str(cmp))
    if args.json:
        print(json.dumps({"ok": not failed, "modules": reports}, indent=2))
    return 1 if failed else 0


def _natural_key(s: str) -> tuple:
    import re

    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


def cmd_stats(args: argparse.Namespace) -> int:
    """Opcode histogram, computations, parameter/output bytes."""
    from collections import Counter

    out = []
    for name, text in load_inputs(args.input):
        module = _parse(name, text)
        hist = Counter(i.opcode for i in module.instructions())
        entry = module.entry
        stats = {
            "module": module.name,
            "file": name,
            "computations": len(module.computations),
            "instructions": module.instruction_count(),
            "entry_parameters": len(entry.parameters),
            "parameter_bytes": sum(p.shape.byte_size for p in entry.parameters),
            "output_bytes": entry.root.shape.byte_size,
            "is_scheduled": module.is_scheduled,
            "opcodes": dict(hist.most_common()),
        }
        out.append(stats)
        if not args.json:
            _print_stats(stats)
    if args.json:
        print(json.dumps(out if len(out) > 1 else out[0], indent=2))
    return 0


def _print_stats(stats: dict) -> None:
    from hlopt.cli.console import table_console
    from rich.table import Table

    console = table_console()
    console.print(f"[bold]{stats['module']}[/bold] ({stats['file']}): {stats['computations']} computations, "
                  f"{stats['instructions']} instructions, parameters {stats['parameter_bytes']:,} B "
                  f"({stats['entry_parameters']}), outputs {stats['output_bytes']:,} B"
                  + (", scheduled" if stats["is_scheduled"] else ""))
    table = Table("opcode", "count")
    for op, n in stats["opcodes"].items():
        table.add_row(op, str(n))
    console.print(table)


def cmd_passes(args: argparse.Namespace) -> int:
    """List the registered passes with their options and docstrings."""
    import dataclasses

    from hlopt.passes.pipeline import NAMED_PIPELINES
    from hlopt.passes.registry import pass_options, registered_passes

    _load_plugins(args.load)
    rows = []
    for name, cls in registered_passes().items():
        options = []
        for f in pass_options(cls):
            default = f.default if f.default is not dataclasses.MISSING else None
            options.append({"name": f.name, "type": str(f.type), "default": repr(default)})
        doc = (cls.__doc__ or "").strip()
        rows.append({"name": name, "options": options, "doc": doc})
    if args.json:
        print(json.dumps({"passes": rows, "pipelines": NAMED_PIPELINES}, indent=2))
        return 0
    for r in rows:
        opts = ", ".join(f"{o['name']}={o['default']}" for o in r["options"])
        print(f"{r['name']}" + (f"  {{{opts}}}" if opts else ""))
        first = r["doc"].split("\n\n")[0].replace("\n", " ")
        if first:
            print(f"    {first}")
    print("\nnamed pipelines:")
    for k, v in NAMED_PIPELINES.items():
        print(f"  {k} = {v}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The end-to-end demo."""
    _ensure_cpu_devices(8)
    from hlopt.cli.demo import run_demo

    return run_demo(Path(args.out))


# ----------------------------------------------------------------------------- parser


def _add_pipeline_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-p", "--pipeline", help="pipeline spec, e.g. 'call-inliner,fix(algebraic-simplifier,dce)'")
    p.add_argument("--config", help="pipeline configuration file (.json/.yaml)")
    p.add_argument("--load", action="append", metavar="FILE.py", help="load user passes from a Python file")
    p.add_argument("--verify-each", dest="verify_each", action="store_true", default=True,
                   help="verify the module around every pass (default)")
    p.add_argument("--no-verify-each", dest="verify_each", action="store_false")


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for every verb."""
    parser = argparse.ArgumentParser(prog="hlopt", description="Optimize XLA HLO in Python.")
    sub = parser.add_subparsers(dest="verb", required=True)

    p = sub.add_parser("opt", help="parse, verify, run a pipeline, print")
    p.add_argument("input", help="HLO file, '-' for stdin, or an XLA dump directory")
    p.add_argument("-o", "--output", help="output file (or directory for a dump directory)")
    _add_pipeline_args(p)
    p.add_argument("--dump-dir", help="write the module after each pass into this directory")
    p.add_argument("--timing", action="store_true", help="print per-pass time and instruction counts")
    p.add_argument("--explain", action="store_true", help="print why each fusion candidate was taken or refused")
    p.set_defaults(fn=cmd_opt)

    p = sub.add_parser("check", help="run before/after the pipeline on XLA CPU and compare outputs")
    p.add_argument("input")
    _add_pipeline_args(p)
    p.add_argument("--inputs", help=".npz with the inputs (sorted by key); random dtype-valid inputs otherwise")
    p.add_argument("--devices", type=int, default=None, help="number of CPU devices (default: from the module)")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_check)

    p = sub.add_parser("stats", help="opcode histogram, computations, parameter/output bytes")
    p.add_argument("input")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_stats)

    p = sub.add_parser("passes", help="list passes with their options")
    p.add_argument("--load", action="append", metavar="FILE.py")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_passes)

    p = sub.add_parser("demo", help="a short end-to-end showing of hlopt")
    p.add_argument("--out", default="hlopt-demo", help="output directory (default ./hlopt-demo)")
    p.set_defaults(fn=cmd_demo)

    for adder in _optional_verbs():
        adder(sub)
    return parser


def _optional_verbs() -> list[Callable]:
    adders = []
    for mod, fn in (("hlopt.cost_model.cli", "add_cost_parser"), ("hlopt.scheduler.cli", "add_schedule_parsers"),
                    ("hlopt.cli.compile", "add_compile_parser")):
        try:
            module = __import__(mod, fromlist=[fn])
        except ImportError:
            continue
        if hasattr(module, fn):
            adders.append(getattr(module, fn))
    return adders


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hlopt` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("check", "demo", "schedule", "bench-schedule"):
        _ensure_cpu_devices(8)
    args = build_parser().parse_args(argv)
    return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
