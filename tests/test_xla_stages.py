"""hlopt inside XLA's own compile (`runtime.jax_integration.xla_stages`) and the hook's GPU route "xla-stages", exercised on XLA:CPU
(`Hook(gpu_route_on_cpu=True)`): the mechanism is the same one XLA:GPU uses through the PJRT C API."""

from __future__ import annotations

import importlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlopt.runtime.jax_integration import xla_stages

hook_module = importlib.import_module("hlopt.runtime.jax_integration.hook")


def _program(x, w):
    h = jnp.tanh(x @ w)
    return jnp.sum(h * h, axis=1) + jnp.max(h, axis=0).sum()


_ARGS = (jnp.linspace(-1, 1, 16 * 32).reshape(16, 32), jnp.linspace(0.5, -0.5, 32 * 32).reshape(32, 32))


def _mark_root(module):
    for comp in module.computations:
        if comp is module.entry:
            comp.root.name = "hlopt_marked_" + comp.root.name
    return module


def test_what_the_post_scheduler_stage_returns_is_what_the_executable_runs():
    jax.clear_caches()
    with xla_stages.transforming(_mark_root, stage="post-scheduler", platform="cpu") as run:
        compiled = jax.jit(_program).lower(*_ARGS).compile()
    assert run.calls >= 1 and run.changed >= 1 and not run.errors
    assert "hlopt_marked_" in compiled.as_text()
    np.testing.assert_allclose(np.asarray(compiled(*_ARGS)), np.asarray(_program(*_ARGS)), rtol=1e-5)


def test_compiles_outside_the_block_are_untouched():
    with xla_stages.transforming(_mark_root, stage="post-scheduler", platform="cpu"):
        pass
    compiled = jax.jit(lambda x: jnp.cos(x) + 1).lower(jnp.ones(8)).compile()
    assert "hlopt_marked_" not in compiled.as_text()


def test_a_failing_transformation_leaves_xla_module_and_is_recorded():
    def broken(module):
        raise RuntimeError("boom")

    jax.clear_caches()
    with xla_stages.transforming(broken, stage="pre-scheduler", platform="cpu") as run:
        compiled = jax.jit(_program).lower(*_ARGS).compile()
    assert run.calls >= 1 and run.changed == 0 and run.errors == ["RuntimeError: boom"]
    np.testing.assert_allclose(np.asarray(compiled(*_ARGS)), np.asarray(_program(*_ARGS)), rtol=1e-5)


def test_unknown_stage_is_refused():
    with pytest.raises(ValueError, match="unknown stage"), xla_stages.transforming(_mark_root, stage="late"):
        pass


def _run_under(h):
    hook_module.install(h)
    try:
        jax.clear_caches()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = jax.jit(_program)(*_ARGS)
    finally:
        hook_module.uninstall(h)
        jax.clear_caches()
    return np.asarray(got), [str(w.message) for w in caught if issubclass(w.category, hook_module.HookWarning)]


def test_gpu_route_runs_step_three_inside_xla_compile():
    h = hook_module.Hook("default", gpu_route_on_cpu=True)
    got, warned = _run_under(h)
    np.testing.assert_allclose(got, np.asarray(_program(*_ARGS)), rtol=1e-5)
    record = h.records[-1]
    assert not warned and record.gpu_fell_back is None
    assert "latency-hiding-scheduler" in record.after_xla_pipeline
    assert record.after_xla["passes"] == record.after_xla_pipeline  # step 3 ran on XLA's module
    assert "priority-fusion" in record.xla_disabled_passes
    assert not any(p.name in hook_module.AFTER_XLA_PASSES for p in record.passes)  # not run before XLA


def test_gpu_route_falls_back_when_xla_never_calls_the_stage(monkeypatch):
    monkeypatch.setattr(xla_stages.StageRun, "apply", lambda self, proto: None)  # as XLA:GPU before #43630
    h = hook_module.Hook("default", gpu_route_on_cpu=True)
    got, warned = _run_under(h)
    np.testing.assert_allclose(got, np.asarray(_program(*_ARGS)), rtol=1e-5)
    assert "did not call its pre-scheduler transformation stage" in h.records[-1].gpu_fell_back
    assert warned and "compiled with XLA's own fusion and scheduler" in warned[0]


def test_gpu_route_falls_back_when_step_three_fails(monkeypatch):
    reemit = importlib.import_module("hlopt.runtime.xla_gpu_path.reemit")

    def failing(module, pipeline):
        raise ValueError("step 3 broke")

    monkeypatch.setattr(reemit, "prepare_after_xla", failing)
    h = hook_module.Hook("default", gpu_route_on_cpu=True)
    got, warned = _run_under(h)
    np.testing.assert_allclose(got, np.asarray(_program(*_ARGS)), rtol=1e-5)
    assert h.records[-1].gpu_fell_back == "ValueError: step 3 broke" and warned


def test_unknown_gpu_route_is_refused():
    with pytest.raises(ValueError, match="unknown gpu_route"):
        hook_module.Hook("default", gpu_route="fastest")


def test_gpu_route_falls_back_when_xla_rejects_step_three(monkeypatch):
    reemit = importlib.import_module("hlopt.runtime.xla_gpu_path.reemit")
    real = reemit.prepare_after_xla

    def breaking(module, pipeline):  # a module XLA's backend cannot compile: a parameter of the wrong shape
        out, info = real(module, pipeline)
        from hlopt.hlo.shape import parse_shape

        out.entry.parameters[0].shape = parse_shape("f32[3]")
        return out, info

    monkeypatch.setattr(reemit, "prepare_after_xla", breaking)
    h = hook_module.Hook("default", gpu_route_on_cpu=True)
    got, warned = _run_under(h)
    np.testing.assert_allclose(got, np.asarray(_program(*_ARGS)), rtol=1e-5)
    assert h.records[-1].gpu_fell_back.startswith(("XLA rejected the module of step 3", "HloVerifyError",
                                                   "XlaError")), h.records[-1].gpu_fell_back
    assert warned


# ----------------------------------------------------------------------------- StageGate (the guard's pause)


def _meet_in_thread(gate):
    """gate.meet(b"module") on another thread: (thread, outcome list: "went on" or "stopped")."""
    import threading

    outcome = []

    def compile_side():
        try:
            gate.meet(b"module")
            outcome.append("went on")
        except xla_stages.StageStop:
            outcome.append("stopped")

    thread = threading.Thread(target=compile_side)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("verdict", ["resume", "stop"])
def test_a_paused_gate_waits_for_the_verdict(verdict):
    gate = xla_stages.StageGate("post-scheduler", pause=True)
    thread, outcome = _meet_in_thread(gate)
    assert gate.wait(timeout=10) and gate.proto == b"module"
    thread.join(timeout=0.2)
    assert thread.is_alive() and not outcome  # paused at the stage until the verdict
    getattr(gate, verdict)()
    thread.join(timeout=10)
    assert outcome == ["went on" if verdict == "resume" else "stopped"]
    gate.resume()  # a later verdict changes nothing
    assert outcome == ["went on" if verdict == "resume" else "stopped"]


def test_an_unpaused_gate_ends_the_compile_at_once_and_keeps_the_first_module():
    gate = xla_stages.StageGate("post-scheduler")
    with pytest.raises(xla_stages.StageStop):
        gate.meet(b"first")
    assert gate.proto == b"first"


def test_a_gate_not_met_is_given_up_when_its_block_ends():
    with xla_stages.stopping_at("post-scheduler") as gate:
        assert not gate.wait(timeout=0)
    assert gate.wait(timeout=0) and gate.proto is None  # whoever waits for it learns the compile ended
    with pytest.raises(ValueError, match="unknown stage"), xla_stages.stopping_at("late"):
        pass


def test_a_gate_prepares_the_module_on_the_compiling_thread_before_it_pauses():
    import threading

    on = []

    def prepare(proto):
        on.append(threading.get_ident())
        if proto == b"bad":
            raise ValueError("unreadable")
        return len(proto)

    gate = xla_stages.StageGate("post-scheduler", pause=True, prepare=prepare)
    thread, outcome = _meet_in_thread(gate)
    assert gate.wait(timeout=10) and gate.prepared == len(b"module") and on == [thread.ident]
    gate.stop()
    thread.join(timeout=10)
    assert outcome == ["stopped"]
    failing = xla_stages.StageGate("post-scheduler", prepare=prepare)
    with pytest.raises(xla_stages.StageStop):
        failing.meet(b"bad")
    assert isinstance(failing.prepared, ValueError)  # handed to the waiting thread, not raised into XLA
