"""`hlopt cost IN [--target h100] [--devices 8] [--json]`: the top instructions by modeled time, and the module total.

The table (rich) lists the instructions that do work (kernels and collectives; parameters, tuples and
bitcasts are left out) in the order of their share of the module's time, with XLA's flops and bytes
accessed, arithmetic intensity and what bounds them (compute, memory, latency, network). `--json` prints
one object per module:

    {"device": ..., "total": {"flops", "transcendentals", "bytes_accessed", "opaque_instructions", "time_us"},
     "instructions": [{"name", "opcode", "computation", "flops", "bytes_accessed", "time_us", "bound"}, ...]}

`total` flops / transcendentals / bytes are exactly XLA's HloCostAnalysis totals (a while body counted once;
an opaque custom call such as a `Sharding` annotation or a LAPACK call -1 flops and -1 bytes, as XLA does;
`opaque_instructions` counts them); `total.time_us` is the modeled sequential time of the entry
computation with while bodies times their trip counts. An instruction's `time_us` is one execution.
Several modules (a dump directory) print a JSON list.
"""

from __future__ import annotations

import argparse
import json
import sys

from hlopt.cli.common import positive_int, warn_deprecated

__all__ = ["add_cost_parser", "cost_command", "cost_report", "executed_computations", "add_target_flag",
           "resolve_target"]

DEFAULT_TARGET = "h100"


def add_target_flag(p: argparse.ArgumentParser, several: bool = False) -> None:
    """`--target`/`--gpu`: the GPU model(s) of the cost model (`--device` is its deprecated name)."""
    what = "comma-separated GPU models" if several else "GPU model"
    p.add_argument("--target", "--gpu", dest="target", default=None,
                   help=f"{what} of the cost model: h100, h200, b200, a100, or a device spec file "
                        f"(json/yaml/txtpb); default {DEFAULT_TARGET}")
    p.add_argument("--device", dest="deprecated_device", default=None, help=argparse.SUPPRESS)


def resolve_target(args: argparse.Namespace) -> str:
    """The --target value, taking the deprecated --device with a warning."""
    warn_deprecated(args, "deprecated_device", "target", "--device", "--target (or --gpu)")
    args.target = args.target or DEFAULT_TARGET
    return args.target


def add_cost_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the `cost` verb on the `hlopt` command line."""
    p = subparsers.add_parser("cost", help="modeled GPU time, flops and bytes per instruction",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="HLO text file, '-' for stdin, or an XLA dump directory")
    add_target_flag(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--top", type=positive_int, default=20, help="rows in the table (default 20)")
    p.add_argument("--devices", type=positive_int, default=None,
                   help="devices in a collective without replica_groups (default 8)")
    p.add_argument("--num-devices", dest="deprecated_num_devices", type=positive_int, default=None,
                   help=argparse.SUPPRESS)
    p.add_argument("--library", default="nccl", choices=("nccl", "nvshmem", "auto"),
                   help="collective implementation (auto: the faster of NCCL and NVSHMEM kernels)")
    add_fail_fast_flag(p)
    add_lenient_flag(p)
    add_no_verify_flag(p)
    p.set_defaults(fn=cost_command)
    return p


def executed_computations(module) -> list[tuple[object, int]]:
    """(computation, executions per module run): the entry and what control flow runs (while bodies and
    conditions, called computations, conditional branches), not fused computations or reducers."""
    from hlopt.cost_model.model import trip_count

    out = [(module.entry, 1)]
    index = {module.entry: 0}
    i = 0
    while i < len(out):
        comp, runs = out[i]
        for inst in comp.instructions:
            if inst.opcode not in ("while", "call", "conditional"):
                continue
            for callee in inst.called_computations:
                if callee is None:
                    continue
                n = runs
                if inst.opcode == "while":
                    trips = trip_count(inst)
                    n = runs * (trips + 1 if callee is inst.attrs.get("condition") else trips)
                if callee in index:
                    prev_comp, prev_runs = out[index[callee]]
                    out[index[callee]] = (prev_comp, prev_runs + n)
                else:
                    index[callee] = len(out)
                    out.append((callee, n))
        i += 1
    return out


def _rows(module, model) -> list[dict]:
    rows = []
    for comp, runs in executed_computations(module):
        for inst in comp.instructions:
            if inst.opcode in ("while", "call", "conditional"):
                continue  # their bodies are listed themselves
            t = model.instruction_time(inst)
            if t.bound == "none":
                continue
            rows.append({"name": inst.name, "opcode": inst.opcode, "computation": comp.name,
                         "flops": t.cost.flops, "bytes_accessed": t.cost.bytes_accessed, "time_us": t.time_us,
                         "bound": t.bound, "_runs": runs})
    rows.sort(key=lambda r: -r["time_us"] * r["_runs"])
    return rows


def cost_report(module, device: str = "h100", num_devices: int = 8, library: str = "nccl",
                keep_runs: bool = False) -> dict:
    """The JSON object `hlopt cost --json` prints for one module."""
    from hlopt.cost_model.analysis import module_cost
    from hlopt.cost_model.model import AnalyticalGpuModel

    model = AnalyticalGpuModel(device, num_devices, library)
    rows = _rows(module, model)
    if not keep_runs:
        for r in rows:
            r.pop("_runs")
    total = {**module_cost(module).xla_totals(), "time_us": model.module_time_us(module)}
    return {"device": model.device.name, "total": total, "instructions": rows}


def _si(x: float) -> str:
    """A number with an SI suffix: 1.23k, 4.56M, 7.89G."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def _print_table(name: str, report: dict, top: int) -> None:
    from hlopt.cli.console import table_console
    from rich.table import Table

    console = table_console()
    t = report["total"]
    table = Table("instruction", "opcode", "computation", "runs", "flops", "bytes", "flop/byte", "bound", "us",
                  "total us", title=f"{name} on {report['device']}: modeled {t['time_us']:.2f} us "
                                    "(sequential; loops times their trip counts)")
    for r in report["instructions"][:top]:
        intensity = r["flops"] / r["bytes_accessed"] if r["bytes_accessed"] > 0 else 0.0
        table.add_row(r["name"], r["opcode"], r["computation"], str(r["_runs"]), _si(r["flops"]),
                      _si(r["bytes_accessed"]), f"{intensity:.2f}", r["bound"], f"{r['time_us']:.3f}",
                      f"{r['time_us'] * r['_runs']:.3f}")
    table.add_row("module total", "", "", "", _si(t["flops"]), _si(t["bytes_accessed"]), "", "", "",
                  f"{t['time_us']:.3f}")
    console.print(table)


def cost_command(args: argparse.Namespace) -> int:
    """Run `hlopt cost`: a rich table, or JSON with --json."""
    from hlopt.cli.common import is_collection, load_inputs, report_failures, run_each
    from hlopt.cli.main import parse_and_verify
    from hlopt.cost_model.devices import get_device

    target = resolve_target(args)
    warn_deprecated(args, "deprecated_num_devices", "devices", "--num-devices", "--devices")
    devices = args.devices or 8
    try:
        get_device(target)
    except (ValueError, OSError) as e:
        raise SystemExit(f"hlopt cost: {e}") from None
    inputs = load_inputs(args.input)
    collection = is_collection(args.input)

    def work(name: str, text: str) -> dict:
        module = parse_and_verify(name, text, args)
        report = cost_report(module, target, devices, args.library, keep_runs=not args.json)
        if not args.json:
            _print_table(module.name, report, args.top)
        return {"file": name, **report} if collection else report

    outcomes = run_each(inputs, work, collection, getattr(args, "fail_fast", False))
    status = report_failures(outcomes)
    if args.json:
        reports = [o.result if o.ok else {"file": o.name, "error": o.error} for o in outcomes]
        json.dump(reports[0] if len(reports) == 1 and not collection else reports, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return status


def add_fail_fast_flag(p: argparse.ArgumentParser) -> None:
    """The shared --fail-fast flag (see hlopt.cli.main)."""
    from hlopt.cli.main import add_fail_fast_flag as add

    add(p)


def add_lenient_flag(p: argparse.ArgumentParser) -> None:
    """The shared --lenient flag (see hlopt.cli.main)."""
    from hlopt.cli.main import add_lenient_flag as add

    add(p)


def add_no_verify_flag(p: argparse.ArgumentParser) -> None:
    """The shared --no-verify flag (see hlopt.cli.main)."""
    from hlopt.cli.main import add_no_verify_flag as add

    add(p)
