"""runtime: every corpus module runs on XLA:CPU like jax on random inputs; execution modes; errors;
random inputs per dtype; comparison reports; capture, canonical text and cost analysis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hlopt.corpus.programs import PROGRAMS, Program, built, corpus_texts
from hlopt.runtime import _xla
from hlopt.runtime.execution.compare import compare
from hlopt.runtime.execution.inputs import random_inputs

from hlopt import hlo, runtime

# --------------------------------------------------------------------------- corpus on random inputs


def _entry_text(name: str) -> str:
    return next(e.text for e in corpus_texts() if e.id == name)


def _by_device(x: jax.Array) -> np.ndarray:
    """A jax array's per-device values, stacked in device order (runtime's per-device layout)."""
    shards = sorted(x.addressable_shards, key=lambda s: s.device.id)
    return np.stack([np.asarray(s.data) for s in shards])


def _jax_run(prog: Program, inputs: list[np.ndarray]) -> tuple[list[jax.Array], list[jax.Array]]:
    """(arguments as jax placed them, outputs) of the program's jitted function on these inputs."""
    fn, args = built(prog.name)
    treedef = jax.tree.structure(args)
    shardings = jax.tree.leaves(fn.lower(*args).compile().input_shardings[0])
    placed = [jax.device_put(x, s) for x, s in zip(inputs, shardings, strict=True)]
    outs = jax.tree.leaves(fn(*jax.tree.unflatten(treedef, placed)))
    return placed, outs


@pytest.mark.parametrize("optimized", [False, True], ids=["unoptimized", "optimized"])
@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_corpus_module_runs_like_jax(prog: Program, optimized: bool) -> None:
    if optimized and prog.reentry_refused:
        pytest.skip(prog.reentry_refused)
    unopt = hlo.parse(_entry_text(prog.name))
    inputs = random_inputs(unopt, seed=1)
    placed, want = _jax_run(prog, inputs)
    module = hlo.parse(_entry_text(prog.name + ".opt")) if optimized else unopt
    mode, _, _ = runtime.execution_mode(module)
    if mode == "per-device":  # XLA's partitioned module: one shard per device in, one per device out
        got = runtime.execute(module, [_by_device(x) for x in placed])
        expected = [_by_device(x) for x in want]
    else:
        got = runtime.execute(module, inputs)
        expected = [np.asarray(x) for x in want]
    assert mode == ("single" if prog.devices == 1 else "per-device" if optimized else "spmd")
    tol = 1e-4 if optimized else 1e-5
    result = compare(expected, got, rtol=tol, atol=tol)
    assert result.ok, f"{prog.name}{'.opt' if optimized else ''}:\n{result}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3])
@pytest.mark.parametrize("prog", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_corpus_unoptimized_more_seeds(prog: Program, seed: int) -> None:
    module = hlo.parse(_entry_text(prog.name))
    inputs = random_inputs(module, seed=seed)
    _, want = _jax_run(prog, inputs)
    result = compare([np.asarray(x) for x in want], runtime.execute(module, inputs))
    assert result.ok, str(result)


def test_corpus_is_broad() -> None:
    assert len(PROGRAMS) >= 22
    assert sum(p.devices == 8 for p in PROGRAMS) >= 5
    texts = "\n".join(e.text for e in corpus_texts())
    for op in ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all", "while",
               "conditional", "sort", "scatter", "gather", "fft", "custom-call", "opt-barrier", "convolution"):
        assert f" {op}(" in texts or f" {op}-start(" in texts, op


# --------------------------------------------------------------------------- execution modes

def _shmap_psum() -> tuple:
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
    f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i") * 2, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    return f, jnp.arange(64.0).reshape(8, 8) / 10


def _sharded_jit() -> tuple:
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8) / 10, NamedSharding(mesh, P("i")))
    return jax.jit(lambda a: jnp.sin(a) @ a.T + a.sum(0)), x


@pytest.fixture(params=[True, False], ids=["shardy", "gspmd"])
def partitioner(request: pytest.FixtureRequest):
    """Lower with Shardy (jax's default) or with GSPMD `sharding={...}` annotations."""
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", request.param)
    yield request.param
    jax.config.update("jax_use_shardy_partitioner", before)


@pytest.mark.parametrize("make", [_shmap_psum, _sharded_jit], ids=["shard_map", "sharded_jit"])
def test_spmd_modules_run_on_global_arrays(make, partitioner: bool) -> None:
    f, x = make()
    module = runtime.capture(f, x)
    assert ("xla.sdy" in module.to_text()) == partitioner
    assert runtime.execution_mode(module) == ("spmd", 1, 8)
    got = runtime.execute(module, [np.asarray(x)])
    assert got[0].shape == x.shape
    result = compare([np.asarray(f(x))], got)
    assert result.ok, str(result)


_COLLECTIVES = """HloModule collectives, {header}

add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}

ENTRY e {{
  p = f32[4] parameter(0)
  q = f32[] parameter(1)
  r = f32[4] all-reduce(p), {groups}, to_apply=add
  id = u32[] {id_op}()
  ROOT t = (f32[4], u32[], f32[]) tuple(r, id, q)
}}
"""


@pytest.mark.parametrize("kind", ["replicas", "partitions"])
def test_per_device_modules(kind: str) -> None:
    if kind == "replicas":
        text = _COLLECTIVES.format(header="replica_count=8", groups="replica_groups={}", id_op="replica-id")
    else:
        text = _COLLECTIVES.format(header="num_partitions=8", id_op="partition-id",
                                   groups="channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true")
    module = hlo.parse(text)
    assert runtime.execution_mode(module)[0] == "per-device"
    x = np.arange(32, dtype=np.float32).reshape(8, 4)  # one row per device
    summed, ids, q = runtime.execute(module, [x, np.float32(5)])  # q: the same on every device
    np.testing.assert_array_equal(summed, np.broadcast_to(x.sum(0), (8, 4)))
    np.testing.assert_array_equal(ids, np.arange(8, dtype=np.uint32))
    np.testing.assert_array_equal(q, np.full(8, 5, np.float32))


def test_single_device_module_on_eight_replicas() -> None:
    module = runtime.capture(lambda a, b: a * b + 1, jnp.ones(3), jnp.ones(3))
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    (out,) = runtime.execute(module, [x, np.float32(2) * np.ones(3, np.float32)], devices=8)
    np.testing.assert_array_equal(out, x * 2 + 1)


def test_executable_is_reusable() -> None:
    exe = runtime.compile(runtime.capture(lambda a: (a.sum(), a * 2), jnp.ones((2, 3))))
    assert exe.num_devices == 1 and exe.mode == "single"
    for seed in range(2):
        (x,) = random_inputs(runtime.capture(lambda a: a, jnp.ones((2, 3))), seed=seed)
        total, doubled = exe.execute([x])
        np.testing.assert_allclose(total, x.sum(), rtol=1e-6)
        np.testing.assert_array_equal(doubled, x * 2)
    assert "ENTRY" in exe.compiled_text()


def test_compile_accepts_text_and_module() -> None:
    text = runtime.capture_text(lambda a: a - 1, jnp.ones(4, jnp.int32))
    x = np.arange(4, dtype=np.int32)
    for m in (text, hlo.parse(text)):
        np.testing.assert_array_equal(runtime.execute(m, [x])[0], x - 1)


# --------------------------------------------------------------------------- capture, XLA's text, cost

def test_capture_keeps_pytrees_and_kwargs() -> None:
    def f(params: dict, x: jax.Array, scale: float = 1.0) -> dict:
        return {"y": (x @ params["w"] + params["b"]) * scale}

    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    module = runtime.capture(f, params, jnp.ones((4, 3)), scale=2.0)
    assert isinstance(module, hlo.ir.Module)
    assert len(module.entry.parameters) == 4
    inputs = random_inputs(module, seed=3)
    got = runtime.execute(module, inputs)
    b, w, x, scale = inputs  # jax flattens dicts by sorted key, kwargs last
    np.testing.assert_allclose(got[0], (x @ w + b) * scale, rtol=1e-5)


def test_capture_optimized_text_runs() -> None:
    def f(x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ x.T).sum(0)

    x = jnp.arange(12.0).reshape(3, 4) / 10
    text = runtime.capture_optimized_text(f, x)
    assert "fusion" in text
    got = runtime.execute(text, [np.asarray(x)])
    assert compare([np.asarray(jax.jit(f)(x))], got, rtol=1e-5).ok


def test_xla_canonical_text_and_fingerprint() -> None:
    text = runtime.capture_text(lambda a: a + 1, jnp.ones(2))
    canon = runtime.xla_canonical_text(text)
    assert canon.startswith("HloModule") and runtime.xla_canonical_text(canon) == canon
    renamed = text.replace("add.", "renamed_add.")
    assert renamed != text and _xla.xla_fingerprint_text(renamed) == _xla.xla_fingerprint_text(text)


def test_cost_analysis_counts_dot_flops() -> None:
    text = runtime.capture_text(lambda a, b: a @ b, jnp.ones((4, 8)), jnp.ones((8, 16)))
    cost = _xla.cost_analysis(text)
    assert cost["flops"] == 2 * 4 * 8 * 16
    assert cost["bytes accessed"] > 0


# --------------------------------------------------------------------------- errors

_BAD_SHAPES = """HloModule bad
ENTRY e {
  p = f32[2] parameter(0)
  ROOT a = f32[3] add(p, p)
}
"""


def test_xla_rejection_is_a_clear_xla_error() -> None:
    with pytest.raises(runtime.XlaError) as info:
        runtime.compile(_BAD_SHAPES)
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert message.startswith("XLA could not compile the module:")
    assert "same shape" in message
    assert len(message.splitlines()) <= 10


def test_xla_parser_errors_are_xla_errors() -> None:
    with pytest.raises(runtime.XlaError, match=r"(?s)parser rejected.*Unknown opcode: bogus"):
        _xla.xla_parse(_BAD_SHAPES.replace("add(p, p)", "bogus(p, p)"))
    with pytest.raises(runtime.XlaError):
        _xla.compile_text("HloModule x\nENTRY e {\n ROOT c = f32[] constant(\n}\n")


def test_malformed_text_is_a_located_parse_error() -> None:
    with pytest.raises(hlo.HloParseError) as info:
        runtime.compile(_BAD_SHAPES.replace("add(p, p)", "add(p, q)"))
    assert info.value.line == 4 and "q" in str(info.value)


def test_wrong_arguments_are_value_errors() -> None:
    exe = runtime.compile(runtime.capture(lambda a: a * 2, jnp.ones(3)))
    with pytest.raises(ValueError, match="takes 1 argument"):
        exe.execute([])
    with pytest.raises(ValueError, match=r"does not fit parameter f32\[3\]"):
        exe.execute([np.ones(4, np.float32)])


def test_too_many_devices_is_an_xla_error() -> None:
    with pytest.raises(runtime.XlaError, match="xla_force_host_platform_device_count"):
        _xla.cpu_devices(len(jax.devices("cpu")) + 1)


# --------------------------------------------------------------------------- random inputs

_ALL_TYPES = ["pred", "s2", "s4", "s8", "s16", "s32", "s64", "u2", "u4", "u8", "u16", "u32", "u64", "f16", "bf16",
              "f32", "f64", "c64", "c128", "f8e4m3fn", "f8e5m2", "f8e4m3", "f8e3m4", "f8e4m3fnuz", "f8e5m2fnuz",
              "f8e4m3b11fnuz", "f8e8m0fnu", "f4e2m1fn"]


def _identity_module(types: list[str], dims: str = "3,5") -> str:
    params = "\n".join(f"  p{i} = {t}[{dims}] parameter({i})" for i, t in enumerate(types))
    leaves = ", ".join(f"p{i}" for i in range(len(types)))
    shape = ", ".join(f"{t}[{dims}]" for t in types)
    return f"HloModule identity\n\nENTRY e {{\n{params}\n  ROOT t = ({shape}) tuple({leaves})\n}}\n"


def test_random_inputs_cover_every_type() -> None:
    module = hlo.parse(_identity_module(_ALL_TYPES))
    inputs = random_inputs(module, seed=0)
    for t, x in zip(_ALL_TYPES, inputs, strict=True):
        assert x.dtype == hlo.shape.DTYPES[t].numpy, t
        assert x.shape == (3, 5), t
        if hlo.shape.DTYPES[t].kind in ("float", "complex"):
            assert np.isfinite(x.astype(np.complex128)).all(), t
    values = dict(zip(_ALL_TYPES, inputs, strict=True))
    assert set(np.unique(values["pred"])) == {False, True}
    assert values["s32"].min() >= -8 and values["s32"].max() < 8
    assert values["u4"].astype(np.int64).max() < 16 and values["s2"].astype(np.int64).min() >= -2
    e8m0 = values["f8e8m0fnu"].astype(np.float32)
    assert np.all(np.log2(e8m0) == np.round(np.log2(e8m0)))
    assert np.abs(values["f32"]).max() < 10 and values["f32"].std() > 0.3
    assert np.abs(values["c64"].imag).max() > 0


def test_random_inputs_round_trip_through_xla() -> None:
    module = hlo.parse(_identity_module(_ALL_TYPES, "2,3"))
    inputs = random_inputs(module, seed=4)
    result = compare(inputs, runtime.execute(module, inputs), rtol=0, atol=0)
    assert result.ok, str(result)


def test_random_inputs_are_seeded_and_per_device() -> None:
    text = _identity_module(["f32", "s8"])
    a, b, c = random_inputs(text, seed=7), random_inputs(text, seed=7), random_inputs(text, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    stacked = random_inputs(text, seed=7, per_device=8)
    assert [x.shape for x in stacked] == [(8, 3, 5), (8, 3, 5)]
    assert not np.array_equal(stacked[0][0], stacked[0][1])


def test_random_inputs_refuse_tokens() -> None:
    module = hlo.parse("HloModule t\nENTRY e {\n  p = token[] parameter(0)\n  ROOT a = token[] after-all(p)\n}\n")
    with pytest.raises(ValueError, match="token"):
        random_inputs(module)


# --------------------------------------------------------------------------- comparison reports

def test_compare_equal_report() -> None:
    x = np.linspace(0, 1, 5, dtype=np.float32)
    result = compare([x, np.arange(3)], [x + 1e-7, np.arange(3)])
    assert result.ok and bool(result)
    assert str(result).startswith("all 2 output(s) match")


def test_compare_reports_worst_element() -> None:
    e = np.zeros((3, 4), np.float32)
    a = e.copy()
    a[1, 2], a[2, 3] = 0.5, 1e-3
    result = compare([e], [a])
    assert not result.ok
    text = str(result)
    assert "output 0 (float32[3, 4]): values differ" in text
    assert "2 of 12 element(s) differ, worst at [1, 2]: expected 0.0, got 0.5" in text
    assert result.outputs[0].max_abs == pytest.approx(0.5)


def test_compare_structure_mismatches() -> None:
    assert "output count differs: expected 2, got 1" in str(compare([np.ones(1), np.ones(1)], [np.ones(1)]))
    assert "shape differs: expected (2,), got (3,)" in str(compare([np.ones(2)], [np.ones(3)]))
    assert "dtype differs: expected float32, got float64" in str(compare([np.ones(2, np.float32)], [np.ones(2)]))


def test_compare_integers_exactly() -> None:
    result = compare([np.array([5, 6], np.int32)], [np.array([5, 7], np.int32)], rtol=1.0, atol=10.0)
    assert not result.ok and "expected 6, got 7" in str(result)
    i4 = np.array([1, -2], ml_dtypes.int4)
    assert compare([i4], [i4]).ok
    assert not compare([i4], [np.array([1, -1], ml_dtypes.int4)], atol=5).ok
    assert not compare([np.array([True])], [np.array([False])]).ok


def test_compare_nan_and_inf() -> None:
    nan_report = str(compare([np.array([1.0, np.nan])], [np.array([np.nan, np.nan])]))
    assert "NaN pattern differs; 1 of 2 element(s) differ, first at [0]: expected 1.0, got nan" in nan_report
    assert compare([np.array([np.nan, np.inf, -np.inf])], [np.array([np.nan, np.inf, -np.inf])]).ok
    assert not compare([np.array([np.inf])], [np.array([-np.inf])]).ok
    assert not compare([np.array([np.inf])], [np.array([1e30])]).ok


def test_compare_low_precision_and_complex() -> None:
    bf = np.array([1.0, 2.0], ml_dtypes.bfloat16)
    assert compare([bf], [bf]).ok
    off = np.array([1.0, 2.015625], ml_dtypes.bfloat16)
    assert not compare([bf], [off]).ok and compare([bf], [off], rtol=1e-2).ok
    f8 = np.array([0.5, -1.5], ml_dtypes.float8_e4m3fn)
    assert "expected -1.5, got 1.5" in str(compare([f8], [np.abs(f8)]))
    c = np.array([1 + 1j, 2 - 1j], np.complex64)
    assert compare([c], [c]).ok and not compare([c], [c.conj()]).ok
