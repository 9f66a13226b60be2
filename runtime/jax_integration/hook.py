"""A pre-compile hook for JAX: every `jax.jit` compile goes through an hlopt pipeline first.

    with runtime.hook("call-inliner,simplify"):
        train_step(params, batch)          # compiled from the optimized HLO

The one JAX internal patched is `jax._src.compiler.backend_compile_and_load` (jax 0.10.2): the hook
converts the StableHLO module jax hands to XLA into HLO, runs the pipeline, and gives XLA the result. A
pass that fails is reported as a warning and the unmodified module is compiled, unless `strict=True`.

On XLA:CPU the passes whose output XLA:CPU throws away (`CPU_DISCARDED_PASSES`: our fusions are inlined
and XLA:CPU fuses again itself, and XLA:GPU's pre-fusion rewrites that exist for our fusion go with them; our
schedule is dropped) are skipped, and the record says so
(`CompileRecord.skipped`, `summary()`); `Hook(skip_discarded_on_cpu=False)` runs them anyway. Fusions
XLA:CPU cannot take are inlined.

On a GPU backend (`Hook(gpu_route=...)`):
- `"xla-stages"` (the default): the re-emission path of `runtime.xla_gpu_path.reemit` inside jax's own compile. The hook runs
  the pipeline's passes before fusion (step 1), XLA:GPU compiles with its generic fusion and scheduler off
  (`reemit.XLA_STAGE_DISABLED`, step 2), and at XLA:GPU's post-scheduler stage (`runtime.jax_integration.xla_stages`, registered
  through the CUDA plugin's xla_transform extension) hlopt's fusion and scheduler run on XLA's laid-out module
  (`reemit.prepare_after_xla`, step 3) and XLA:GPU's backend-only compile takes that module (copy insertion, as
  `hlopt compile` step 4) inside the stage, up to its own post-scheduler stage, where it ends (no codegen); XLA's
  compile goes on with the module there (step 4: XLA's post-scheduling passes and codegen, once) and jax gets
  the executable: loaded on a GPU, unloaded for jax's compile-only (topology) client, the deviceless test bed.
  The guard (`Hook(guard=True)`) runs XLA's default compile beside ours up to its post-scheduler stage, keeps the
  one XLA's own estimates rate faster there, and only that compile goes on to codegen (`CompileRecord.guard`).
  If XLA does not call the stage or step 3 fails, the module is compiled with XLA's own fusion and scheduler,
  and a HookWarning says why (`CompileRecord.gpu_fell_back`).
- `"inline"`: our fusions are inlined and XLA:GPU fuses by itself.
- `"keep-fusions"` (`gpu_keep_fusions=True`): XLA:GPU compiles ours with its fusion passes and layout
  assignment off (experimental, see `runtime.xla_gpu_path.xla_gpu.module_for_xla_gpu`).
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hlopt.passes.framework.pipeline import expanded_pipeline

__all__ = ["Hook", "hook", "install", "uninstall", "CompileRecord", "HookWarning", "PatchLease",
           "swap_thread_hook"]


class HookWarning(UserWarning):
    """A pipeline failed inside the hook; the unmodified module was compiled instead."""


@dataclass
class CompileRecord:
    """What the hook did to one compiled module."""

    module: str
    pipeline: str
    instructions_before: int
    instructions_after: int
    passes: list[Any] = field(default_factory=list)  # PassRecord
    seconds: float = 0.0
    fell_back: str | None = None
    modeled_us_before: float | None = None
    modeled_us_after: float | None = None
    xla_disabled_passes: str = ""  # XLA:GPU passes switched off so that it keeps our fusions
    skipped: list[str] = field(default_factory=list)  # passes not run: the target compiler discards their output
    after_xla_pipeline: str = ""  # GPU route "xla-stages": hlopt's step 3, run at XLA's pre-scheduler stage
    after_xla: dict[str, Any] = field(default_factory=dict)  # what step 3 did (`reemit.prepare_after_xla`)
    gpu_fell_back: str | None = None  # why the "xla-stages" route compiled with XLA's own fusion instead
    #: the GPU route's guard: {"enabled", "kept": "hlopt"|"xla_default", "hlopt_us", "xla_default_us", "seconds",
    #: "waited_seconds"} (XLA's estimates of our module and of XLA's default compile's, both at XLA's post-scheduler
    #: stage; "xla_default_failed" instead of the estimates when XLA's default could not be compiled or rated)
    guard: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        """One line."""
        status = f"fell back ({self.fell_back})" if self.fell_back else "optimized"
        modeled = ""
        if self.modeled_us_before is not None and self.modeled_us_after is not None:
            modeled = f", modeled {self.modeled_us_before:.1f} -> {self.modeled_us_after:.1f} us"
        skipped = f"; skipped on XLA:CPU (output discarded): {', '.join(self.skipped)}" if self.skipped else ""
        return (f"{self.module}: {status} by {self.pipeline!r}: {self.instructions_before} -> "
                f"{self.instructions_after} instructions in {self.seconds * 1e3:.1f} ms{modeled}{skipped}"
                f"{self.guard_summary()}")

    def guard_summary(self) -> str:
        """The guard's decision, '' when it did not run."""
        g = self.guard
        if not g:
            return ""
        if not g.get("enabled"):
            return "; guard off: kept hlopt's"
        return (f"; kept {'hlopt' if g['kept'] == 'hlopt' else 'XLA default'}'s (XLA's estimates: hlopt "
                f"{g['hlopt_us']:.1f} us, XLA default {g['xla_default_us']:.1f} us)")


#: Passes whose output XLA:CPU throws away: it inlines our fusions and fuses again, and drops our schedule.
#: XLA:GPU's pre-fusion rewrites (the `fusion` pipeline's first three passes) go with the fusion they prepare:
#: XLA:CPU makes its own decisions on dots, select-and-scatter and scatters.
CPU_DISCARDED_PASSES = frozenset({"dot-strength-reduction", "select-and-scatter-expander", "scatter-simplifier",
                                  "priority-fusion", "multi-output-fusion", "latency-hiding-scheduler"})
#: Passes that the GPU route "xla-stages" runs after XLA's passes, on its module (step 3), not before XLA.
AFTER_XLA_PASSES = frozenset({part.split("{")[0] for part in expanded_pipeline("xla-gpu-after").split(",")}
                             | {"triton-softmax-priority-fusion"})
#: `Hook(gpu_route=...)` values.
GPU_ROUTES = ("xla-stages", "inline", "keep-fusions")


def _without(elements: list, names: frozenset, skipped: list[str]) -> list:
    """The pipeline elements minus the passes named in `names` (inside fixed-point groups too); the
    removed ones are appended to `skipped`."""
    from hlopt.passes.framework.pipeline import Fix

    kept = []
    for element in elements:
        if isinstance(element, Fix):
            inner = _without(element.passes, names, skipped)
            if inner:
                kept.append(Fix(inner, element.max_iterations))
        elif element.name in names:
            skipped.append(element.name)
        else:
            kept.append(element)
    return kept


class Hook:
    """A pipeline applied to every module jax compiles while installed."""

    def __init__(self, pipeline: str = "default", strict: bool = False, verify_each: bool = False,
                 device: str | None = "h100", gpu_keep_fusions: bool = False, skip_discarded_on_cpu: bool = True,
                 gpu_route: str | None = None, gpu_route_on_cpu: bool = False, guard: bool = True):
        self.pipeline = pipeline
        self.skip_discarded_on_cpu = skip_discarded_on_cpu
        self.gpu_route = gpu_route or ("keep-fusions" if gpu_keep_fusions else "xla-stages")
        if self.gpu_route not in GPU_ROUTES:
            raise ValueError(f"unknown gpu_route {gpu_route!r}; expected one of {', '.join(GPU_ROUTES)}")
        self.gpu_keep_fusions = self.gpu_route == "keep-fusions"  # see runtime.xla_gpu_path.xla_gpu.module_for_xla_gpu
        #: take XLA:CPU's compiles through the GPU route (tests the route on machines without a GPU)
        self.gpu_route_on_cpu = gpu_route_on_cpu
        #: GPU route: keep XLA's default compile where XLA's own estimates rate it faster than ours
        self.guard = guard
        self.strict = strict
        self.verify_each = verify_each
        self.device = device
        self.records: list[CompileRecord] = []

    def transform(self, hlo_text: str, name: str, for_cpu: bool = False, for_gpu: bool = False) -> str:
        """The pipeline applied to one module's HLO text (the input text back on a lenient failure);
        `for_cpu` also inlines the fusions XLA:CPU cannot take (saving a parse/print of the result);
        `for_gpu` prepares it for XLA:GPU (`module_for_xla_gpu`: fusions inlined, or kept with
        `gpu_keep_fusions`; the XLA passes to switch off go to `xla_disabled_passes`)."""
        from hlopt.passes.framework.pipeline import Pipeline, unfused_instruction_count

        from hlopt import hlo

        start = time.perf_counter()
        module = hlo.parse(hlo_text, filename=f"<jax module {name}>")
        count = unfused_instruction_count(module)
        record = CompileRecord(name, self.pipeline, count, count)
        record.modeled_us_before = _modeled(module, self.device)
        try:
            pipeline = Pipeline.parse(self.pipeline, verify_each=self.verify_each, check_changed=False)
            if for_cpu and self.skip_discarded_on_cpu:
                pipeline.passes = _without(pipeline.passes, CPU_DISCARDED_PASSES, record.skipped)
            elif for_gpu and self.gpu_route == "xla-stages":
                deferred: list[str] = []
                pipeline.passes = _without(pipeline.passes, AFTER_XLA_PASSES, deferred)
                if deferred:
                    from hlopt.runtime.xla_gpu_path.reemit import AFTER_XLA

                    record.after_xla_pipeline = AFTER_XLA
            result = pipeline.run(module)
            record.passes = result.records
            record.instructions_after = unfused_instruction_count(module)
            record.modeled_us_after = _modeled(module, self.device)
            if for_cpu:
                from hlopt.runtime.execution.reentry import cpu_fusion_kinds_only

                module = cpu_fusion_kinds_only(module)
            elif for_gpu:
                from hlopt.runtime.xla_gpu_path.xla_gpu import module_for_xla_gpu

                module, record.xla_disabled_passes = module_for_xla_gpu(module, self.gpu_keep_fusions)
            out = module.to_text()
        except Exception as e:  # noqa: BLE001 - a training run must not die because an optimization failed
            if self.strict:
                raise
            record.fell_back = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            warnings.warn(f"hlopt: pipeline failed on {name}; compiling the unmodified module: {e}", HookWarning,
                          stacklevel=3)
            out = hlo_text
        record.seconds = time.perf_counter() - start
        self.records.append(record)
        return out


def _modeled(module, device: str | None) -> float | None:
    if device is None:
        return None
    try:
        from hlopt.cost_model import module_time_us

        return module_time_us(module, device)
    except Exception:  # noqa: BLE001 - the estimate is informational only
        return None


_lock = threading.Lock()
_active: list[Hook] = []
_original = None
_patch_users = 0  # installed hooks + live `runtime.jit` functions; jax is patched while > 0
_per_thread = threading.local()  # `.hook`: the Hook of the `runtime.jit` call running in this thread


def _hooks_now() -> list[Hook]:
    """The hooks that apply to a compile starting now in this thread (global ones, then the jit's own)."""
    own = getattr(_per_thread, "hook", None)
    return [*_active, own] if own is not None else list(_active)


def _patched_backend_compile_and_load(backend, module, executable_devices, options, host_callbacks):
    hooks = _hooks_now()
    if not hooks or host_callbacks:
        return _original(backend, module, executable_devices, options, host_callbacks)
    from hlopt.runtime._xla import add_disabled_passes, computation_full_text, xla_parse
    from jax._src.lib import _jax
    from jax._src.lib.mlir import ir

    name = ir.StringAttr(module.operation.attributes["sym_name"]).value
    bytecode = _module_bytecode(module)
    computation = _jax.mlir.mlir_module_to_xla_computation(bytecode, use_tuple_args=False, return_tuple=False)
    text = computation_full_text(computation)  # every literal in full: never `constant({...})`
    on_cpu = getattr(backend, "platform", "cpu") == "cpu" and not hooks[-1].gpu_route_on_cpu
    last = len(hooks) - 1
    for i, h in enumerate(hooks):
        text = h.transform(text, name, for_cpu=on_cpu and i == last, for_gpu=not on_cpu and i == last)
    if on_cpu and len(hooks) > 1 and hooks[-1].records[-1].fell_back:  # an earlier hook's fusions remain
        text = _for_cpu(text)
    new_module = _jax.mlir.hlo_to_stablehlo(xla_parse(text).as_serialized_hlo_module_proto())
    if not on_cpu and hooks[-1].records[-1].after_xla_pipeline:
        return compile_through_stages(backend, new_module, executable_devices, options, hooks[-1].records[-1],
                                      original=module, guard=hooks[-1].guard)
    if not on_cpu:  # XLA:GPU compiles our fusions as they are (see runtime.xla_gpu_path.xla_gpu.module_for_xla_gpu)
        add_disabled_passes(options, hooks[-1].records[-1].xla_disabled_passes)
    return _compile(backend, new_module, executable_devices, options)


#: The stage of XLA:GPU's compile where step 3 runs: XLA:GPU 0.10.2 calls its pre-scheduler stage before fusion
#: (runtime.jax_integration.xla_stages), its post-scheduler stage on the fused, laid-out module. XLA:CPU (`gpu_route_on_cpu`,
#: the route's tests) calls the pre-scheduler one on its optimized module.
GPU_STAGE = "post-scheduler"
CPU_STAGE = "pre-scheduler"


def compile_through_stages(backend, module, executable_devices, options, record: CompileRecord,
                           original=None, guard: bool = True):
    """Steps 2-4 of the GPU route "xla-stages" (module docstring) for a module jax would compile: XLA's passes
    with its generic fusion and scheduler off, `record.after_xla_pipeline` at XLA's stage, XLA's backend. On
    XLA:GPU, step 3's module goes through XLA:GPU's backend-only compile inside the stage up to that compile's
    own post-scheduler stage (copy insertion and the backend's passes before it, as `hlopt compile` step 4),
    and what comes back is what XLA's compile goes on with (`_backend_only`). Falls back to XLA's own fusion
    and scheduler (a HookWarning, `record.gpu_fell_back`) when the stage was not called or step 3 failed.

    With `guard`, XLA's default compile of `original` (the module jax handed over) runs beside ours
    (`_DefaultCompile`) and pauses at its own post-scheduler stage; at ours, the guard compares XLA's estimates
    of both modules there (fused, scheduled, copies inserted: what each backend would emit) and only the
    compile kept goes on to XLA's codegen, the other ends at its stage (`record.guard`). No compile runs twice."""
    on_gpu = getattr(backend, "platform", "cpu") != "cpu"
    guarded = on_gpu and original is not None and guard
    started = time.perf_counter()
    target = _target_of(backend) if guarded else None
    default = _DefaultCompile(backend, original, executable_devices, options, target) if target else None
    try:
        ours = _compile_ours(backend, module, executable_devices, options, record, on_gpu, default)
        if default is not None and default.kept is not None:
            record.guard = default.decision
            record.guard["seconds"] = round(time.perf_counter() - started, 3)  # beside ours: the wall time of both
            if default.kept == "xla_default":
                return default.result()
    finally:
        if default is not None:
            default.gate.resume()  # undecided (ours failed): XLA's default compile goes on to the end
    if ours is None:
        warnings.warn(f"hlopt: {record.module}: fusing and scheduling inside XLA's compile failed "
                      f"({record.gpu_fell_back}); compiled with XLA's own fusion and scheduler", HookWarning,
                      stacklevel=4)
        if default is not None and default.kept is None:
            return default.result()
        record.guard = {}  # ended at its stage for ours, which then failed: XLA's default compiled again
        return _compile(backend, module if original is None else original, executable_devices, options)
    if on_gpu and original is not None and not guard:
        record.guard = {"enabled": False, "kept": "hlopt"}
    return ours


class _DefaultCompile:
    """The guard's compile: XLA's default compile of jax's module in a thread beside ours (XLA compiles
    without the GIL), with XLA's per-fusion estimates switched on, paused at its post-scheduler stage
    (`xla_stages.stopping_at`) until `decide` at ours. Its options are a copy taken before ours change them."""

    def __init__(self, backend, module, executable_devices, options, target: str) -> None:
        from hlopt.runtime.jax_integration.xla_stages import StageGate
        from jax._src.lib import _jax

        self._args = (backend, module, executable_devices, _jax.CompileOptions.ParseFromString(
            options.SerializeAsString()))
        devices = _device_count(options)
        # XLA's estimate of its module is taken on the guard's thread, while ours is still compiling
        self.gate = StageGate(GPU_STAGE, pause=True, prepare=lambda proto: _estimated(proto, target, devices))
        self.future = None
        self.kept: str | None = None  # "hlopt" | "xla_default" once decided
        self.decision: dict[str, Any] = {}

    def start(self) -> None:
        """Start the compile (once; inside ours' `transforming`, so that the stage's callback is registered)."""
        from concurrent.futures import ThreadPoolExecutor

        from hlopt.runtime.jax_integration.xla_stages import stopping_at

        if self.future is not None:
            return
        backend, module, executable_devices, options = self._args

        def compile_default():
            with _cost_model_stats(options), stopping_at(GPU_STAGE, gate=self.gate):
                return _compile(backend, module, executable_devices, options)

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hlopt-guard")
        self.future = pool.submit(compile_default)
        pool.shutdown(wait=False)

    def result(self):
        """XLA's default executable (the compile let go on to its end)."""
        self.start()
        self.gate.resume()
        return self.future.result()

    def decide(self, ours_proto: bytes | str, target: str, devices: int) -> str:
        """At ours' stage: wait for XLA's default compile to reach its own (or end), compare XLA's estimates of
        both modules, let the kept compile go on and end the other; "hlopt" or "xla_default"."""
        from hlopt.runtime.xla_gpu_path.xla_gpu import estimate

        self.start()
        waited = time.perf_counter()
        self.gate.wait()
        waited = round(time.perf_counter() - waited, 3)
        try:
            if self.gate.proto is None:  # it ended without meeting the stage (or failed): its final module
                xla_us = estimate(_final_module(self.future.result(), devices), target, devices).modeled_us
            elif isinstance(self.gate.prepared, Exception):
                raise self.gate.prepared
            else:
                xla_us = self.gate.prepared
        except Exception as e:  # noqa: BLE001 - no default to compare with: ours is kept
            self.kept, self.decision = "hlopt", {"enabled": True, "kept": "hlopt",
                                                 "xla_default_failed": f"{type(e).__name__}: {e}"[:300]}
            self.gate.stop()
            return self.kept
        self.decision = _guard_decision(_estimated(ours_proto, target, devices), xla_us)
        self.decision["waited_seconds"] = waited  # ours at its stage, XLA's default not yet at its own
        self.kept = self.decision["kept"]
        if self.kept == "hlopt":
            self.gate.stop()
        else:
            self.gate.resume()
        return self.kept


def _compile_ours(backend, module, executable_devices, options, record: CompileRecord, on_gpu: bool,
                  default: _DefaultCompile | None = None):
    """Our executable through the stage, or None with `record.gpu_fell_back` (or when the guard kept XLA's
    default: `default.kept`, and ours' compile was ended at its stage)."""
    from hlopt.runtime._xla import add_disabled_passes
    from hlopt.runtime.jax_integration.xla_stages import StageStop, transforming
    from hlopt.runtime.xla_gpu_path.reemit import (
        XLA_STAGE_DISABLED,
        after_xla_passes,
        fidelity,
        prepare_after_xla,
    )

    target = _target_of(backend) if on_gpu else None
    if on_gpu and target is None:
        record.gpu_fell_back = f"no target config for the device kind {_device_kind(backend)!r}"
        return None
    devices = _device_count(options)
    kept: dict[str, Any] = {}

    def step3(xla_module):
        passes = after_xla_passes(record.after_xla_pipeline, target) if target else record.after_xla_pipeline
        out, record.after_xla = prepare_after_xla(xla_module, passes)  # its passes time the GPU compiled for
        if not on_gpu:
            return out
        kept["ours"] = out
        proto = _backend_only(out, target, devices, record)
        if default is not None and default.decide(proto, target, devices) == "xla_default":
            record.after_xla["fidelity"] = fidelity(out, _module_of_proto(proto, devices))["summary"]
            record.after_xla["fidelity_of"] = "ours at XLA's post-scheduler stage (XLA's default kept)"
            raise StageStop("the guard kept XLA's default compile")
        return proto

    debug = options.executable_build_options.debug_options
    saved = debug.xla_disable_hlo_passes
    add_disabled_passes(options, XLA_STAGE_DISABLED)
    record.xla_disabled_passes = XLA_STAGE_DISABLED
    rejected, run = None, None
    started = time.perf_counter()
    try:
        with transforming(step3, GPU_STAGE if on_gpu else CPU_STAGE, getattr(backend, "platform", "cuda"),
                          only_module=record.module if on_gpu else None) as run, \
                _cost_model_stats(options if on_gpu else None):
            if default is not None:
                default.start()
            executable = _compile(backend, module, executable_devices, options)
        record.after_xla["compile_seconds"] = round(time.perf_counter() - started, 3)  # steps 2-4, all of it
    except Exception as e:  # noqa: BLE001 - no stages, or XLA refused step 3's module: compile XLA's own way
        if default is not None and default.kept == "xla_default":
            record.after_xla["compile_seconds"] = round(time.perf_counter() - started, 3)
            return None
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if run is None:
            rejected = f"XLA's transformation stages are unavailable: {why}"
        elif run.changed:
            rejected = f"XLA rejected the module of step 3: {why}"
        else:
            raise
    finally:
        debug.xla_disable_hlo_passes = saved
    if rejected is None and run.changed:
        if on_gpu:
            record.after_xla["fidelity"] = fidelity(kept["ours"], _final_module(executable, devices))["summary"]
        return executable
    record.gpu_fell_back = rejected or (run.errors[0] if run.errors else (
        f"XLA did not call its {run.stage} transformation stage"))
    record.xla_disabled_passes = ""
    return None


def _backend_only(module, target: str, devices: int, record: CompileRecord) -> bytes | str:
    """XLA:GPU's backend-only compile of step 3's module (`gpu_driver.compile_deviceless`, as `hlopt compile`
    step 4), in process through the plugin's C API, stopped at its own post-scheduler stage
    (`xla_stages.stopping_at`): the module there (a serialized HloModuleProto: copy insertion done, scheduled)
    is what the hooked compile goes on with. What comes after that stage (XLA's post-scheduling passes and
    codegen) is the hooked compile's own continuation: it runs once. Should XLA not meet the stage on this
    thread, the backend-only compile runs to its end and its final module's text is returned instead."""
    from hlopt.runtime.jax_integration.xla_stages import stopping_at
    from hlopt.runtime.xla_gpu_path.gpu_driver import DriverError, compile_deviceless
    from hlopt.runtime.xla_gpu_path.xla_gpu import spec_path

    started = time.perf_counter()
    with stopping_at(GPU_STAGE) as gate:
        try:
            result = compile_deviceless(module.to_text(), spec_path(target).read_text(), devices,
                                        backend_only=True, final_only=True)
        except DriverError:
            if gate.proto is None:
                raise
    record.after_xla["backend_only_seconds"] = round(time.perf_counter() - started, 3)
    if gate.proto is None:  # the stage was not met on this thread: the whole compile ran, its final module
        record.after_xla["backend_only_stage_missed"] = True
        return result["final_text"]
    return gate.proto


def _compile(backend, module, executable_devices, options):
    """XLA's compile of a jax module: unloaded for jax's compile-only (topology) client, loaded otherwise (as
    `jax._src.compiler.backend_compile_and_load` does)."""
    from jax._src.lib import _jax

    if isinstance(backend, _jax.CompileOnlyPyClient):
        if isinstance(module, bytes):  # StableHLO bytecode: the compile-only client takes an MLIR module only
            from jax._src.lib.mlir import ir

            with _ir_context():
                module = ir.Module.parse(module)
                return backend.compile(module, executable_devices=executable_devices, compile_options=options)
        return backend.compile(module, executable_devices=executable_devices, compile_options=options)
    return backend.compile_and_load(module, executable_devices=executable_devices, compile_options=options)


_IR = threading.local()  # `.context`: this thread's MLIR context for the modules `_compile` parses


def _ir_context():
    """An MLIR context as jax makes them (`mlir.make_ir_context`, several ms each), one per thread, reused."""
    context = getattr(_IR, "context", None)
    if context is None:
        from jax._src.interpreters import mlir

        context = _IR.context = mlir.make_ir_context()
    return context


@contextlib.contextmanager
def _cost_model_stats(options) -> Iterator[None]:
    """XLA:GPU writes its per-fusion estimates into the module's backend_config (what the guard compares)."""
    if options is None:
        yield
        return
    saved = list(options.env_option_overrides)
    options.env_option_overrides = [*saved, ("xla_gpu_collect_cost_model_stats", True)]
    try:
        yield
    finally:
        options.env_option_overrides = saved


def _device_count(options) -> int:
    return max(1, int(options.num_replicas) * int(options.num_partitions))


def _device_kind(backend) -> str:
    try:
        return backend.devices()[0].device_kind
    except Exception:  # noqa: BLE001 - informational
        return "unknown"


def _target_of(backend) -> str | None:
    """hlopt's target name for the backend's devices (`xla_gpu.target_of_device_kind`)."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import target_of_device_kind

    return target_of_device_kind(_device_kind(backend))


def _final_module(executable, devices: int):
    """The executable's final module, parsed by hlopt (`num_partitions` put back in its header)."""
    from hlopt.hlo.parser import parse
    from hlopt.runtime.xla_gpu_path.gpu_driver import with_partitions

    return parse(with_partitions(executable.hlo_modules()[0].to_string(), devices),
                 filename="<XLA:GPU final module>")


def _module_of_proto(proto: bytes | str, devices: int):
    """A serialized HloModuleProto (a stage's module), or HLO text, parsed by hlopt (`num_partitions` put in its
    header)."""
    from hlopt.hlo.parser import parse
    from hlopt.runtime._xla import full_hlo_text, xla_proto_module
    from hlopt.runtime.xla_gpu_path.gpu_driver import with_partitions

    text = proto if isinstance(proto, str) else full_hlo_text(xla_proto_module(proto))
    return parse(with_partitions(text, devices), filename="<XLA:GPU post-scheduler module>")


def _estimated(proto: bytes | str, target: str, devices: int) -> float:
    """XLA's estimate (us) of a stage's module (`xla_gpu.estimate(...).modeled_us`)."""
    from hlopt.runtime.xla_gpu_path.xla_gpu import estimate

    return estimate(_module_of_proto(proto, devices), target, devices).modeled_us


def _guard_decision(ours_us: float, xla_us: float) -> dict:
    """Which compile to keep, by XLA's estimates of our module and of XLA's default compile's, both at XLA's
    post-scheduler stage (ours on a tie)."""
    return {"enabled": True, "kept": "hlopt" if ours_us <= xla_us else "xla_default", "hlopt_us": round(ours_us, 3),
            "xla_default_us": round(xla_us, 3)}


def _for_cpu(text: str) -> str:
    """XLA:CPU re-fuses by itself and cannot take every fusion through StableHLO: inline ours."""
    from hlopt.runtime.execution.reentry import cpu_fusion_kinds_only

    from hlopt import hlo

    module = hlo.parse(text)
    prepared = cpu_fusion_kinds_only(module)
    return text if prepared is module else prepared.to_text()


def _module_bytecode(module) -> bytes:
    from jax._src.interpreters import mlir

    return mlir.module_to_bytecode(module)


def _acquire_patch() -> None:
    """One more user of the patch: route `backend_compile_and_load` through the hook (call under _lock)."""
    global _original, _patch_users
    from jax._src import compiler

    if _original is None:
        _original = compiler.backend_compile_and_load
        compiler.backend_compile_and_load = _patched_backend_compile_and_load
    _patch_users += 1


def _release_patch() -> None:
    """One user fewer: give jax its own function back when nobody needs the hook (call under _lock)."""
    global _original, _patch_users
    from jax._src import compiler

    _patch_users = max(0, _patch_users - 1)
    if not _patch_users and _original is not None:
        compiler.backend_compile_and_load = _original
        _original = None


def install(h: Hook) -> Hook:
    """Route jax compiles through `h` until `uninstall(h)`."""
    with _lock:
        _active.append(h)
        _acquire_patch()
    return h


def uninstall(h: Hook) -> None:
    """Stop routing compiles through `h` (restores jax when no hook is left)."""
    with _lock:
        if h in _active:
            _active.remove(h)
            _release_patch()


class PatchLease:
    """Keeps jax patched while it lives (a `runtime.jit` function holds one), so that a call only has to
    name its hook for the thread (`swap_thread_hook`): a call that hits jax's executable cache then costs
    two thread-local stores, not an install and an uninstall."""

    def __init__(self) -> None:
        with _lock:
            _acquire_patch()
        self._finalizer = weakref.finalize(self, _release_locked)

    def close(self) -> None:
        """Give the patch back now (otherwise when the lease is garbage-collected)."""
        self._finalizer()


def swap_thread_hook(h: Hook | None) -> Hook | None:
    """Make `h` the hook of compiles that start in this thread (besides the installed ones); returns the
    previous one, to be put back with another swap. Only effective while a `PatchLease` is alive."""
    previous = getattr(_per_thread, "hook", None)
    _per_thread.hook = h
    return previous


def _release_locked() -> None:
    with _lock:
        _release_patch()


@contextlib.contextmanager
def hook(pipeline: str = "default", strict: bool = False, verify_each: bool = False,
         recompile: bool = True, gpu_route: str = "xla-stages", guard: bool = True) -> Iterator[Hook]:
    """A context under which every jax compile runs `pipeline` first.

    jax keeps the executables it compiled before the hook was entered, and a call that finds one never
    compiles again. With `recompile=True` (the default) entering the hook clears jax's compilation caches
    (`jax.clear_caches()`), so every function called inside recompiles through the pipeline; with
    `recompile=False` those functions keep their earlier executable and a HookWarning says so when the
    context exits without having compiled anything. `gpu_route`: how a GPU backend gets our module (module
    docstring); `guard`: on a GPU, keep XLA's default compile where XLA's estimates rate it faster than ours
    (`CompileRecord.guard`; `guard=False` keeps ours regardless)."""
    if recompile:
        import jax

        jax.clear_caches()
    h = install(Hook(pipeline, strict, verify_each, gpu_route=gpu_route, guard=guard))
    try:
        yield h
    finally:
        uninstall(h)
    if not recompile and not h.records:
        warnings.warn("hlopt: nothing was compiled under runtime.hook(recompile=False): functions jax had "
                      "compiled before the hook was entered ran their earlier, unoptimized executables",
                      HookWarning, stacklevel=3)
