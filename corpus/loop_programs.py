"""shard_map training loops on 8 devices, written as users write them, for while-loop-all-reduce-code-motion
(benchmarks/collective_motion.py, tests/test_wlarcm_vs_xla.py): `scan_program(kind)` (gradient accumulation,
per-step losses, reduce-scatter gradients), and `LOOP_PROGRAMS`, name -> builder of (jitted function, args):
gradient accumulation with psum, DUS losses, psum of mesh-invariant values, chained psums, scan over layers,
fori_loop, 2-D meshes, and two shard_map loop programs of the corpus.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["scan_program", "demo_program", "LOOP_PROGRAMS", "loop_program"]


def _mesh():
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:8]), ("d",))


def scan_program(kind: str, d: int = 512, microbatches: int = 8, batch: int = 64) -> tuple[Callable, tuple]:
    """A shard_map loop over microbatches: psum'ed gradients accumulated, per-step losses collected (DUS form),
    or reduce-scattered gradients accumulated."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def grad(w, x):
        return jax.grad(lambda w_: jnp.sum(jnp.tanh(x @ w_)))(w)

    def body(w, xs):
        if kind == "grad_accumulation":
            return lax.scan(lambda acc, x: (acc + lax.psum(grad(w, x), "d"), None), jnp.zeros_like(w), xs)[0]
        if kind == "losses":
            return lax.scan(lambda c, x: (c, lax.psum(jnp.sum(jnp.tanh(x @ w)), "d")), 0.0, xs)[1]
        if kind == "losses_twice":
            return lax.scan(lambda c, x: (c, lax.psum(lax.psum(jnp.sum(jnp.tanh(x @ w)), "d"), "d")), 0.0, xs)[1]
        return lax.scan(lambda acc, x: (acc + lax.psum_scatter(grad(w, x), "d", scatter_dimension=0, tiled=True),
                                        None), jnp.zeros((d // 8, d)), xs)[0]

    out = P("d") if kind == "reduce_scatter" else P()
    f = jax.shard_map(body, mesh=_mesh(), in_specs=(P(), P(None, "d")), out_specs=out, check_vma=False)
    w = jnp.linspace(-1, 1, d * d, dtype=jnp.float32).reshape(d, d) / d
    xs = jnp.linspace(0, 1, microbatches * batch * d, dtype=jnp.float32).reshape(microbatches, batch, d)
    return jax.jit(f), (w, xs)


def demo_program() -> tuple[Callable, tuple]:
    """The demo's data-parallel transformer step (`hlopt.cli.demo_program`)."""
    from hlopt.cli.demo_program import make_train_step

    return make_train_step()


_W_SHAPE, _XS_SHAPE = (8, 8), (4, 16, 8)


def _inputs():
    import jax.numpy as jnp

    w = jnp.linspace(-1, 1, 64, dtype=jnp.float32).reshape(_W_SHAPE)
    xs = jnp.linspace(0, 1, 4 * 16 * 8, dtype=jnp.float32).reshape(_XS_SHAPE)
    return w, xs


def _loss(w, x):
    import jax.numpy as jnp

    return jnp.sum(jnp.tanh(x @ w))


def _shard_mapped(body: Callable, out=None, check_vma: bool = False, in_specs=None, mesh=None) -> Callable:
    import jax
    from jax.sharding import PartitionSpec as P

    in_specs = in_specs if in_specs is not None else (P(), P(None, "d"))
    f = jax.shard_map(body, mesh=mesh or _mesh(), in_specs=in_specs, out_specs=P() if out is None else out,
                      check_vma=check_vma)
    return jax.jit(f)


def _grad_accumulation():
    import jax
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        return lax.scan(lambda a, x: (a + lax.psum(jax.grad(_loss)(w, x), "d"), None), jnp.zeros_like(w), xs)[0]

    return _shard_mapped(body), _inputs()


def _dus_losses(twice: bool = False):
    from jax import lax

    def body(w, xs):
        def step(c, x):
            total = lax.psum(_loss(w, x), "d")
            return c, lax.psum(total, "d") if twice else total

        return lax.scan(step, 0.0, xs)[1]

    return _shard_mapped(body), _inputs()


def _grad_of_psum_loss():
    """check_vma=False: the gradient of a psum'ed loss is psum'ed once more by the user (two chained all-reduces,
    plus jax's psum of the cotangent seed)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        def step(a, x):
            g = jax.grad(lambda w_: lax.psum(_loss(w_, x), "d"))(w)
            return a + lax.psum(g, "d"), None

        return lax.scan(step, jnp.zeros_like(w), xs)[0]

    return _shard_mapped(body), _inputs()


def _dus_accumulation(twice: bool = False):
    """Rows accumulated with dynamic_slice + add + dynamic_update_slice at the scan index."""
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        def step(acc, ix):
            i, x = ix
            v = lax.psum(jnp.sum(jnp.tanh(x @ w), 0, keepdims=True), "d")
            v = lax.psum(v, "d") if twice else v
            row = lax.dynamic_slice_in_dim(acc, i, 1) + v
            return lax.dynamic_update_slice_in_dim(acc, row, i, 0), None

        return lax.scan(step, jnp.zeros((4, 8)), (jnp.arange(4), xs))[0]

    return _shard_mapped(body), _inputs()


def _invariant_losses():
    """check_vma=True: a psum of a value invariant over the mesh axis (jax's psum_invariant)."""
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        return lax.scan(lambda c, x: (c, lax.psum(jnp.sum(jnp.tanh(w * jnp.sum(x))), "d")), 0.0, xs)[1]

    return _shard_mapped(body, check_vma=True), _inputs()


def _vma_grad_accumulation():
    """check_vma=True: jax inserts the gradient psum itself (the transpose of pvary) and psums the loss."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def body(w, xs):
        def step(a, x):
            loss, g = jax.value_and_grad(lambda w_: lax.psum(_loss(w_, x), "d"))(w)
            return a + g, loss

        return lax.scan(step, jnp.zeros_like(w), xs)

    return _shard_mapped(body, out=(P(), P()), check_vma=True), _inputs()


def _scan_over_layers():
    """check_vma=True: the backward scan over 3 layers psums each layer's gradient and stores it (reversed DUS)."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def body(ws, x):
        def f(ws):
            return lax.psum(jnp.sum(lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]), "d")

        return jax.grad(f)(ws)

    w, xs = _inputs()
    ws = jnp.stack([w * (i + 1) for i in range(3)])
    return _shard_mapped(body, check_vma=True, in_specs=(P(), P("d"))), (ws, xs[0])


def _fori_grad_accumulation():
    import jax
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        return lax.fori_loop(0, 4, lambda i, a: a + lax.psum(jax.grad(_loss)(w, xs[i]), "d"), jnp.zeros_like(w))

    return _shard_mapped(body), _inputs()


def _mesh_2d_accumulation():
    """A 4x2 (dp, tp) mesh: the psum runs over dp only (replica groups of 4)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("dp", "tp"))

    def body(w, xs):
        return lax.scan(lambda a, x: (a + lax.psum(jax.grad(_loss)(w, x), "dp"), None), jnp.zeros_like(w), xs)[0]

    return _shard_mapped(body, mesh=mesh, in_specs=(P(), P(None, "dp"))), _inputs()


def _pmean_losses():
    """pmean: all-reduce then divide (neither XLA nor hlopt moves a divided all-reduce)."""
    from jax import lax

    def body(w, xs):
        return lax.scan(lambda c, x: (c, lax.pmean(_loss(w, x), "d")), 0.0, xs)[1]

    return _shard_mapped(body), _inputs()


def _nested_loops():
    """Epochs x microbatches: the gradient all-reduce leaves the inner loop, stays in the outer one."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        def epoch(w, _):
            g = lax.scan(lambda a, x: (a + lax.psum(jax.grad(_loss)(w, x), "d"), None), jnp.zeros_like(w), xs)[0]
            return w - 0.1 * g, None

        return lax.scan(epoch, w, None, length=2)[0]

    return _shard_mapped(body), _inputs()


def _bf16_gradients():
    """bf16 gradients psum'ed, accumulated in f32 (the moved sum rounds once: bf16 tolerance)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        def step(a, x):
            g = jax.grad(_loss)(w.astype(jnp.bfloat16), x.astype(jnp.bfloat16))
            return a + lax.psum(g, "d").astype(jnp.float32), None

        return lax.scan(step, jnp.zeros_like(w), xs)[0]

    return _shard_mapped(body), _inputs()


def _gradients_and_losses():
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def body(w, xs):
        def step(a, x):
            loss, g = jax.value_and_grad(_loss)(w, x)
            return a + lax.psum(g, "d"), lax.psum(loss, "d")

        return lax.scan(step, jnp.zeros_like(w), xs)

    return _shard_mapped(body, out=(P(), P())), _inputs()


def _pytree_gradients():
    """A psum of a dict of gradients (one all-reduce per leaf), accumulated with tree.map."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    def body(p, xs):
        def step(a, x):
            g = lax.psum(jax.grad(lambda p_: jnp.sum(jnp.tanh(x @ p_["a"]) @ p_["b"]))(p), "d")
            return jax.tree.map(jnp.add, a, g), None

        return lax.scan(step, jax.tree.map(jnp.zeros_like, p), xs)[0]

    w, xs = _inputs()
    specs = {"a": P(), "b": P()}
    return _shard_mapped(body, out=specs, in_specs=(specs, P(None, "d"))), ({"a": w, "b": 2 * w}, xs)


def _optimizer_loop():
    """SGD steps in a scan: each step's update needs its own psum (nothing may move)."""
    import jax
    from jax import lax

    def body(w, xs):
        return lax.scan(lambda w, x: (w - 0.01 * lax.psum(jax.grad(_loss)(w, x), "d"), None), w, xs)[0]

    return _shard_mapped(body), _inputs()


def _fori_losses_at_set():
    """`losses.at[i].set(psum(loss))` in a fori_loop: jax emits a scatter, which neither moves."""
    import jax.numpy as jnp
    from jax import lax

    def body(w, xs):
        return lax.fori_loop(0, 4, lambda i, ls: ls.at[i].set(lax.psum(_loss(w, xs[i]), "d")), jnp.zeros(4))

    return _shard_mapped(body), _inputs()


def _jit_data_parallel():
    """jit with a batch-sharded input (GSPMD, no shard_map): XLA's partitioner makes the gradient all-reduce, so
    the captured module has none; XLA:GPU's partitioned module must then not keep one in the loop either."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def f(w, xs):
        return lax.scan(lambda a, x: (a + jax.grad(_loss)(w, x), None), jnp.zeros_like(w), xs)[0]

    mesh = _mesh()
    shardings = (NamedSharding(mesh, P()), NamedSharding(mesh, P(None, "d")))
    return jax.jit(f, in_shardings=shardings, out_shardings=NamedSharding(mesh, P())), _inputs()


def _corpus(name: str):
    def build():
        from hlopt.corpus.programs import program_by_name

        return program_by_name(name).build()

    return build


#: name -> builder of (jitted function, args), all on 8 devices
LOOP_PROGRAMS: dict[str, Callable[[], tuple[Callable, tuple]]] = {
    "grad accumulation (psum in scan)": _grad_accumulation,
    "DUS losses": _dus_losses,
    "DUS losses, psum twice": lambda: _dus_losses(twice=True),
    "grad of psum'ed loss, psum'ed again": _grad_of_psum_loss,
    "DS/DUS row accumulation": _dus_accumulation,
    "DS/DUS row accumulation, psum twice": lambda: _dus_accumulation(twice=True),
    "psum of mesh-invariant values (check_vma)": _invariant_losses,
    "grad accumulation (check_vma)": _vma_grad_accumulation,
    "scan over layers, backward (check_vma)": _scan_over_layers,
    "fori_loop grad accumulation": _fori_grad_accumulation,
    "2-D mesh, psum over dp": _mesh_2d_accumulation,
    "pmean losses": _pmean_losses,
    "nested loops (epochs x microbatches)": _nested_loops,
    "bf16 gradients, f32 accumulator": _bf16_gradients,
    "gradients and losses": _gradients_and_losses,
    "pytree gradients": _pytree_gradients,
    "optimizer loop (SGD in scan)": _optimizer_loop,
    "fori_loop losses.at[i].set": _fori_losses_at_set,
    "jit data-parallel grad accumulation (GSPMD)": _jit_data_parallel,
    "corpus: shmap_psum_in_scan": _corpus("shmap_psum_in_scan"),
    "corpus: shmap_grad_accumulation": _corpus("shmap_grad_accumulation"),
    "demo transformer step": demo_program,
}


def loop_program(name: str) -> tuple[Callable, tuple]:
    """(jitted function, example args) of one LOOP_PROGRAMS entry."""
    return LOOP_PROGRAMS[name]()
