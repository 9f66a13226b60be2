"""Does a speed-up change nothing? Writes what `-p default` (and `xla-gpu-after` after the `default` pipeline's
simplification) makes of every corpus program and of the transformer steps: the printed module, then every
explanation of the run with its floats as `repr` writes them (to the last bit), one file per module and
pipeline; then compares two such directories.

    python3 benchmarks/same_output.py write DIR [--sizes 5k,20k] [--no-corpus]
    python3 benchmarks/same_output.py compare DIR_BEFORE DIR_AFTER

Run `write` with the code before the change (a checkout of it with PYTHONPATH set to it) and with the code
after, then `compare`: it lists the files that differ (paths of the checkout that the XLA:CPU-optimized
programs name in their stack frames are left out) and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from hlopt.corpus import use_cpu_devices

#: (file prefix, pipeline spec)
PIPELINES = (("default", "default"), ("xla-gpu-after", "call-inliner,simplify,xla-gpu-after"))
_CHECKOUT = re.compile(r"\"[^\"]*?/(corpus|tests|benchmarks)/")


def _inputs(sizes: list[str], corpus: bool) -> list[tuple[str, str]]:
    from hlopt.corpus.transformer import SIZES, module_of_size

    inputs: list[tuple[str, str]] = []
    if corpus:
        from hlopt.corpus.programs import corpus_texts

        inputs += [(e.id, e.text) for e in corpus_texts()]
    inputs += [(f"step{s}", module_of_size(SIZES[s])[0]) for s in sizes if s]
    return inputs


def _run(text: str, spec: str) -> str:
    from hlopt.passes.framework.pipeline import Pipeline

    from hlopt import hlo

    module = hlo.parse(text)
    try:
        result = Pipeline.parse(spec).run(module)
    except Exception as e:  # noqa: BLE001 - a failure is an output too: it must not change either
        return f"ERROR {type(e).__name__}: {e}\n"
    exact = (repr(e) if isinstance(e, str) else  # a pass that explains itself in words
             repr((e.pass_name, e.computation, e.producer, e.consumers, e.taken, e.reason, e.gain_us, e.before_us,
                   e.after_us, e.launches_saved, e.rule)) for e in result.explanations)
    return module.to_text() + "\n# explanations\n" + "\n".join(exact) + "\n"


def write(out: Path, sizes: list[str], corpus: bool) -> int:
    """Write every output into `out`."""
    use_cpu_devices()
    out.mkdir(parents=True, exist_ok=True)
    inputs = _inputs(sizes, corpus)
    for prefix, spec in PIPELINES:
        for name, text in inputs:
            (out / f"{prefix}.{name}.txt").write_text(_run(text, spec))
    print(f"wrote {len(inputs) * len(PIPELINES)} outputs to {out}")
    return 0


def compare(before: Path, after: Path) -> int:
    """List the outputs that differ; 1 if any does."""
    names = sorted({p.name for p in before.glob("*.txt")} | {p.name for p in after.glob("*.txt")})
    differ = []
    for name in names:
        a, b = before / name, after / name
        if not (a.exists() and b.exists()) or _CHECKOUT.sub('"', a.read_text()) != _CHECKOUT.sub('"', b.read_text()):
            differ.append(name)
    for name in differ:
        print(f"differs: {name}")
    print(f"{len(names)} outputs compared, {len(differ)} differ")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True)
    w = sub.add_parser("write")
    w.add_argument("out", type=Path)
    w.add_argument("--sizes", default="5k,20k")
    w.add_argument("--no-corpus", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args()
    if args.verb == "write":
        return write(args.out, args.sizes.split(","), not args.no_corpus)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
