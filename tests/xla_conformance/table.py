"""Print the XLA pass-test conformance table: `| pass | cases | agree |` (tests/xla_conformance/README.md).

    python3 -m tests.xla_conformance.table [--verbose] [PASS ...]
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: pass name -> asset module (tests/xla_conformance/<module>.py); absent modules are left out
PASSES = {
    "while-loop-all-reduce-code-motion": "while_loop_all_reduce_code_motion",
    "call-inliner": "call_inliner",
    "block-scaling-rewriter": "block_scaling_rewriter",
    "priority-fusion": "priority_fusion",
    "collective-pipeliner": "collective_pipeliner",
}


def rows(names: list[str] | None = None) -> list[tuple[str, list]]:
    """(pass, outcomes) for every asset present (or the named ones)."""
    out = []
    for name, module in PASSES.items():
        if names and name not in names:
            continue
        if not (HERE / f"{module}.py").is_file():
            continue
        asset = importlib.import_module(f".{module}", __package__)  # xla_conformance (pytest) or tests.xla_conformance
        out.append((name, [asset.run_case(c) for c in asset.CASES]))
    return out


def main(argv: list[str]) -> int:
    from .common import print_table

    names = [a for a in argv if not a.startswith("-")]
    unknown = sorted(set(names) - set(PASSES))
    if unknown:
        print(f"table.py: unknown pass {unknown[0]!r}; one of {', '.join(PASSES)}", file=sys.stderr)
        return 2
    print_table(rows(names), verbose="--verbose" in argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
