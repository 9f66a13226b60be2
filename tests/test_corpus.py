"""Every corpus module: parse, verify, print, XLA-oracle equality, idempotent print, and execution on XLA.

Unoptimized modules run through `runtime` on the program's own arguments and must equal jax's result;
XLA:CPU's optimized modules (re-entered through `runtime.execution.reentry`) must equal the unoptimized module,
multi-device ones shard by shard as their sharding annotations say.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hlopt.corpus.programs import PROGRAMS, corpus_texts, program_by_name
from hlopt.runtime.execution.sharding import Sharding, assemble, parse_sharding, split

from hlopt import hlo, runtime

ENTRIES = corpus_texts()


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_parse_print_matches_xla(entry):
    module = hlo.parse(entry.text, filename=entry.id)
    text = module.to_text()
    assert runtime.xla_canonical_text(text) == runtime.xla_canonical_text(entry.text)
    assert hlo.parse(text).to_text() == text, "printing is not idempotent"


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_verifies(entry):
    verify = pytest.importorskip("hlopt.hlo.verifier").verify
    verify(hlo.parse(entry.text, filename=entry.id))


def _flat_args(name: str) -> tuple[list[np.ndarray], object, tuple]:
    fn, args = program_by_name(name).build()
    return [np.asarray(x) for x in jax.tree.leaves(args)], fn, args


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_unoptimized_runs_like_jax(prog):
    entry = next(e for e in ENTRIES if e.id == prog.name)
    module = hlo.parse(entry.text)
    inputs, fn, args = _flat_args(prog.name)
    assert len(inputs) == len(module.entry.parameters)
    expected = [np.asarray(x) for x in jax.tree.leaves((fn if hasattr(fn, "lower") else jax.jit(fn))(*args))]
    actual = runtime.execute(module, inputs)
    result = runtime.compare(expected, actual, rtol=1e-5, atol=1e-5)
    assert result.ok, str(result)


def _optimized_outputs(opt: hlo.Module, inputs: list[np.ndarray], devices: int,
                       global_shapes: list[tuple]) -> list[np.ndarray]:
    if devices == 1:
        return runtime.execute(opt, inputs)
    params = opt.entry.parameters
    shardings = [parse_sharding(str(p.get("sharding", "{replicated}"))) for p in params]
    per_device = [np.stack(split(x, s, devices)) for x, s in zip(inputs, shardings, strict=True)]
    outs = runtime.execute(opt, per_device)
    root_sharding = opt.entry.root.get("sharding")
    if root_sharding is not None:
        out_shardings = parse_sharding(str(root_sharding))
        if not isinstance(out_shardings, list):
            out_shardings = [out_shardings] * len(outs)
    else:  # XLA keeps the output sharding outside the text: tile where per-device and global shapes differ
        out_shardings = [_tiling_from_shapes(o.shape[1:], shape, devices) for o, shape in zip(outs, global_shapes,
                                                                                            strict=True)]
    return [assemble(list(o), s) for o, s in zip(outs, out_shardings, strict=True)]


def _tiling_from_shapes(local: tuple, global_shape: tuple, devices: int) -> Sharding:
    tiles = tuple(g // max(l_, 1) for l_, g in zip(local, global_shape, strict=True))
    if tiles == (1,) * len(tiles):
        return Sharding("replicated")
    return Sharding("tiled", tiles, tuple(range(devices)))


@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_optimized_runs_like_unoptimized(prog):
    if prog.reentry_refused:
        pytest.skip(prog.reentry_refused)
    unopt = hlo.parse(next(e for e in ENTRIES if e.id == prog.name).text)
    opt = hlo.parse(next(e for e in ENTRIES if e.id == prog.name + ".opt").text)
    inputs, _, _ = _flat_args(prog.name)
    expected = runtime.execute(unopt, inputs)
    actual = _optimized_outputs(opt, inputs, prog.devices, [e.shape for e in expected])
    result = runtime.compare(expected, actual, rtol=1e-4, atol=1e-5)
    assert result.ok, str(result)
