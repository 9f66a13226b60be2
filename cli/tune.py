"""`hlopt tune IN`: choose XLA:GPU flags and hlopt's options by simulation (deviceless), with optuna's TPE.

Each trial compiles IN deviceless under one configuration of the search space (`--space`, default: the one
hlopt ships, `hlopt tune --print-space`): XLA:GPU alone under its flags, or `hlopt compile` with them and
hlopt's options; it is rated by XLA's estimates simulated on XLA:GPU's streams (the figure `hlopt compile`
reports), exposed communication, hlopt's analytical makespan and XLA's peak memory; a configuration over the
memory limit is refused. Trial 0 is always XLA's defaults, so the gain is stated against them.

OUT gets trials.jsonl (each trial as it finishes; a second run on the same OUT resumes), trials.csv/json (ranked),
best_flags.txt (the best XLA-alone configuration's XLA_FLAGS), best_hlopt.yaml (where hlopt's options win),
pareto.png and summary.json. A dump directory is tuned per module (OUT/<module>/) or, with --joint, as one.
Exit status: 0 done, 1 bad input, 3 no XLA:GPU compiler, 130 interrupted (finished trials kept).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hlopt.cli.common import positive_int

__all__ = ["add_tune_parser", "cmd_tune"]


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _default_workers() -> int:
    """Half the CPU cores, 1 to 4 (each trial's XLA compile uses threads of its own)."""
    import os

    return max(1, min(4, (os.cpu_count() or 2) // 2))


def add_tune_parser(sub: argparse._SubParsersAction) -> None:
    """Register the `tune` verb."""
    p = sub.add_parser("tune", help="choose XLA:GPU flags and hlopt options by simulation (deviceless, optuna)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", nargs="?", help="HLO text module (as jax lowers it) or an XLA dump directory")
    p.add_argument("--target", default="h100", help="GPU: h100, h200, b200, a100 (default h100)")
    p.add_argument("--devices", type=positive_int, default=None,
                   help="number of GPUs (default: as many as the module's shardings span)")
    p.add_argument("--space", help="search space YAML (default: hlopt's; see --print-space)")
    p.add_argument("--trials", type=positive_int, default=30, help="trials in all, the defaults included (default 30)")
    p.add_argument("--budget-s", type=_positive_float, default=None,
                   help="start no trial after this many seconds (the running ones finish)")
    p.add_argument("--workers", type=positive_int, default=_default_workers(),
                   help="trials run at once (default: half the CPU cores, at most 4; 1 runs them in this process)")
    p.add_argument("--cluster", help="run the trials as Ray tasks: ray://HOST:PORT, auto, or local (a Ray instance "
                                     "started here); needs pip install 'hlopt[cluster]'")
    p.add_argument("--out", default="hlopt-tune", help="output folder (default ./hlopt-tune); resumed if it holds "
                                                       "this search's trials")
    p.add_argument("--joint", action="store_true", help="tune a dump directory's modules with one configuration")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    p.add_argument("--memory-limit-gb", type=_positive_float, default=None,
                   help="refuse configurations above this peak memory (default: the space's, else the GPU's)")
    p.add_argument("--restart", action="store_true", help="discard the trials OUT holds and start over")
    p.add_argument("--top", type=positive_int, default=10, help="rows of the ranked table (default 10)")
    p.add_argument("--print-space", action="store_true", help="print the default search space (YAML) and exit")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON instead of tables")
    p.set_defaults(fn=cmd_tune)


def _fail(message: str, status: int = 1) -> SystemExit:
    print(f"hlopt tune: {message}", file=sys.stderr)
    return SystemExit(status)


def _modules(args: argparse.Namespace) -> list[tuple[str, list[tuple[str, str]], Path]]:
    """(name, modules, out folder) of each search: one per module, or one for all with --joint."""
    from hlopt.cli.common import is_collection, load_inputs
    from hlopt.hlo.parser import HloParseError, parse

    inputs = load_inputs(args.input)
    for name, text in inputs:
        try:
            parse(text, filename=name)
        except HloParseError as e:
            raise SystemExit(str(e)) from None
    out = Path(args.out)
    if not is_collection(args.input):
        return [(Path(inputs[0][0]).stem, inputs, out)]
    if args.joint:
        return [(Path(args.input).name or "joint", inputs, out)]
    return [(Path(name).stem, [(name, text)], out / Path(name).stem) for name, text in inputs]


def cmd_tune(args: argparse.Namespace) -> int:
    """Run one search per module (or one for all with --joint), write the outputs, print the rankings."""
    from hlopt.runtime.tuning.tune_space import DEFAULT_SPACE_PATH, SpaceError, load_space

    if args.print_space:
        print(DEFAULT_SPACE_PATH.read_text(), end="")
        return 0
    if not args.input:
        raise _fail("give an HLO module or a dump directory (or --print-space)")
    from hlopt.runtime.tuning.tune import TuneError, Tuner, _import_optuna
    from hlopt.runtime.xla_gpu_path.xla_gpu import INSTALL_COMMAND, available, check_target

    try:
        check_target(args.target)
        space = load_space(args.space)
        _import_optuna()
    except (SpaceError, TuneError, ValueError) as e:
        raise _fail(str(e)) from None
    if not available():
        raise _fail(f"XLA:GPU compiler not installed: run {INSTALL_COMMAND}", 3)
    searches = _modules(args)
    summaries, interrupted = [], False
    for name, modules, out in searches:
        tuner = Tuner(name, modules, out, space, args.target, args.devices, args.trials, args.budget_s, args.workers,
                      args.cluster, args.seed, int(args.memory_limit_gb * 2**30) if args.memory_limit_gb else None,
                      restart=args.restart)
        try:
            result = _run_with_progress(tuner, quiet=args.json)
        except TuneError as e:
            raise _fail(str(e)) from None
        summaries.append(_finish(result, args))
        if result.interrupted:
            interrupted = True
            break
    if args.json:
        print(json.dumps(summaries if len(summaries) > 1 else summaries[0], indent=1))
    if interrupted:
        print(f"hlopt tune: interrupted; the finished trials are kept in {searches[0][2].parent if len(searches) > 1 else searches[0][2]} "
              "(run the same command again to resume)", file=sys.stderr)
        return 130
    return 0


def _run_with_progress(tuner: Any, quiet: bool) -> Any:
    """Run the search with a progress bar (best so far) on a terminal, one line per trial otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    live = console.is_terminal and not quiet

    def describe(result: Any) -> str:
        best = result.best()
        return (f"{tuner.name}: best {best['objective_us']:.1f} us (trial {best['trial']}, {best['mode']})"
                if best else f"{tuner.name}: no rated trial yet")

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not live, transient=False) as bar:
        task = bar.add_task(f"{tuner.name}: starting", total=tuner.trials)

        def on_record(record: dict[str, Any], result: Any) -> None:
            bar.update(task, completed=len(result.records), description=describe(result))
            if not live and not quiet:
                figure = (f"{record['objective_us']:.1f} us" if record["status"] != "failed" else
                          f"failed: {record['error']}")
                print(f"trial {record['trial']} ({record['config']}): {figure} [{record['status']}]; "
                      + describe(result), file=sys.stderr)

        tuner.on_record = on_record
        result = tuner.run()
        bar.update(task, completed=len(result.records), description=describe(result))
    return result


def _finish(result: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Write the outputs; print the ranked table and the best configurations (unless --json); the summary."""
    from hlopt.runtime.tuning.tune_report import ranked, summary, write_outputs

    paths = write_outputs(result, args.devices)
    info = summary(result)
    info["files"] = {k: str(v) for k, v in paths.items()}
    if args.json:
        return info
    from hlopt.cli.console import table_console
    from rich.table import Table

    what = "XLA's estimates" if result.space.objective == "xla" else "hlopt's analytical model"
    table = Table("rank", "trial", "mode", "step us", "vs default", "our makespan us", "exposed comm us",
                  "peak MiB", "status", "configuration",
                  title=f"{result.name} on {result.target}: {len(result.records)} trials, step time by {what}")
    default = result.default()
    for row in ranked(result)[:args.top]:
        rated = row["status"] != "failed"
        gain = (f"{row['objective_us'] / default['objective_us']:.3f}x" if rated and default and default["objective_us"]
                else "-")
        table.add_row(str(row["rank"]), str(row["trial"]), row["mode"],
                      f"{row['objective_us']:.1f}" if rated else "-", gain,
                      f"{row['makespan_us']:.1f}" if rated else "-", f"{row['exposed_comm_us']:.1f}" if rated else "-",
                      f"{row['peak_memory_bytes'] / 2**20:.1f}" if rated else "-",
                      row["status"], row["config"] if rated else f"{row['config']} ({row['error']})")
    console = table_console()
    console.print(table)
    for label, key, gain in (("best of XLA:GPU alone", "best_xla", "gain_xla"), ("best with hlopt", "best_hlopt", "gain_hlopt")):
        best = info[key]
        if best is not None:
            console.print(f"{label}: trial {best['trial']}, {best['objective_us']:.1f} us, "
                          f"{100 * (info[gain] or 0):.1f}% below XLA's defaults ({best['config']})", highlight=False,
                          markup=False, soft_wrap=True)
    flags = (info["best_xla"] or {}).get("xla_flags")
    console.print(f"XLA_FLAGS=\"{flags}\"" if flags else "XLA's default flags rate best of XLA:GPU alone",
                  highlight=False, markup=False, soft_wrap=True)
    console.print("wrote " + ", ".join(str(p) for p in paths.values()), highlight=False, soft_wrap=True)
    return info
