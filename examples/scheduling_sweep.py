"""Sweep scheduling heuristics over synthetic modules and plot makespan / the module's lower bound.

    python3 examples/scheduling_sweep.py [OUT.png]
"""

from __future__ import annotations

import sys

from hlopt.cli.schedule import bench_rows
from hlopt.scheduler.report import write_comparison_plot


def main() -> None:
    """Every pattern x communication ratio x heuristic on the H100 model."""
    inputs = [f"synthetic:{p}:8:{r}" for p in ("fsdp", "data-parallel", "pipeline", "mixed") for r in (0.25, 1, 4)]
    rows = bench_rows(inputs, ["original-order", "xla-default", "start-delay", "critical-path", "memory-first"],
                      ["h100"], "analytical", limit=1, progress=False)
    for r in rows:
        print(f"{r['module']:28s} {r['heuristic']:15s} makespan / module bound {r['makespan_over_module_bound']:.3f} "
              f"({r['module_bound_kind']} alone)")
    out = sys.argv[1] if len(sys.argv) > 1 else "scheduling_sweep.png"
    write_comparison_plot(rows, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
