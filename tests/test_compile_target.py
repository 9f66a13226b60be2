"""runtime.compile(module, target="h100"): XLA's GPU compiler, deviceless, through the shared tool's venv."""

from __future__ import annotations

import importlib

import pytest
from hlopt.runtime.execution import executable
from hlopt.runtime.xla_gpu_path import xla_gpu

from hlopt import hlo, runtime

TEXT = """HloModule add_tanh

ENTRY main {
  a = f32[256,256] parameter(0)
  b = f32[256,256] parameter(1)
  c = f32[256,256] add(a, b)
  d = f32[256,256] tanh(c)
  ROOT e = f32[256,256] multiply(d, a)
}
"""


def test_unknown_target_and_missing_compiler(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="unknown target"):
        runtime.compile(TEXT, target="tpu9")
    monkeypatch.setenv("HLOPT_XLA_GPU_PYTHON", str(tmp_path / "nope" / "python"))
    assert not xla_gpu.available()
    with pytest.raises(xla_gpu.GpuCompilerMissing, match=r"hlopt\[gpu-compile\]"):
        runtime.compile(TEXT, target="h100", deviceless=True)


@pytest.mark.xla_gpu
@pytest.mark.skipif(not xla_gpu.available(), reason=f"no XLA:GPU compiler ({xla_gpu.INSTALL_COMMAND})")
def test_compile_for_h100_deviceless():
    result = runtime.compile(hlo.parse(TEXT), target="h100", deviceless=True)
    assert result.fusion_count == 1  # add, tanh, multiply: one loop fusion
    assert result.optimized.instruction_count() >= 3
    assert result.report["ours"]["fusion_time_us"] > 0
    assert result.executable and "h100" in result.summary()


FUSED = """HloModule fused_add_tanh

fused_add_tanh_computation {
  p0 = f32[64,32]{0,1} parameter(0)
  p1 = f32[64,32]{0,1} parameter(1)
  c = f32[64,32]{0,1} add(p0, p1)
  d = f32[64,32]{0,1} tanh(c)
  ROOT e = f32[64,32]{0,1} multiply(d, p0)
}

ENTRY main {
  a = f32[64,32]{0,1} parameter(0)
  b = f32[64,32]{0,1} parameter(1)
  ROOT fusion = f32[64,32]{0,1} fusion(a, b), kind=kLoop, calls=fused_add_tanh_computation
}
"""


def test_fused_module_goes_to_xla_gpu_with_default_layouts_and_its_fusion_passes_off():
    module = hlo.parse(FUSED)
    inlined, nothing = xla_gpu.module_for_xla_gpu(module)
    assert nothing == "" and not any(i.opcode == "fusion" for i in inlined.instructions())
    prepared, disabled = xla_gpu.module_for_xla_gpu(module, keep_fusions=True)
    assert disabled == xla_gpu.KEEP_OUR_FUSIONS and "priority-fusion" in disabled
    assert all(str(i.shape).endswith("{1,0}") for i in prepared.instructions())
    assert "{0,1}" in module.to_text()  # the input is left as it was
    unfused = hlo.parse(TEXT)
    assert xla_gpu.module_for_xla_gpu(unfused) == (unfused, "")


def test_real_gpu_path_compiles_and_runs_keeping_fusions(monkeypatch):
    """The with-a-GPU branch of compile(target=...), pointed at XLA:CPU: it must prepare the module,
    pass the disabled passes, keep our fusion and compute what the unfused module computes."""
    monkeypatch.setattr(executable, "GPU_PLATFORM", "cpu")
    exe = runtime.compile(FUSED, target="h100", deviceless=False, keep_fusions=True)
    assert isinstance(exe, runtime.Executable) and exe.platform == "cpu"
    compiled = hlo.parse(exe.compiled_text())
    ours = [i for i in compiled.entry.instructions if i.opcode == "fusion" and 'op_name="fusion"' in i.to_text()]
    assert ours and {"add", "tanh", "multiply"} <= {i.opcode for i in ours[0].called_computations[0].instructions}
    inputs = runtime.random_inputs(hlo.parse(FUSED), seed=1)
    unfused = TEXT.replace("256,256", "64,32")
    assert runtime.compare(runtime.execute(unfused, inputs), exe.execute(inputs), 1e-6, 1e-6).ok


def test_real_gpu_path_without_a_gpu_says_so():
    if runtime.gpu_devices():
        pytest.skip("this machine has a GPU")
    with pytest.raises(runtime.XlaError, match="no gpu devices"):
        runtime.compile(TEXT, target="h100", deviceless=False)


def test_hook_on_a_gpu_backend_fuses_inside_xla_and_falls_back_when_the_stage_is_not_called():
    """The default GPU route with a stand-in backend that never calls XLA's post-scheduler stage: fusion is
    deferred to step 3, XLA is asked to compile with its generic fusion off and, for the guard, with its own
    fusion (beside it); the stage not having been called, XLA's own compile is returned (and a warning)."""
    import jax
    import jax.numpy as jnp
    from jax._src import compiler

    hook_module = importlib.import_module("hlopt.runtime.jax_integration.hook")

    class Device:
        device_kind = "NVIDIA H100 80GB HBM3"

    class RecordingGpuBackend:
        platform = "cuda"

        def __init__(self):
            self.disabled = []

        def devices(self):
            return [Device()]

        def compile_and_load(self, module, executable_devices, compile_options):
            passes = compile_options.executable_build_options.debug_options.xla_disable_hlo_passes
            self.disabled.append(passes)
            if passes:
                self.module = module
            return f"compiled with {passes or 'XLA defaults'}"

    lowered = jax.jit(lambda a, b: jnp.tanh(a + b) * a).lower(jnp.ones((64, 32)), jnp.ones((64, 32)))
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    backend = RecordingGpuBackend()
    with runtime.hook("simplify,priority-fusion") as h, pytest.warns(hook_module.HookWarning, match="own fusion"):
        assert hook_module._patched_backend_compile_and_load(backend, lowered.compiler_ir(), None, options,  # noqa: SLF001 (deliberately pokes internals)
                                                             []) == "compiled with XLA defaults"
    record = h.records[-1]
    assert "priority-fusion" not in [p.name for p in record.passes] and record.after_xla_pipeline
    assert sorted(backend.disabled) == ["", "priority-fusion,multi_output_fusion,latency-hiding-scheduler"]
    assert ("did not call its post-scheduler transformation stage" in record.gpu_fell_back
            or "transformation stages are unavailable" in record.gpu_fell_back), record.gpu_fell_back
    assert b"fusion" not in backend.module


def test_hook_on_a_gpu_backend_inline_route_inlines_fusions():
    import jax
    import jax.numpy as jnp
    from jax._src import compiler

    hook_module = importlib.import_module("hlopt.runtime.jax_integration.hook")

    class RecordingGpuBackend:
        platform = "cuda"

        def compile_and_load(self, module, executable_devices, compile_options):
            self.module = module
            return "compiled"

    lowered = jax.jit(lambda a, b: jnp.tanh(a + b) * a).lower(jnp.ones((64, 32)), jnp.ones((64, 32)))
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    backend = RecordingGpuBackend()
    with runtime.hook("priority-fusion", gpu_route="inline") as h:
        assert hook_module._patched_backend_compile_and_load(backend, lowered.compiler_ir(), None, options,  # noqa: SLF001 (deliberately pokes internals)
                                                             []) == "compiled"
    assert h.records[-1].passes[0].changed and h.records[-1].xla_disabled_passes == ""
    assert b"fusion" not in backend.module
    assert options.executable_build_options.debug_options.xla_disable_hlo_passes == ""


def test_hook_on_a_gpu_backend_can_keep_fusions_and_switch_xla_fusion_off():
    """The hook's GPU branch, with a stand-in backend that records what XLA:GPU would be given."""
    import jax
    import jax.numpy as jnp
    from jax._src import compiler

    hook_module = importlib.import_module("hlopt.runtime.jax_integration.hook")

    class RecordingGpuBackend:
        platform = "cuda"

        def compile_and_load(self, module, executable_devices, compile_options):
            self.module, self.options = module, compile_options
            raise RuntimeError("stand-in backend: nothing to run on")

    lowered = jax.jit(lambda a, b: jnp.tanh(a + b) * a).lower(jnp.ones((64, 32)), jnp.ones((64, 32)))
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    backend = RecordingGpuBackend()
    h = runtime.install(runtime.Hook("priority-fusion", gpu_keep_fusions=True))
    try:
        with pytest.raises(RuntimeError, match="stand-in"):
            hook_module._patched_backend_compile_and_load(backend, lowered.compiler_ir(), None, options, [])  # noqa: SLF001 (deliberately pokes internals)
    finally:
        runtime.uninstall(h)
    assert h.records[-1].xla_disabled_passes == xla_gpu.KEEP_OUR_FUSIONS
    disabled = options.executable_build_options.debug_options.xla_disable_hlo_passes.split(",")
    assert "priority-fusion" in disabled and "layout-assignment" in disabled
    assert b"mhlo.fusion" in backend.module or b"fusion" in backend.module


def test_a_gpu_host_runs_what_hlopts_xla_gpu_path_compiled(monkeypatch):
    """compile(target=...) with a GPU: hlopt's deviceless XLA:GPU path for the local GPU's model, its kept
    executable loaded on the local devices. XLA:CPU stands in for the GPU: the stand-in compile hands back a
    serialized XLA:CPU executable, which the route must load and run with the module's signature."""
    import jax
    from hlopt.runtime._xla import compile_text
    from hlopt.runtime.xla_gpu_path import reemit

    calls = []

    def stand_in(module, target, devices, after, xla_flags):
        calls.append((target, devices, after, xla_flags))
        serialized = jax.devices("cpu")[0].client.serialize_executable(compile_text(TEXT).executable)
        kept = type("Kept", (), {"executable": serialized})()
        return type("Result", (), {"kept_result": kept, "kept": "hlopt"})()

    monkeypatch.setattr(executable, "GPU_PLATFORM", "cpu")
    monkeypatch.setattr(xla_gpu, "local_target", lambda: "h200")
    monkeypatch.setattr(reemit, "compile_for_gpu", stand_in)
    exe = runtime.compile(TEXT, target="h100", deviceless=False, pipeline="priority-fusion", xla_flags="--xla_a=1")
    assert calls == [("h200", None, "priority-fusion", "--xla_a=1")]  # the local model, not the one named
    assert exe.platform == "cpu" and exe.reemit.kept == "hlopt"
    inputs = runtime.random_inputs(hlo.parse(TEXT), seed=2)
    assert runtime.compare(runtime.execute(TEXT, inputs), exe.execute(inputs), 1e-6, 1e-6).ok


def test_the_gpu_route_defaults_and_refusals(monkeypatch):
    sharded = TEXT.replace("a = f32[256,256] parameter(0)", "a = f32[256,256] parameter(0), sharding={devices=[2,1]<=[2]}")
    assert executable.default_gpu_route(hlo.parse(TEXT), None, keep_fusions=False) == "hlopt"
    assert executable.default_gpu_route(hlo.parse(TEXT), None, keep_fusions=True) == "inline"
    assert executable.default_gpu_route(hlo.parse(sharded), None, keep_fusions=False) == "inline"
    with pytest.raises(ValueError, match="gpu_route='fast'"):
        runtime.compile(TEXT, target="h100", deviceless=False, gpu_route="fast")
    monkeypatch.setattr(executable, "GPU_PLATFORM", "cpu")
    monkeypatch.setattr(xla_gpu, "local_target", lambda: None)
    with pytest.raises(ValueError, match="gpu_route='inline'"):
        runtime.compile(TEXT, target="h100", deviceless=False)
