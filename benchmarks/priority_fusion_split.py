"""What priority-fusion's time is made of, and what any pure-Python pass pays just to hold its result.

    python3 benchmarks/priority_fusion_split.py [--instructions 20000 | --hlo FILE] [--repeat 2] [--json]

The module is prepared as `-p default` prepares it for fusion (`call-inliner,simplify`), then `priority-fusion`
runs alone, its time split four ways (wall clock, best run by total):

- building: making and growing the fusions (`fusion_building`'s `fuse_into_new_fusion`, `fuse_producer`,
  `wrap_in_fusion`, `remove_fusion`, as the pass calls them);
- priority updates: `push`, which recomputes a producer's priority after a neighbour changed (XLA's
  PriorityFusionQueue updates the same instructions) and puts it in the heap, the first pass over the
  computation included;
- never-slower check: hlopt's check that the fusion as built is not slower than its parts (XLA has none);
- the rest: popping, the bookkeeping of each decision (caches forgotten, classes remembered), the explanations,
  the small constants at the end, the run's finish.

The wrappers that time the parts cost a few percent; the total without them is reported too. The floor beside
it: parsing the text of priority-fusion's output (`hlo.parse`, hlopt's fast path), what reading the finished
module into hlopt's IR costs. A priority fusion written in Python builds every one of those objects, and decides
(the priority updates and the rest) on top of it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: what priority_fusion calls to build fusions (by the names it imports them under)
BUILDERS = ("fuse_into_new_fusion", "fuse_producer", "wrap_in_fusion", "remove_fusion")
PARTS = ("building", "priority updates", "never-slower check")


def _timed(fn: Callable[..., Any], totals: dict[str, float], counts: dict[str, int], part: str,
           active: dict[str, int]) -> Callable[..., Any]:
    """`fn`, its wall time added to `totals[part]` and its calls to `counts[part]`; a call made while another of
    the same part runs (`active`, shared by the wrappers) is counted within that one, not again."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if active[part]:
            return fn(*args, **kwargs)
        active[part] += 1
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[part] += time.perf_counter() - start
            counts[part] += 1
            active[part] -= 1

    return wrapper


@contextmanager
def split_timers(totals: dict[str, float], counts: dict[str, int]) -> Iterator[None]:
    """Time priority-fusion's parts into `totals` and `counts` while inside; everything is put back after."""
    from hlopt.passes.fusion import priority_fusion as pf

    queue = pf._Queue  # noqa: SLF001 - what is timed is the queue's own update and check
    saved = [(pf, name, getattr(pf, name)) for name in BUILDERS]
    saved += [(queue, "push", queue.push), (queue, "check", queue.check)]
    active = dict.fromkeys(PARTS, 0)
    try:
        for owner, name, fn in saved:
            part = "building" if owner is pf else "priority updates" if name == "push" else "never-slower check"
            setattr(owner, name, _timed(fn, totals, counts, part, active))
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def _prepared(text: str, filename: str) -> Any:
    """The module as `-p default` hands it to fusion."""
    from hlopt.hlo import parse
    from hlopt.passes.framework.pipeline import Pipeline

    module = parse(text, filename=filename)
    Pipeline.parse("call-inliner,simplify", verify_each=False, check_changed=False).run(module)
    return module


def _fuse(module: Any) -> float:
    """Run priority-fusion alone on `module`; its wall seconds."""
    from hlopt.passes.framework.pipeline import Pipeline

    pipeline = Pipeline.parse("priority-fusion", verify_each=False, check_changed=False)
    start = time.perf_counter()
    pipeline.run(module)
    return time.perf_counter() - start


def measure(text: str, repeat: int = 2, filename: str = "<text>") -> dict:
    """The split (best of `repeat` by total), the total without timers (best of `repeat`), and the floor."""
    from hlopt.hlo import parse

    best: dict | None = None
    for _ in range(repeat):
        totals = dict.fromkeys(PARTS, 0.0)
        counts = dict.fromkeys(PARTS, 0)
        module = _prepared(text, filename)
        to_fuse = module.instruction_count()
        with split_timers(totals, counts):
            total = _fuse(module)
        if best is None or total < best["seconds"]:
            best = {"seconds": total, "parts": totals, "calls": counts, "to_fuse": to_fuse, "module": module}
    assert best is not None
    plain = min(_fuse(_prepared(text, filename)) for _ in range(repeat))
    out_text = best.pop("module").to_text()
    parse_seconds = min(_parse_seconds(out_text, parse) for _ in range(repeat))
    parts = best["parts"]
    rest = best["seconds"] - sum(parts.values())
    output = parse(out_text)
    return {"instructions_to_fuse": best["to_fuse"], "seconds_timed": best["seconds"], "seconds": plain,
            "parts": {**parts, "rest": rest}, "calls": best["calls"],
            "decisions_seconds": best["seconds"] - parts["building"],
            "output_instructions": sum(len(c) for c in output.computations),
            "output_parse_seconds": parse_seconds}


def _parse_seconds(text: str, parse: Callable[[str], Any]) -> float:
    start = time.perf_counter()
    parse(text)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--instructions", type=int, default=20_000, help="size of the corpus transformer step")
    source.add_argument("--hlo", help="an HLO text module instead")
    ap.add_argument("--repeat", type=int, default=2, help="best of this many runs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        from hlopt.corpus.transformer import step_or_file

        text, what = step_or_file(args.instructions, args.hlo)
        got = measure(text, args.repeat, args.hlo or "<text>")
    except (OSError, ValueError) as e:  # a missing file, a module hlopt refuses (HloParseError is a ValueError)
        print(f"priority_fusion_split: error: {e}", file=sys.stderr)
        return 2
    got["module"] = what
    if args.json:
        print(json.dumps(got, indent=2))
        return 0
    timed = got["seconds_timed"]
    print(f"{what}: {got['instructions_to_fuse']} instructions to fuse; priority-fusion {got['seconds']:.3f} s "
          f"({timed:.3f} s with the timers)\n")
    print("| part | seconds | share | calls |")
    print("|---|---:|---:|---:|")
    for part, seconds in got["parts"].items():
        calls = got["calls"].get(part)
        print(f"| {part} | {seconds:.3f} | {seconds / timed:.0%} | {calls if calls is not None else ''} |")
    print(f"\ndeciding without building: {got['decisions_seconds']:.3f} s; parsing priority-fusion's output "
          f"({got['output_instructions']} instructions, fused computations included): "
          f"{got['output_parse_seconds']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
