"""The `hlopt` command line: opt, check, stats, passes, cost, schedule, demo."""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from hlopt.cli.common import (
    ModuleOutcome,
    is_collection,
    load_inputs,
    positive_int,
    report_failures,
    run_each,
    warn,
    write_atomic,
)

__all__ = ["main", "build_parser", "load_inputs"]


def _ensure_cpu_devices(n: int = 8) -> None:
    """Ask XLA:CPU for `n` devices; must run before jax is imported."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags and "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={n}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


# ----------------------------------------------------------------------------- inputs


def add_lenient_flag(parser: argparse.ArgumentParser) -> None:
    """`--lenient`: keep attributes XLA's parser does not know (modules from newer XLA versions), with a warning."""
    parser.add_argument("--lenient", action="store_true",
                        help="keep attributes XLA's parser does not know verbatim (newer XLA versions), with a warning")


def parse_module(name: str, text: str, lenient: bool = False):
    """Parse one module; a parse error becomes one `file:line:col: error: ...` line (SystemExit)."""
    import inspect

    from hlopt import hlo

    kwargs = {"lenient": True} if lenient else {}
    if lenient and "lenient" not in inspect.signature(hlo.parse).parameters:
        raise SystemExit("hlopt: --lenient: this version of hlopt's parser has no lenient mode")
    if is_mlir_text(text):
        text = _hlo_from_mlir(name, text)
    try:
        return hlo.parse(text, filename=name, **kwargs)
    except hlo.HloParseError as e:
        raise SystemExit(str(e)) from None


_parse = parse_module

_MLIR_START = re.compile(r"\s*(?:#loc\w*\s*=.*\n\s*)*(?:module\b|func\.func\b|\"builtin\.module\")")


def is_mlir_text(text: str) -> bool:
    """Whether `text` is an MLIR module (StableHLO or MHLO: jax's `Lowered.as_text()` default) rather than
    HLO text."""
    return not text.lstrip().startswith("HloModule") and _MLIR_START.match(text[:4096]) is not None


def _hlo_from_mlir(name: str, text: str) -> str:
    """The HLO text of a StableHLO/MHLO module, converted through jaxlib; one line if it cannot be."""
    from hlopt.cli.common import start_xla_quietly

    _ensure_cpu_devices(8)
    start_xla_quietly()
    from hlopt.runtime import XlaError, mlir_to_hlo_text

    try:
        return mlir_to_hlo_text(text)
    except XlaError as e:
        reason = str(e).splitlines()[1] if len(str(e).splitlines()) > 1 else str(e)
        raise SystemExit(f"hlopt: {name}: StableHLO/MHLO text that jaxlib could not convert to HLO ({reason.strip()}); "
                         "write HLO text with jax's `lowered.as_text(dialect='hlo')` or "
                         "`XLA_FLAGS=--xla_dump_to=DIR`") from None


def add_no_verify_flag(parser: argparse.ArgumentParser) -> None:
    """`--no-verify`: report on a module that does not verify (the figures may mean nothing)."""
    parser.add_argument("--no-verify", dest="verify", action="store_false", default=True,
                        help="do not verify the input module first (its figures may then mean nothing)")


def parse_and_verify(name: str, text: str, args: argparse.Namespace):
    """Parse one module and, unless `--no-verify`, verify it; both errors are one line (SystemExit)."""
    module = parse_module(name, text, _lenient(args))
    if getattr(args, "verify", True):
        _verify(module, " (--no-verify reports on it anyway)")
    return module


def _verify(module, hint: str = "") -> None:
    """Verify `module`; its errors become one message (the first line, then the verifier's context)."""
    from hlopt import hlo

    try:
        hlo.verify(module)
    except hlo.HloVerifyError as e:
        lines = str(e).splitlines()
        body = lines[1:] or lines
        raise SystemExit(f"hlopt: module {module.name} does not verify: {body[0]}{hint}"
                         + "".join("\n" + line for line in body[1:])) from None


def _load_plugins(files: list[str] | None) -> None:
    from hlopt.passes.framework.registry import load_plugin_file

    for f in files or []:
        try:
            load_plugin_file(f)
        except FileNotFoundError as e:
            raise SystemExit(f"hlopt: {e}") from None
        except SyntaxError as e:
            raise SystemExit(f"hlopt: {e.filename}:{e.lineno}:{e.offset or 0}: error: {e.msg} (in --load file)") from None
        except Exception as e:  # noqa: BLE001 - the user's file raised while being imported
            raise SystemExit(f"hlopt: --load {f}: importing it raised {type(e).__name__}: {e}") from None


def _load_config(path: str):
    """The pipeline of a --config file (pydantic, which reads it, is imported only here)."""
    from hlopt.passes.framework.config import ConfigError, load_pipeline_config

    try:
        return load_pipeline_config(path)
    except ConfigError as e:
        raise SystemExit(f"hlopt: {e}") from None
    except OSError as e:
        raise SystemExit(f"hlopt: --config {path}: {e.strerror or e}") from None


def _build_pipeline(args: argparse.Namespace):
    from hlopt.passes.framework.pipeline import Pipeline, PipelineError, parse_pipeline

    try:
        if getattr(args, "config", None):
            pipeline = _load_config(args.config)
        elif args.pipeline:
            pipeline = Pipeline(parse_pipeline(args.pipeline))
        else:
            return None
    except PipelineError as e:
        raise SystemExit(f"hlopt: {e}") from None
    verify_each = getattr(args, "verify_each", True)
    pipeline.verify_each = bool(verify_each)
    if verify_each == "every-pass":
        pipeline.verify_in_fix = "every-pass"
    if getattr(args, "dump_dir", None):
        pipeline.dump_dir = Path(args.dump_dir)
    pipeline.timing = bool(getattr(args, "timing", False))
    if getattr(args, "paranoid", False):
        pipeline.paranoid = True
    return pipeline


def _lenient(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "lenient", False))


# ----------------------------------------------------------------------------- verbs


def cmd_opt(args: argparse.Namespace) -> int:
    """Parse, verify, run a pipeline, print (or write with -o; a directory for a dump directory)."""
    _load_plugins(args.load)
    inputs = load_inputs(args.input)
    collection = is_collection(args.input)
    out_is_dir = bool(args.output) and (len(inputs) > 1 or collection)
    pipeline_given = bool(args.pipeline or getattr(args, "config", None))
    if not pipeline_given and (args.timing or args.explain or args.explain_fusion):
        warn("no pipeline given (-p or --config): nothing ran, so --timing/--explain have nothing to show")

    timings: list[tuple[str, object, dict, dict]] = []

    def work(name: str, text: str) -> None:
        module = parse_module(name, text, _lenient(args))
        _verify(module)
        pipeline = _build_pipeline(args)
        before = _counts(module) if pipeline is not None and args.timing else None
        result = _run_pipeline(pipeline, module, name) if pipeline else None
        if args.explain and result is not None:
            _print_explanations(result)
        if getattr(args, "explain_fusion", False) and result is not None:
            from hlopt.passes.fusion.fusion_trial import fusion_audit_lines

            print("\n".join(fusion_audit_lines(result.explanations)), file=sys.stderr)
        out_text = module.to_text()
        if out_is_dir:
            write_atomic(Path(args.output) / Path(name).name, out_text)
        elif args.output:
            write_atomic(args.output, out_text)
        else:
            sys.stdout.write(out_text)
            sys.stdout.flush()
        if result is not None and args.timing:
            timings.append((name, result, before, _counts(module)))
            if args.timing == "passes":
                print(f"# {name}\n{result.timing_table()}\n{_count_line(before, timings[-1][3])}",
                      file=sys.stderr)

    try:
        outcomes = run_each(inputs, work, collection, args.fail_fast)
    finally:
        if timings:
            print(timing_summary(timings, hint=args.timing != "passes"), file=sys.stderr)
    return report_failures(outcomes)


def timing_summary(timings: list[tuple[str, object, dict, dict]], hint: bool = True) -> str:
    """`opt --timing`'s table: a row per module (passes run, wall and CPU time, executed instructions and
    kernels before -> after), totals at the bottom. Rows are (file, PipelineResult, counts before, after)."""
    header = (f"{'module':40} {'passes':>6} {'changed':>7} {'ms':>10} {'cpu ms':>10} "
              f"{'executed instrs':>17} {'kernels':>15}")
    lines = [header]
    total = {"passes": 0, "changed": 0, "ms": 0.0, "cpu": 0.0, "ib": 0, "ia": 0, "kb": 0, "ka": 0}
    for name, result, before, after in timings:
        records = result.records
        ms = sum(r.seconds for r in records) * 1e3
        cpu = sum(r.cpu_seconds for r in records) * 1e3
        lines.append(_timing_row(Path(name).name, len(records), str(result.changed), ms, cpu, before, after))
        total["passes"] += len(records)
        total["changed"] += bool(result.changed)
        total["ms"] += ms
        total["cpu"] += cpu
        for key, counts in (("i", "executed_instructions"), ("k", "kernels")):
            total[key + "b"] += before[counts]
            total[key + "a"] += after[counts]
    lines.append(_timing_row(f"total ({len(timings)} module(s))", total["passes"], f"{total['changed']}/{len(timings)}",
                             total["ms"], total["cpu"], {"executed_instructions": total["ib"], "kernels": total["kb"]},
                             {"executed_instructions": total["ia"], "kernels": total["ka"]}))
    if hint:
        lines.append("(--timing=passes adds each module's per-pass times and instruction counts)")
    return "\n".join(lines)


def _timing_row(name: str, passes: int, changed: str, ms: float, cpu: float, before: dict, after: dict) -> str:
    """One row of `timing_summary`."""
    instrs = f"{before['executed_instructions']} -> {after['executed_instructions']}"
    kernels = f"{before['kernels']} -> {after['kernels']}"
    if len(name) > 40:
        name = "..." + name[-37:]
    return f"{name:40} {passes:6d} {changed:>7} {ms:10.1f} {cpu:10.1f} {instrs:>17} {kernels:>15}"


def _run_pipeline(pipeline, module, name: str | None = None):
    """Run the pipeline on a module the caller has verified; a PassFailure reaches run_each, which names the
    module and the pass."""
    return pipeline.run(module, input_verified=True)


def _counts(module) -> dict:
    """The figures of `module_stats` that `_count_line` compares (without its opcode histogram)."""
    executed_insts = [i for c in _executed_computations(module) for i in c.instructions]
    return {"instructions": module.instruction_count(), "executed_instructions": len(executed_insts),
            "kernels": sum(1 for i in executed_insts if _is_kernel(i))}


def _count_line(before: dict, after: dict) -> str:
    """The figures to compare across a pipeline: executed instructions and kernels (the per-pass counts
    above include fused computations, so they grow with fusion)."""
    return (f"executed instructions {before['executed_instructions']} -> {after['executed_instructions']}, "
            f"kernels {before['kernels']} -> {after['kernels']} (all computations, fused ones included: "
            f"{before['instructions']} -> {after['instructions']})")


def _print_explanations(result) -> None:
    """Every explanation of the pipeline's run (its fusion passes', in order), on stderr."""
    for line in result.explain_lines():
        print(line, file=sys.stderr)


def _load_npz_inputs(path: str, module) -> list:
    """The arrays of an .npz file (sorted by key, naturally), checked against the entry's parameters: the
    count, the shapes and the dtypes must match (no silent casts)."""
    import zipfile

    import numpy as np

    _check_npz_file(path)
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile) as e:
        raise SystemExit(f"hlopt: --inputs {path}: not an .npz archive of arrays ({e})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise SystemExit(f"hlopt: --inputs {path}: a single .npy array, not an .npz archive (use numpy.savez)")
    keys = sorted(data.files, key=_natural_key)
    params = module.entry.parameters
    if len(keys) != len(params):
        raise SystemExit(f"hlopt: --inputs {path}: {len(keys)} array(s) ({', '.join(keys)}) for "
                         f"{len(params)} entry parameter(s) of {module.name}")
    arrays = []
    for key, param in zip(keys, params, strict=True):
        try:
            arrays.append(data[key])
        except ValueError as e:
            raise SystemExit(f"hlopt: --inputs {path}: array {key!r}: {e}") from None
        _check_input(path, key, arrays[-1], param)
    return arrays


def _check_npz_file(path: str) -> None:
    """One line for an --inputs file that is missing or not an .npz archive."""
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"hlopt: --inputs {path}: no such file")
    with p.open("rb") as f:
        magic = f.read(6)
    if magic.startswith(b"\x93NUMPY"):
        raise SystemExit(f"hlopt: --inputs {path}: a single .npy array, not an .npz archive (write it with numpy.savez)")
    if not magic.startswith(b"PK"):
        raise SystemExit(f"hlopt: --inputs {path}: not an .npz archive (write it with numpy.savez)")


def _check_input(path: str, key: str, array, param) -> None:
    """Refuse an array whose dtype or shape is not the parameter's (the XLA run would cast or fail)."""
    import numpy as np

    shape = param.shape
    if not shape.is_array:
        return  # tuple parameters: the runtime checks the leaves
    want = np.dtype(shape.element_type.numpy)
    if array.dtype != want:
        raise SystemExit(f"hlopt: --inputs {path}: array {key!r} is {array.dtype}, but parameter "
                         f"%{param.name} is {shape}; save it as {want} (hlopt does not cast inputs)")
    if tuple(array.shape) != tuple(shape.dims):
        raise SystemExit(f"hlopt: --inputs {path}: array {key!r} has shape {list(array.shape)}, but parameter "
                         f"%{param.name} is {shape}")


def _refuse_elided(module) -> None:
    """`check` runs the module on XLA: a constant printed as `{...}` would run as zeros, so refuse it."""
    from hlopt.hlo.literal import ElidedLiteralError, check_no_elided_constants

    try:
        check_no_elided_constants(module, "check")
    except ElidedLiteralError as e:
        raise SystemExit(f"hlopt check: {e}") from None


def cmd_check(args: argparse.Namespace) -> int:
    """Run the module before and after the pipeline on XLA CPU with the same inputs; compare."""
    _ensure_cpu_devices(max(8, args.devices or 1))
    _load_plugins(args.load)
    from hlopt import runtime

    if not (args.pipeline or getattr(args, "config", None)):
        args.pipeline = "default"
        print("hlopt: no pipeline given (-p or --config): checking the `default` pipeline", file=sys.stderr)
    if args.inputs:
        _check_npz_file(args.inputs)
    inputs = load_inputs(args.input)
    collection = is_collection(args.input)
    spec: list[str] = []

    def work(name: str, text: str) -> dict:
        module = parse_module(name, text, _lenient(args))
        _refuse_elided(module)
        _verify(module)
        original = module.clone()
        pipeline = _build_pipeline(args)
        if not spec:
            spec.append(f"--config {args.config}" if getattr(args, "config", None) else args.pipeline)
        arrays = (_load_npz_inputs(args.inputs, original) if args.inputs
                  else runtime.random_inputs(original, seed=args.seed))
        _run_pipeline(pipeline, module, name)
        try:
            expected = runtime.execute(original, arrays, devices=args.devices)
        except Exception as e:  # noqa: BLE001 - XLA's rejection of the input module, reported plainly
            raise SystemExit(f"hlopt: XLA could not run {name}: {str(e).strip().splitlines()[0]}") from None
        try:
            actual = runtime.execute(module, arrays, devices=args.devices)
        except Exception as e:  # noqa: BLE001 - the optimized module no longer runs: the pipeline's fault
            raise SystemExit(f"hlopt: XLA could not run {name} after the pipeline (a bug in a pass; please "
                             f"report it): {str(e).strip().splitlines()[0]}") from None
        cmp = runtime.compare(expected, actual, rtol=args.rtol, atol=args.atol)
        report = {"module": name, "ok": bool(cmp.ok), "outputs": len(expected), "report": str(cmp),
                  "pipeline": spec[0], "max_abs_error": max((o.max_abs for o in cmp.outputs), default=0.0),
                  "max_rel_error": max((o.max_rel for o in cmp.outputs), default=0.0)}
        if not args.json:
            status = "OK" if cmp.ok else "MISMATCH"
            print(f"{status}: {name}: {len(expected)} output(s) compared, max abs error "
                  f"{report['max_abs_error']:.3g}, max rel error {report['max_rel_error']:.3g}")
            if not cmp.ok:
                print(str(cmp))
        return report

    outcomes = run_each(inputs, work, collection, args.fail_fast)
    if spec and not args.json:
        print(f"pipeline: {spec[0]}")
    failed = report_failures(outcomes)
    mismatch = any(o.ok and not o.result["ok"] for o in outcomes)
    if args.json:
        modules = [o.result if o.ok else {"module": o.name, "ok": False, "error": o.error} for o in outcomes]
        print(json.dumps({"ok": not (failed or mismatch), "pipeline": spec[0] if spec else None,
                          "modules": modules}, indent=2))
    return 1 if failed or mismatch else 0


def _natural_key(s: str) -> tuple:
    import re

    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


def module_stats(module, name: str) -> dict:
    """The figures `hlopt stats` prints for one module.

    `instructions` counts every instruction of every computation (fused computations and reducers
    included); `executed_instructions` counts those of the entry and of what control flow runs (loop
    bodies and conditions, called computations, branches), each computation once, a fusion as one;
    `kernels` counts those that launch work (fusions, custom calls, collectives, and unfused
    non-trivial instructions), the figures to compare before and after fusion.
    """
    from collections import Counter

    hist = Counter(i.opcode for i in module.instructions())
    entry = module.entry
    counts = _counts(module)
    return {
        "module": module.name,
        "file": name,
        "computations": len(module.computations),
        "instructions": counts["instructions"],
        "entry_instructions": len(entry.instructions),
        "executed_instructions": counts["executed_instructions"],
        "kernels": counts["kernels"],
        "entry_parameters": len(entry.parameters),
        "parameter_bytes": sum(p.shape.byte_size for p in entry.parameters),
        "output_bytes": entry.root.shape.byte_size,
        "is_scheduled": module.is_scheduled,
        "opcodes": dict(hist.most_common()),
    }


_NOT_KERNELS = frozenset({
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "call", "conditional",
    "after-all", "add-dependency", "opt-barrier", "partition-id", "replica-id", "domain",
    "all-reduce-done", "all-gather-done", "collective-permute-done", "async-done", "async-update",
    "copy-done", "send-done", "recv-done",
})


def _is_kernel(inst) -> bool:
    """True for an instruction of an executed computation that launches device work."""
    return inst.opcode not in _NOT_KERNELS


def _executed_computations(module) -> list:
    """The entry and what control flow runs from it (while bodies/conditions, calls, branches), each once."""
    out = [module.entry]
    seen = {module.entry}
    i = 0
    while i < len(out):
        for inst in out[i].instructions:
            if inst.opcode not in ("while", "call", "conditional", "async-start"):
                continue
            for callee in inst.called_computations:
                if callee is not None and callee not in seen:
                    seen.add(callee)
                    out.append(callee)
        i += 1
    return out


def cmd_stats(args: argparse.Namespace) -> int:
    """Opcode histogram, computations, parameter/output bytes."""
    inputs = load_inputs(args.input)
    collection = is_collection(args.input)

    def work(name: str, text: str) -> dict:
        stats = module_stats(parse_and_verify(name, text, args), name)
        if not args.json:
            _print_stats(stats)
        return stats

    outcomes = run_each(inputs, work, collection, args.fail_fast)
    status = report_failures(outcomes)
    if args.json:
        out = [_json_entry(o) for o in outcomes]
        print(json.dumps(out if collection or len(out) > 1 else out[0], indent=2))
    return status


def _json_entry(outcome: ModuleOutcome) -> dict:
    """A module's JSON result, or {"file", "error"} for one that failed."""
    return outcome.result if outcome.ok else {"file": outcome.name, "error": outcome.error}


def _print_stats(stats: dict) -> None:
    from hlopt.cli.console import table_console
    from rich.markup import escape
    from rich.table import Table

    console = table_console()
    console.print(f"[bold]{escape(stats['module'])}[/bold] ({escape(stats['file'])}): {stats['computations']} computations, "
                  f"{stats['instructions']} instructions in all, {stats['executed_instructions']} executed "
                  f"({stats['entry_instructions']} in the entry), {stats['kernels']} kernels, parameters "
                  f"{stats['parameter_bytes']:,} B ({stats['entry_parameters']}), outputs "
                  f"{stats['output_bytes']:,} B" + (", scheduled" if stats["is_scheduled"] else ""),
                  markup=True, highlight=False)
    table = Table("opcode", "count")
    for op, n in stats["opcodes"].items():
        table.add_row(op, str(n))
    console.print(table)


def cmd_passes(args: argparse.Namespace) -> int:
    """List the registered passes with their options and docstrings."""
    import dataclasses

    from hlopt.passes.framework.pipeline import NAMED_PIPELINES
    from hlopt.passes.framework.registry import pass_options, registered_passes

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
        print(json.dumps({"passes": rows, "pipelines": dict(NAMED_PIPELINES)}, indent=2))
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

    return run_demo(Path(args.out), xla_gpu=not args.no_xla_gpu)


# ----------------------------------------------------------------------------- parser


def _add_pipeline_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-p", "--pipeline", help="pipeline spec, e.g. 'call-inliner,fix(algebraic-simplifier,dce)' "
                                            "or a named pipeline (default, simplify, cleanup); see `hlopt passes`")
    p.add_argument("--config", help="pipeline configuration file (.json/.yaml; see the README)")
    p.add_argument("--load", action="append", metavar="FILE.py", help="load user passes from a Python file")
    p.add_argument("--verify-each", dest="verify_each", action="store_true", default=True,
                   help="verify the module after every pass that changes it, re-checking what the pass "
                        "changed (default; inside a fix(...) group once, at the group's end)")
    p.add_argument("--no-verify-each", dest="verify_each", action="store_false")
    p.add_argument("--verify-each=every-pass", dest="verify_each", action="store_const", const="every-pass",
                   help="also verify after every pass inside fix(...) groups (by default a group is verified "
                        "once, at its end, as XLA's release builds do)")
    p.add_argument("--paranoid", action="store_true",
                   help="check every pass's `changed` against a hash of the whole printed module and "
                        "verify the whole module after each pass (slow)")


def add_fail_fast_flag(p: argparse.ArgumentParser) -> None:
    """`--fail-fast`: stop at the first module of a dump directory that fails."""
    p.add_argument("--fail-fast", action="store_true",
                   help="for a dump directory: stop at the first module that fails (default: process every "
                        "module, list the failures at the end, exit 1)")


def _version() -> str:
    import hlopt

    return f"hlopt {hlopt.__version__}"


class _VersionAction(argparse.Action):
    """`--version`: print hlopt's version (read from the installed distribution only when asked) and exit."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001 - argparse's signature
        print(_version())
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (`hlopt VERB: error: ...; see hlopt VERB --help`), status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_opt_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("opt", help="parse, verify, run a pipeline, print")
    p.add_argument("input", help="HLO file, '-' for stdin, or an XLA dump directory")
    p.add_argument("-o", "--output", help="output file (or directory for a dump directory)")
    _add_pipeline_args(p)
    p.add_argument("--dump-dir", help="write the module after each pass into this directory")
    p.add_argument("--timing", nargs="?", const="summary", default=None, choices=["summary", "passes"],
                   help="print a table of time and instruction counts per module, totals at the bottom; "
                        "--timing=passes also prints each module's per-pass table")
    p.add_argument("--explain", action="store_true", help="print why each fusion candidate was taken or refused")
    p.add_argument("--explain-fusion", action="store_true",
                   help="print the fusion audit: each fusion made (or refused as slower), its modeled time before "
                        "and after, launches saved and the rule")
    add_fail_fast_flag(p)
    add_lenient_flag(p)
    p.set_defaults(fn=cmd_opt)


def _add_check_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="run before/after the pipeline on XLA CPU and compare outputs")
    p.add_argument("input", help="HLO file, '-' for stdin, or an XLA dump directory")
    _add_pipeline_args(p)
    p.add_argument("--inputs", help=".npz with the inputs (sorted by key; dtypes and shapes must match the "
                                    "parameters); random dtype-valid inputs otherwise")
    p.add_argument("--devices", type=positive_int, default=None,
                   help="number of CPU devices (default: from the module)")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    add_fail_fast_flag(p)
    add_lenient_flag(p)
    p.set_defaults(fn=cmd_check)


def _add_stats_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help="opcode histogram, instructions and kernels, parameter/output bytes")
    p.add_argument("input", help="HLO file, '-' for stdin, or an XLA dump directory")
    p.add_argument("--json", action="store_true")
    add_no_verify_flag(p)
    add_fail_fast_flag(p)
    add_lenient_flag(p)
    p.set_defaults(fn=cmd_stats)


def _add_passes_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("passes", help="list passes with their options")
    p.add_argument("--load", action="append", metavar="FILE.py")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_passes)


def _add_demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="a short end-to-end showing of hlopt")
    p.add_argument("--out", default="hlopt-demo", help="output directory (default ./hlopt-demo)")
    p.add_argument("--no-xla-gpu", action="store_true",
                   help="skip the comparison with XLA:GPU's own compile (made when its deviceless compiler is installed)")
    p.set_defaults(fn=cmd_demo)


def _adder_in(module: str, name: str) -> Callable[[argparse._SubParsersAction], object]:
    """The subparser adder `name` of the verb module `module`, imported when the parser is built: `hlopt opt`
    does not import the other verbs' modules."""

    def add(sub: argparse._SubParsersAction) -> object:
        return getattr(importlib.import_module(module), name)(sub)

    add.__name__ = add.__qualname__ = name
    return add


def _verb_adders() -> dict[str, Callable[[argparse._SubParsersAction], object]]:
    """Each verb, in `hlopt --help`'s order, with the function that adds its subparser."""
    return {"opt": _add_opt_parser, "check": _add_check_parser, "stats": _add_stats_parser,
            "passes": _add_passes_parser, "demo": _add_demo_parser,
            "cost": _adder_in("hlopt.cli.cost", "add_cost_parser"),
            "schedule": _adder_in("hlopt.cli.schedule", "add_schedule_parser"),
            "bench-schedule": _adder_in("hlopt.cli.schedule", "add_bench_schedule_parser"),
            "compile": _adder_in("hlopt.cli.compile", "add_compile_parser"),
            "run": _adder_in("hlopt.cli.compile", "add_run_parser"),
            "tune": _adder_in("hlopt.cli.tune", "add_tune_parser")}


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The argparse parser for every verb; with `verb` (one of them), for that verb alone: its help text
    and its options are the same, and the other verbs' help (which imports the scheduler and the runtime
    for their defaults) is not built."""
    parser = _Parser(prog="hlopt", description="Optimize XLA HLO in Python. Every verb that "
                                     "reads modules takes a file, '-' for stdin, or an XLA dump directory.")
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument("--verbose", action="store_true", help=_VERBOSE_HELP)
    sub = parser.add_subparsers(dest="verb", required=True)
    adders = _verb_adders()
    for name, adder in adders.items():
        if verb is None or verb not in adders or name == verb:
            adder(sub)
    for verb_parser in sub.choices.values():
        if "--verbose" not in verb_parser._option_string_actions:  # noqa: SLF001 - argparse's own table
            verb_parser.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP)
    return parser


_VERBOSE_HELP = "show XLA's start-up logs (also HLOPT_XLA_LOGS=1); hlopt keeps them out of the terminal otherwise"
_XLA_VERBS = frozenset({"check", "demo"})
"""Verbs that start XLA in this process: jax is started first, its start-up logs filtered."""


def _run_verb(args: argparse.Namespace) -> int:
    """Run the verb; unexpected errors become one line saying where to report them."""
    from hlopt.cli.common import internal_error, user_os_error

    try:
        return int(args.fn(args) or 0)
    except (SystemExit, KeyboardInterrupt, BrokenPipeError):
        raise
    except Exception as e:
        if os.environ.get("HLOPT_TRACEBACK"):
            raise
        user = user_os_error(e)  # an OS error on a path the user gave (an output folder under /proc)
        raise SystemExit(user or internal_error(e)) from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hlopt` console script.

    User errors raise SystemExit with one line (exit status 1 or, for usage errors, 2); a pipe closed early
    (`hlopt opt DIR | head`) ends quietly with status 141 as a shell reports SIGPIPE.
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "opt":  # a bare --timing must not take the next argument (the input) as its value
        argv = ["--timing=summary" if a == "--timing" else a for a in argv]
    if argv and argv[0] in ("check", "demo", "schedule", "bench-schedule"):
        _ensure_cpu_devices(8)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    from hlopt.cli.common import written_files

    already_written = len(written_files())
    try:
        if args.verb in _XLA_VERBS:
            from hlopt.cli.common import start_xla_quietly

            start_xla_quietly(getattr(args, "verbose", False))
        return _run_verb(args)
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except KeyboardInterrupt:
        print(_interrupted_message(written_files()[already_written:]), file=sys.stderr)
        return 130


def _interrupted_message(written: list[str]) -> str:
    """What an interrupted run (Ctrl-C) says: which files it wrote before it stopped."""
    if not written:
        return "hlopt: interrupted; no file written"
    shown = ", ".join(written[-5:])
    more = f" (the last 5 of {len(written)})" if len(written) > 5 else ""
    return f"hlopt: interrupted; wrote {len(written)} file(s){more}: {shown}"


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so that the interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a real file (tests capture it)


def console_main() -> int:
    """The `hlopt` console script (and `python -m hlopt.cli.main`): `main()`, then an exit that does not
    spend seconds freeing what the run built. A pipeline leaves a large cyclic object graph (instructions,
    computations, the passes' caches); the interpreter's final garbage collection would walk and free all
    of it (3-4 s after `hlopt opt -p default` on a 13k-instruction module) just before the operating system
    takes the memory back anyway. Freezing the collector (`gc.freeze`) leaves those objects out of that
    collection; atexit handlers and the final flushes of stdout and stderr run as before. In-process
    callers of `main` (tests, embedding programs) are not affected."""
    try:
        return main()
    finally:
        gc.freeze()


def console_script() -> NoReturn:
    """What the `hlopt` command runs: `console_main`, then the end of the process without the interpreter's
    teardown (unloading a thousand modules and their objects: 20-40 ms after `hlopt opt -p default`).
    Everything the interpreter's exit would do that can be seen still happens first: the atexit handlers
    run, stdout and stderr are flushed, a SystemExit's message is printed, and the status is the same.
    Under a profiler or a tracer (`python -m cProfile`, coverage) the interpreter exits as usual, so that
    they write their results."""
    try:
        status = console_main()
    except SystemExit as e:
        status = e.code
    if status is None:
        code = 0
    elif isinstance(status, int):
        code = status
    else:
        print(status, file=sys.stderr)
        code = 1
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)  # under a profiler or a tracer (cProfile, coverage): they write their results at exit
    atexit._run_exitfuncs()  # noqa: SLF001 - the documented handlers, run as the interpreter's exit runs them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, OSError, ValueError):
            code = code or 141  # the reader went away (as `main` reports a closed pipe)
    os._exit(code)


if __name__ == "__main__":
    console_script()
