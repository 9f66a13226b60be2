"""Larger training steps of the comparisons with XLA:GPU: two one-device steps big enough for memory traffic
to matter beside launch overhead (`larger_programs`, `larger_texts`), and the 8-device steps the scheduler
comparison runs (`eight_device_steps`).
"""

from __future__ import annotations

__all__ = ["larger_programs", "larger_texts", "train_step_text", "fsdp_mlp_text", "eight_device_steps"]


def larger_programs() -> list[tuple[str, str]]:
    """Two training steps big enough for memory traffic to matter (beside launch overhead)."""
    import jax
    import jax.numpy as jnp
    from hlopt.corpus.transformer import transformer_step_text

    def mlp_step(ps, x, y):
        def loss(ps):
            h = x
            for w, b in ps:
                h = jax.nn.gelu(h @ w + b)
            return jnp.mean((h - y) ** 2)

        g = jax.grad(loss)(ps)
        return jax.tree.map(lambda a, b: a - 1e-3 * b, ps, g)

    ps = [(jnp.ones((1024, 1024)) * 0.01, jnp.zeros(1024)) for _ in range(3)]
    mlp = jax.jit(mlp_step).lower(ps, jnp.ones((256, 1024)), jnp.ones((256, 1024))).as_text(dialect="hlo")
    return [("transformer_step_2x512", transformer_step_text(2, 512, 2048)), ("mlp_step_3x1024", mlp)]


def larger_texts() -> dict[str, tuple[str, int]]:
    """`larger_programs` as name -> (text, devices)."""
    return {name: (text, 1) for name, text in larger_programs()}


def train_step_text(microbatches: int, batch: int, seq: int, d_model: int, d_ff: int) -> str:
    """The demo's data-parallel transformer step (`hlopt.cli.demo_program`) at this size, unoptimized HLO."""
    from hlopt.cli.demo_program import make_train_step

    fn, args = make_train_step(microbatches, batch, seq, d_model, d_ff)
    return fn.lower(*args).as_text(dialect="hlo")


def fsdp_mlp_text(layers: int = 4, width: int = 2048, batch: int = 512) -> str:
    """A 8-way FSDP MLP step in shard_map: all-gather each weight, reduce-scatter each gradient."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))

    def step(ws, x):
        def loss(ws):
            h = x
            for w in ws:
                h = jnp.tanh(h @ lax.all_gather(w, "d", tiled=True))
            return jnp.mean(h ** 2)

        g = jax.grad(loss)(ws)
        return [w - 1e-3 * gw for w, gw in zip(ws, g, strict=True)]

    ws = [jnp.ones((width, width), jnp.float32) * 0.01 for _ in range(layers)]
    x = jnp.ones((batch * 8, width), jnp.float32)
    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=([P("d")] * layers, P("d")), out_specs=[P("d")] * layers,
                              check_vma=False))
    return f.lower(ws, x).as_text(dialect="hlo")


def eight_device_steps(names: list[str] | None = None) -> list[tuple[str, str]]:
    """(name, unoptimized HLO) of the 8-device programs the scheduler comparison runs: two data-parallel
    training steps, an FSDP MLP step and the 8-device corpus programs."""
    from hlopt.corpus import use_cpu_devices

    use_cpu_devices()  # before jax is imported

    builders = {
        "dp_train_step_512": lambda: train_step_text(4, 64, 128, 512, 2048),
        "dp_train_step_1024": lambda: train_step_text(2, 64, 256, 1024, 4096),
        "fsdp_mlp_4x2048": fsdp_mlp_text,
    }
    out = [(n, b()) for n, b in builders.items() if names is None or n in names]
    from hlopt.corpus.programs import corpus_texts

    out += [(e.id, e.text) for e in corpus_texts(optimized=False)
            if e.devices == 8 and (names is None or e.id in names)]
    return out
