"""The files a tuning run leaves in its folder (`hlopt tune --out DIR`), from its records (`runtime.tuning.tune`).

- `trials.csv`, `trials.json`: every trial ranked (best first; refused and failed trials last);
- `best_flags.txt`: the best configuration of XLA:GPU alone as bare XLA flags on one line (what a user of plain
  jax sets: `XLA_FLAGS="$(cat best_flags.txt)" python train.py`); empty where XLA's defaults are best;
- `best_hlopt.yaml`: written where a configuration with hlopt's options rates best: its options, flags and the
  `hlopt compile` command that gives it;
- `pareto.png`: objective time against peak memory, every trial, the Pareto front, the memory limit;
- `summary.json`: the default, the best of each mode, their gain against the default, the Pareto front.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hlopt.runtime.tuning.tune import TuneResult, after_pipeline, before_pipeline, pareto_front

__all__ = ["ranked", "summary", "write_outputs", "plot", "CSV_FIELDS"]

CSV_FIELDS = ("rank", "trial", "status", "mode", "objective_us", "modeled_us", "makespan_us", "exposed_comm_us",
              "peak_memory_bytes", "launches", "kept", "xla_alone_modeled_us", "hlopt_modeled_us", "seconds",
              "config", "xla_flags", "hlopt", "error")
_STATUS_ORDER = {"ok": 0, "over_memory": 1, "failed": 2}


def ranked(result: TuneResult) -> list[dict[str, Any]]:
    """Every record with its rank: rated trials within the limit by objective, then refused, then failed."""
    rows = sorted(result.records, key=lambda r: (_STATUS_ORDER[r["status"]], r.get("objective_us") or 0.0, r["trial"]))
    return [{"rank": i + 1, **r} for i, r in enumerate(rows)]


def _gain(row: dict[str, Any] | None, default: dict[str, Any] | None) -> float | None:
    """How much lower the objective is than the default's (0.10 = 10% lower)."""
    if row is None or default is None or not default.get("objective_us"):
        return None
    return round(1.0 - row["objective_us"] / default["objective_us"], 4)


def _brief(row: dict[str, Any] | None) -> dict[str, Any] | None:
    keys = ("trial", "mode", "config", "xla_flags", "hlopt", "objective_us", "modeled_us", "makespan_us",
            "exposed_comm_us", "peak_memory_bytes", "kept")
    return None if row is None else {k: row.get(k) for k in keys}


def summary(result: TuneResult) -> dict[str, Any]:
    """The run in short: the default configuration, the best overall and per mode, gains against the default."""
    default = result.default()
    best, best_xla, best_hlopt = result.best(), result.best("xla"), result.best("hlopt")
    return {"name": result.name, "target": result.target, "objective": result.space.objective,
            "memory_limit_bytes": result.memory_limit_bytes, "trials": len(result.records),
            "rated": len(result.ok()), "over_memory": sum(r["status"] == "over_memory" for r in result.records),
            "failed": sum(r["status"] == "failed" for r in result.records), "interrupted": result.interrupted,
            "seconds": round(result.seconds, 1), "default": _brief(default),
            "best": _brief(best), "gain": _gain(best, default),
            "best_xla": _brief(best_xla), "gain_xla": _gain(best_xla, default),
            "best_hlopt": _brief(best_hlopt), "gain_hlopt": _gain(best_hlopt, default),
            "pareto": [r["trial"] for r in pareto_front(result.records)]}


def _write(path: Path, text: str) -> None:
    """Write atomically (a temporary file, then a rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # as an ordinary file (mkstemp makes it private)
    os.replace(tmp, path)


def _csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in row.items()})
    return out.getvalue()


def _hlopt_yaml(result: TuneResult, row: dict[str, Any], devices: int | None) -> str:
    """best_hlopt.yaml: hlopt's options of the best configuration, its flags, and how to compile with them."""
    import yaml

    opts = row["hlopt"] or {}
    after = after_pipeline(opts.get("heuristic", "xla-default"), opts.get("overlap_limit", 1))
    command = (f"hlopt compile IN --target {result.target}" + (f" --devices {devices}" if devices else "")
               + f" -p '{after}'" + (f" --xla-flags='{row['xla_flags']}'" if row["xla_flags"] else "")
               + ("" if opts.get("guard", True) else " --no-guard") + " --out OUT")
    data = {"hlopt": opts, "xla_flags": row["xla_flags"], "trial": row["trial"],
            "objective_us": row["objective_us"], "gain_vs_default": _gain(row, result.default()),
            "kept": row.get("kept"),
            "before_xla": before_pipeline(opts.get("pipeliner", True)), "after_xla": after,
            "compile_command": command}
    notes = []
    if not opts.get("pipeliner", True):
        notes.append("hlopt compile has no switch for step 1: runtime.xla_gpu_path.reemit.compile_for_gpu(module, before=before_xla, ...)")
    if not opts.get("guard", True):
        notes.append("rated without the guard (hlopt's module kept even where XLA's default compile rates faster: "
                     "hlopt compile --no-guard)")
    if notes:
        data["notes"] = notes
    return "# hlopt tune: the best configuration (hlopt + XLA:GPU)\n" + yaml.safe_dump(data, sort_keys=False, width=2**31 - 1)


def write_outputs(result: TuneResult, devices: int | None = None, plot_file: bool = True) -> dict[str, Path]:
    """Write the run's files into `result.out` (module docstring); name -> path."""
    out = result.out
    rows = ranked(result)
    paths = {"csv": out / "trials.csv", "json": out / "trials.json", "summary": out / "summary.json",
             "best_flags": out / "best_flags.txt"}
    _write(paths["csv"], _csv(rows))
    _write(paths["json"], json.dumps(rows, indent=1) + "\n")
    _write(paths["summary"], json.dumps(summary(result), indent=1) + "\n")
    best_xla = result.best("xla")
    _write(paths["best_flags"], (best_xla["xla_flags"] if best_xla else "") + "\n")
    best, hlopt_yaml = result.best(), out / "best_hlopt.yaml"
    if best is not None and best["mode"] == "hlopt":
        paths["best_hlopt"] = hlopt_yaml
        _write(hlopt_yaml, _hlopt_yaml(result, best, devices))
    elif hlopt_yaml.exists():  # a resumed run whose best is XLA alone now
        hlopt_yaml.unlink()
    if plot_file and any(r["status"] != "failed" for r in result.records):
        paths["plot"] = plot(result, out / "pareto.png")
    return paths


def plot(result: TuneResult, path: Path) -> Path:
    """Objective time against peak memory: every rated trial, the Pareto front, the default, the best."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rated = [r for r in result.records if r["status"] != "failed"]
    largest = max((r["peak_memory_bytes"] for r in rated), default=0)
    mib, unit = (2**20, "MiB") if largest >= 2**20 else (2**10, "KiB")
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    styles = {("xla", "ok"): ("o", "tab:blue", "XLA:GPU alone"), ("hlopt", "ok"): ("s", "tab:orange", "hlopt + XLA:GPU"),
              ("xla", "over_memory"): ("x", "tab:blue", "XLA alone, over the memory limit"),
              ("hlopt", "over_memory"): ("x", "tab:orange", "hlopt, over the memory limit")}
    for (mode, status), (marker, color, label) in styles.items():
        rows = [r for r in rated if r["mode"] == mode and r["status"] == status]
        if rows:
            ax.scatter([r["peak_memory_bytes"] / mib for r in rows], [r["objective_us"] for r in rows],
                       marker=marker, color=color, alpha=0.7, label=label)
    front = pareto_front(result.records)
    if front:
        xs = [r["peak_memory_bytes"] / mib for r in front]
        ys = [r["objective_us"] for r in front]
        ax.step(xs, ys, where="post", color="black", linewidth=1, label="Pareto front")
    default, best = result.default(), result.best()
    if default is not None:
        ax.scatter([default["peak_memory_bytes"] / mib], [default["objective_us"]], s=160, facecolors="none",
                   edgecolors="red", linewidths=1.5, label=f"XLA defaults ({default['objective_us']:.1f} us)")
    if best is not None:
        ax.scatter([best["peak_memory_bytes"] / mib], [best["objective_us"]], marker="*", s=220, color="green",
                   label=f"best: trial {best['trial']} ({best['objective_us']:.1f} us)")
    lo, hi = ax.get_xlim()
    limit = result.memory_limit_bytes / mib
    if limit <= hi * 1.05:
        ax.axvline(limit, color="red", linestyle="--", linewidth=1, label="memory limit")
        ax.set_xlim(lo, max(hi, limit * 1.02))
    what = "XLA's estimates" if result.space.objective == "xla" else "hlopt's analytical model"
    ax.set_xlabel(f"peak memory ({unit}, XLA's memory statistics)")
    ax.set_ylabel(f"modeled step time (us, {what})")
    ax.set_title(f"hlopt tune: {result.name} on {result.target} ({len(rated)} rated trials)", fontsize=10)
    ax.ticklabel_format(useOffset=False, style="plain")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
