"""Sharded programs as XLA prints them: many sharded parameters and outputs (XLA writes `/*index=5*/` inside
their tuple shapes, operand lists, tuple shardings and entry_computation_layout).

jax programs with 6, 12 and 40 sharded parameters and outputs, written with `jax.jit` + NamedSharding and
with `shard_map` on 8 CPU devices, lowered by jax (`as_text(dialect="hlo")`) and dumped by XLA before and
after its optimization (`xla_dump_to`). Each text goes through the canonical round trip (XLA reads our print
as it reads its own) and `hlopt check -p default` (the module before and after the default pipeline, run on
XLA CPU with the same inputs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_roundtrip import assert_roundtrip

COUNTS = (6, 12, 40)
KINDS = ("jit", "shard_map")


def _function(kind: str, count: int):
    """`count` arrays in, `count` out; (function, argument specs)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    specs = [P("data", None), P(None, "model"), P("data", "model"), P()]  # every kind of sharding XLA prints
    shardings = [NamedSharding(mesh, specs[i % len(specs)]) for i in range(count)]
    args = [jax.ShapeDtypeStruct((8, 4), jnp.float32 if i % 3 else jnp.bfloat16, sharding=s)
            for i, s in enumerate(shardings)]
    if kind == "jit":
        def step(*xs):
            total = sum(jnp.sum(x.astype(jnp.float32)) for x in xs)
            return tuple((jnp.tanh(x) * total).astype(x.dtype) for x in xs)

        return jax.jit(step, out_shardings=tuple(shardings)), args

    from jax import shard_map

    def body(*xs):
        total = jax.lax.psum(sum(jnp.sum(x.astype(jnp.float32)) for x in xs), ("data", "model"))
        return tuple((x * total).astype(x.dtype) for x in xs)

    in_specs = tuple(specs[i % len(specs)] for i in range(count))
    mapped = shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=in_specs, check_vma=False)
    return jax.jit(mapped), args


@pytest.fixture(scope="module")
def sharded_texts(tmp_path_factory) -> dict[tuple[str, int], dict[str, Path]]:
    """(kind, count) -> {"lowered", "before_optimizations", "after_optimizations": file}."""
    out: dict[tuple[str, int], dict[str, Path]] = {}
    for kind in KINDS:
        for count in COUNTS:
            fn, args = _function(kind, count)
            lowered = fn.lower(*args)
            dump = tmp_path_factory.mktemp(f"{kind}{count}")
            lowered.compile(compiler_options={"xla_dump_to": str(dump), "xla_dump_hlo_as_text": True})
            files = {"lowered": dump / "lowered.hlo"}
            files["lowered"].write_text(lowered.as_text(dialect="hlo"))
            for stage in ("before_optimizations", "after_optimizations"):
                found = sorted(dump.glob(f"*{stage}.txt"))  # XLA:CPU names the latter cpu_after_optimizations
                assert found, f"XLA dumped no {stage} module for {kind}/{count}: {sorted(dump.iterdir())}"
                files[stage] = found[0]
            out[(kind, count)] = files
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("count", COUNTS)
def test_xla_prints_index_comments_and_we_round_trip_them(sharded_texts, kind, count):
    for stage, path in sharded_texts[(kind, count)].items():
        text = path.read_text()
        assert "/*index=5*/" in text, f"{stage}: XLA wrote no index comment (the test lost its point)"
        module = assert_roundtrip(text, f"{kind}{count}:{stage}")
        printed = module.to_text()
        assert "/*index=5*/" in printed, f"{stage}: we print no index comment where XLA does"
        if count >= 6 and "sharding={{" in text:
            assert any("/*index=5*/{" in line for line in printed.splitlines() if "sharding={{" in line)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("count", COUNTS)
def test_check_default_pipeline_on_sharded_dumps(sharded_texts, kind, count, capsys):
    from hlopt.cli.main import main

    for stage in ("before_optimizations", "after_optimizations"):
        path = sharded_texts[(kind, count)][stage]
        code = main(["check", str(path), "-p", "default", "--devices", "8", "--json"])
        out = capsys.readouterr().out
        assert code == 0, f"{kind}{count}:{stage}: {out[-2000:]}"
