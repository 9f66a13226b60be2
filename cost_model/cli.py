"""`hlopt cost IN [--device h100] [--json]`: the top instructions by modeled time, and the module total."""

from __future__ import annotations

import argparse
import json

__all__ = ["add_cost_parser", "cost_report"]


def add_cost_parser(sub: argparse._SubParsersAction) -> None:
    """Register the `cost` verb."""
    p = sub.add_parser("cost", help="modeled GPU time, flops and bytes per instruction")
    p.add_argument("input")
    p.add_argument("--device", default="h100", help="h100, h200, b200, a100, or a device spec file")
    p.add_argument("--top", type=int, default=20, help="rows in the table")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_cost)


def cost_report(module, device: str = "h100") -> dict:
    """The JSON object `hlopt cost --json` prints."""
    from cost_model.model import AnalyticalGpuModel

    model = AnalyticalGpuModel(device)
    rows = []
    total = {"flops": 0.0, "transcendentals": 0.0, "bytes_accessed": 0.0, "time_us": 0.0}
    for comp in _executed_computations(module):
        for inst in comp.instructions:
            if inst.opcode in ("while", "call", "conditional"):
                continue  # their bodies are listed themselves
            t = model.instruction_time(inst)
            if t.bound == "none":
                continue
            rows.append({"name": inst.name, "opcode": inst.opcode, "computation": comp.name,
                         "flops": t.cost.flops, "bytes_accessed": t.cost.bytes_accessed, "time_us": t.time_us,
                         "bound": t.bound, "transcendentals": t.cost.transcendentals})
    for r in rows:
        for k in total:
            total[k] += r[k]
    rows.sort(key=lambda r: -r["time_us"])
    for r in rows:
        r.pop("transcendentals")
    total["time_us"] = model.module_time_us(module)
    return {"device": model.device.name, "total": total, "instructions": rows}


def _executed_computations(module) -> list:
    """The entry and what control flow runs (while bodies/conditions, calls, branches), not reducers."""
    out = [module.entry]
    seen = {module.entry}
    i = 0
    while i < len(out):
        for inst in out[i].instructions:
            if inst.opcode in ("while", "call", "conditional"):
                for callee in inst.called_computations:
                    if callee not in seen:
                        seen.add(callee)
                        out.append(callee)
        i += 1
    return out


def cmd_cost(args: argparse.Namespace) -> int:
    """Print the cost table (rich) or JSON."""
    import hlo

    try:
        module = hlo.parse_file(args.input)
    except hlo.HloParseError as e:
        raise SystemExit(str(e)) from None
    report = cost_report(module, args.device)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("instruction", "opcode", "computation", "GFLOP", "MB", "flop/byte", "bound", "us",
                  title=f"{module.name} on {report['device']}: modeled {report['total']['time_us']:.2f} us "
                        "(sequential, loops times their trip counts)")
    for r in report["instructions"][: args.top]:
        intensity = r["flops"] / r["bytes_accessed"] if r["bytes_accessed"] else 0.0
        table.add_row(r["name"], r["opcode"], r["computation"], f"{r['flops'] / 1e9:.4f}",
                      f"{r['bytes_accessed'] / 1e6:.3f}", f"{intensity:.1f}", r["bound"], f"{r['time_us']:.2f}")
    t = report["total"]
    table.add_row("total", "", "", f"{t['flops'] / 1e9:.4f}", f"{t['bytes_accessed'] / 1e6:.3f}", "", "",
                  f"{t['time_us']:.2f}")
    Console().print(table)
    return 0
