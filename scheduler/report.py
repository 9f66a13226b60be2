"""Outputs of the scheduling workbench: Perfetto/Chrome traces, Gantt charts, comparison plots."""

from __future__ import annotations

import json
from pathlib import Path

from hlopt.scheduler.simulator import SimulationResult

__all__ = ["write_trace", "write_gantt", "write_comparison_plot", "gantt_title", "format_overlap"]


def write_trace(results: list[SimulationResult], path: str | Path) -> None:
    """A Chrome trace-event JSON (open in ui.perfetto.dev): one process per computation, one thread per stream."""
    events = []
    for pid, result in enumerate(results):
        streams = sorted({e.stream for e in result.events}, key=lambda s: (s != "compute", s))
        tid = {s: i for i, s in enumerate(streams)}
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": result.computation}})
        for s, i in tid.items():
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": i, "args": {"name": s}})
        for e in result.events:
            events.append({"ph": "X", "name": e.name, "cat": e.opcode, "pid": pid, "tid": tid[e.stream],
                           "ts": e.start, "dur": max(e.end - e.start, 0.001), "args": {"opcode": e.opcode}})
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))


def write_gantt(result: SimulationResult, path: str | Path, title: str | None = None) -> None:
    """A Gantt chart PNG of one computation's streams: each instruction a bar (alternating shades, so that
    neighbours are told apart), the longest ones labeled with their names, the lower bound a dashed line,
    the legend outside the axes; the title says "no communication" for a computation without any."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    streams = sorted({e.stream for e in result.events}, key=lambda s: (s != "compute", s))
    fig, ax = plt.subplots(figsize=(12, 1.3 + 0.7 * max(len(streams), 1)))
    colors = plt.get_cmap("tab10")
    span = max(result.makespan_us, result.lower_bound_us, 1e-9)
    for row, stream in enumerate(streams):
        events = sorted((e for e in result.events if e.stream == stream), key=lambda e: e.start)
        base = to_rgba(colors(row % 10))
        shades = [base, tuple(0.55 * c + 0.45 for c in base[:3]) + (1.0,)]
        ax.broken_barh([(e.start, max(e.end - e.start, 1e-3)) for e in events], (row - 0.4, 0.8),
                       facecolors=[shades[i % 2] for i in range(len(events))], edgecolor="white", linewidth=0.4)
        _label_longest(ax, events, row, span)
    ax.set_yticks(range(len(streams)), streams)
    ax.set_xlabel("time (us)")
    ax.set_title(title or gantt_title(result), fontsize=10)
    ax.axvline(result.lower_bound_us, color="red", linestyle="--", linewidth=1,
               label=f"lower bound {result.lower_bound_us:.1f} us")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


GANTT_LABELS = 8
"""The most bars a Gantt row labels (its longest ones that are wide enough for a name)."""


def _label_longest(ax, events: list, row: int, span: float) -> None:  # noqa: ANN001 - a matplotlib Axes
    """Write the names of the longest bars of a row inside them (those at least 4% of the chart wide)."""
    longest = sorted(events, key=lambda e: e.end - e.start, reverse=True)[:GANTT_LABELS]
    for e in longest:
        width = e.end - e.start
        if width < 0.04 * span:
            break
        chars = max(int(width / span * 130), 3)  # about 130 characters of 7 points across the axes
        name = _shorten(e.name, chars)
        ax.text(e.start + width / 2, row, name, ha="center", va="center", fontsize=7, clip_on=True)


def _shorten(name: str, chars: int) -> str:
    """`name` in at most `chars` characters: an async start's `-start` dropped (the bar is the collective),
    then the beginning elided, since HLO names differ at their ends (`all-reduce.8`, `fusion.12`)."""
    name = name.removesuffix("-start")
    return name if len(name) <= chars else "\u2026" + name[-max(chars - 1, 1):]


def gantt_title(result: SimulationResult) -> str:
    """The Gantt chart's title: makespan, and exposed communication and overlap, or "no communication"."""
    head = f"{result.computation}: makespan {result.makespan_us:.1f} us"
    if result.total_comm_us <= 0:
        return f"{head}, no communication"
    return (f"{head}, communication {result.total_comm_us:.1f} us of which {result.exposed_comm_us:.1f} us "
            f"exposed, overlap {format_overlap(result.overlap_fraction)}")


def format_overlap(fraction: float) -> str:
    """An overlap fraction as a percentage, never `-0%` (a fraction a rounding error below 0 is 0%)."""
    return f"{max(fraction, 0.0) + 0.0:.0%}"


MAX_PLOT_INCHES = 12.0
"""Widest (and tallest) a plot is drawn; at 110 dpi that is 1320 pixels, readable without zooming."""


COMPARISON_TITLE = ("makespan / module lower bound: 1.0 = the larger of the compute stream's work alone and the "
                    "busiest\ncommunication stream's work alone, one bound per module and GPU, the same for every "
                    "heuristic")
"""The comparison plot's title: what 1.0 means."""


def _bound_of(row: dict) -> float:
    """The bound a row's makespan is drawn against: the module's (`module_bound_us`, the same for every
    heuristic), or for rows without one the schedule's own `lower_bound_us`."""
    return row.get("module_bound_us") or row.get("lower_bound_us") or 0.0


def write_comparison_plot(rows: list[dict], path: str | Path) -> None:
    """Bars of makespan / the module's lower bound per module and heuristic (one bound per module and GPU,
    so that a slower heuristic reads higher): one group of bars per module, laid out vertically (modules
    down the page) when there are more than a few, so the figure keeps a readable size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modules = list(dict.fromkeys(r["module"] for r in rows))
    heuristics = list(dict.fromkeys(r["heuristic"] for r in rows))
    width = 0.8 / max(len(heuristics), 1)
    horizontal = len(modules) * len(heuristics) > 24
    bars = len(modules) * max(len(heuristics), 1)
    if horizontal:
        size = (10.0, min(MAX_PLOT_INCHES * 2, 1.5 + 0.18 * bars))
    else:
        size = (min(MAX_PLOT_INCHES, max(6.0, 0.45 * bars + 2.0)), 4.5)
    fig, ax = plt.subplots(figsize=size)
    for i, h in enumerate(heuristics):
        values = []
        for m in modules:
            r = next((r for r in rows if r["module"] == m and r["heuristic"] == h), None)
            values.append(r["makespan_us"] / _bound_of(r) if r and _bound_of(r) else 0)
        positions = [x + i * width for x in range(len(modules))]
        if horizontal:
            ax.barh(positions, values, width, label=h)
        else:
            ax.bar(positions, values, width, label=h)
    ticks = [x + width * (len(heuristics) - 1) / 2 for x in range(len(modules))]
    labels = [m if len(m) <= 40 else m[:18] + "..." + m[-19:] for m in modules]
    if horizontal:
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(ticks, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("makespan / module lower bound")
    else:
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(ticks, labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("makespan / module lower bound")
    ax.set_title(COMPARISON_TITLE if any(r.get("module_bound_us") for r in rows)
                 else "makespan / the schedule's own lower bound", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
