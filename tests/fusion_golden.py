"""Fusion decisions as structure: what `tests/test_fusion_decisions.py` compares against a golden file.

A module's fusion signature is, for each fusion instruction outside fused computations, a hash of its
structure (opcode and shape of every fused instruction with how they connect, the fusion kind, and the same
hash of each operand, recursively): which instructions went into which fusion, blind to instruction and
computation names (whose numbering is no decision). Two runs make the same decisions iff the sorted lists
are equal.

The golden (`tests/data/fusion_golden.json`) is written by running this file with the code whose
decisions are the reference (it was first written from the code before priority fusion's incremental
rework, 2ea48a0):

    PYTHONPATH=. python3 tests/fusion_golden.py
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from hlopt.corpus import use_cpu_devices

use_cpu_devices()  # as tests/conftest.py: the corpus needs 8 devices

GOLDEN = Path(__file__).resolve().parent / "data" / "fusion_golden.json"
#: what runs before the comparison: the `default` pipeline's simplification, then XLA:GPU's fusion passes
PIPELINE = "call-inliner,simplify,fusion"
#: layers of the benchmarks' transformer training steps added to the corpus (corpus/transformer.py)
TRANSFORMER_LAYERS = (1, 3)


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


_TRAILER = re.compile(r"(\d+ |FileNames|FunctionNames|FileLocations|StackFrames)")


def input_digest(text: str) -> str:
    """Hash of an input module without its metadata and stack-frame trailers (XLA's optimized text names the
    Python frames that compiled it: the test's differ from this script's)."""
    body = "\n".join(line for line in text.splitlines() if not _TRAILER.match(line))
    return _digest(re.sub(r", metadata=\{[^}]*\}", "", body))


def _structure(inst, memo: dict) -> str:
    """Hash of `inst`'s structure: opcode, shape, fusion kind and fused body, operands' hashes."""
    got = memo.get(inst)
    if got is not None:
        return got
    stack = [inst]
    while stack:  # iterative post-order: modules are deep
        top = stack[-1]
        pending = [o for o in top.operands if o not in memo]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        if top in memo:
            continue
        parts = [top.opcode, str(top.shape)]
        if top.opcode == "parameter":
            parts.append(str(top.attrs["parameter_number"]))
        if top.opcode == "fusion":
            body = top.attrs["calls"]
            parts += [str(top.attrs.get("kind")), _structure(body.root, {})]
        parts += [memo[o] for o in top.operands]
        memo[top] = _digest("|".join(parts))
    return memo[inst]


def fusion_signature(module) -> list[str]:
    """The sorted structure hashes of every fusion outside fused computations."""
    fused = {c for comp in module.computations for i in comp.instructions if i.opcode == "fusion"
             for c in i.called_computations}
    out: list[str] = []
    for comp in module.computations:
        if comp in fused:
            continue
        memo: dict = {}
        out += [f"{comp.name}:{_structure(i, memo)}" for i in comp.instructions if i.opcode == "fusion"]
    return sorted(out)


def golden_inputs() -> list[tuple[str, str]]:
    """(id, HLO text) of every module the golden covers: the corpus (unoptimized and XLA:CPU-optimized) and
    the benchmarks' transformer steps."""
    from hlopt.corpus.programs import corpus_texts
    from hlopt.corpus.transformer import transformer_step_text

    inputs = [(e.id, e.text) for e in corpus_texts()]
    inputs += [(f"transformer_step_{n}", transformer_step_text(n)) for n in TRANSFORMER_LAYERS]
    return inputs


def fused(text: str) -> list[str]:
    """The fusion signature of `text` after `PIPELINE`."""
    from hlopt.passes.framework.pipeline import Pipeline

    from hlopt import hlo

    module = hlo.parse(text)
    Pipeline.parse(PIPELINE).run(module)
    return fusion_signature(module)


def main() -> int:
    """Write the golden from the code as it is."""
    import jax

    entries = {name: {"input": input_digest(text), "fusions": fused(text)} for name, text in golden_inputs()}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"jax": jax.__version__, "pipeline": PIPELINE, "modules": entries}, indent=0,
                                 sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}: {len(entries)} modules, {sum(len(e['fusions']) for e in entries.values())} fusions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
