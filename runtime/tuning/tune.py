"""`hlopt tune`: choose XLA:GPU flags and hlopt's options by simulation, without a GPU.

A trial is one configuration of a search space (`runtime.tuning.tune_space`), compiled deviceless and rated:
- XLA:GPU alone: XLA's default compile under the trial's flags (`xla_gpu.run_driver`);
- hlopt + XLA:GPU: `hlopt compile` (`reemit.compile_for_gpu`) with those flags and hlopt's options (pipeliner
  on/off, scheduler heuristic and overlap limit); with `guard`, XLA's default compile under the same flags is
  kept where it rates faster.
Each final module is rated as `hlopt compile` rates it (`xla_gpu.estimate`: XLA's per-instruction estimates
simulated on XLA:GPU's streams, loops times their trip counts), plus its exposed communication on those
estimates, hlopt's analytical makespan of the same module, and XLA's peak memory (the executable's memory
statistics). A configuration over the memory limit is refused (rated, but infeasible to the search).

The search is optuna's TPE sampler (multivariate, the memory limit a constraint: `Trial.set_constraint`), seeded. Trials are
asked in batches of `workers`, run in parallel (local processes, or Ray tasks with `cluster`), and told back in
trial order, so that the same seed and worker count give the same trials. The first trial is always XLA's
default configuration (no flags), the second `hlopt compile`'s defaults where the space allows hlopt, and the
last batch starts with hlopt's options on the best flags of XLA alone found so far (`_hlopt_on_best_flags`); every
finished trial is appended to OUT/trials.jsonl at once, and a run on the same OUT resumes from it.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import math
import os
import re
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hlopt.runtime.tuning.tune_space import Config, Space

__all__ = ["TrialJob", "run_trial", "rate_final", "before_pipeline", "after_pipeline", "Tuner", "TuneResult",
           "TuneError", "OPTUNA_INSTALL", "RAY_INSTALL", "device_memory_bytes", "module_devices"]

OPTUNA_INSTALL = "pip install 'hlopt[tune]'  (optuna)"
RAY_INSTALL = "pip install 'hlopt[cluster]'  (ray)"
_PIPELINER = re.compile(r"collective-pipeliner\{[^}]*\},")


class TuneError(ValueError):
    """A tuning run that cannot start or go on (one line)."""


# ----------------------------------------------------------------------------- one trial


def before_pipeline(pipeliner: bool = True) -> str:
    """Step 1 of `hlopt compile`, with or without hlopt's collective-pipeliner."""
    from hlopt.runtime.xla_gpu_path.reemit import BEFORE_XLA

    return BEFORE_XLA if pipeliner else _PIPELINER.sub("", BEFORE_XLA).replace("simplify,simplify", "simplify")


def after_pipeline(heuristic: str = "xla-default", overlap_limit: int = 1) -> str:
    """Step 3 of `hlopt compile` with the scheduler's heuristic and overlap limit."""
    from hlopt.runtime.xla_gpu_path.reemit import AFTER_XLA

    options = ",".join(o for o in (f"heuristic={heuristic}" if heuristic != "xla-default" else "",
                                   f"overlap_limit={overlap_limit}" if overlap_limit != 1 else "") if o)
    return AFTER_XLA.replace("latency-hiding-scheduler", f"latency-hiding-scheduler{{{options}}}") if options else AFTER_XLA


def module_devices(module: Any) -> int:
    """The devices a module runs on (as `hlopt compile` counts them)."""
    from hlopt.runtime import execution_mode

    _, replicas, partitions = execution_mode(module)
    return replicas * partitions


def device_memory_bytes(target: str) -> int:
    """The target GPU's memory."""
    from hlopt.cost_model.devices import get_device

    return int(get_device(target).memory_bytes)


class _RolledUp:
    """A latency estimator that simulates loops, calls and conditionals in their own order (callees' scheduled
    makespans, trip counts) and keeps each computation's simulation, so that exposed communication inside loops
    counts in the module's figure."""

    def __init__(self, base: Any) -> None:
        self.base = base
        self.sims: dict[Any, Any] = {}

    def simulation(self, comp: Any) -> Any:
        """The simulation of one execution of `comp` (cached)."""
        from hlopt.scheduler.simulator import simulate

        if comp not in self.sims:
            self.sims[comp] = simulate(comp, self)
        return self.sims[comp]

    def node_cost(self, inst: Any) -> float:
        """Control flow: its callees simulated; anything else: the base estimator's cost."""
        from hlopt.cost_model.model import control_flow_time_us

        if inst.opcode in ("while", "call", "conditional"):
            return control_flow_time_us(inst, lambda c: self.simulation(c).makespan_us)
        return self.base.node_cost(inst)

    def latency(self, start: Any, done: Any) -> float:
        """The base estimator's collective time."""
        return self.base.latency(start, done)

    def exposed_us(self, comp: Any) -> float:
        """Exposed communication of one execution of `comp`, its callees' included (times their runs)."""
        from hlopt.cost_model.model import control_flow_time_us

        own = self.simulation(comp).exposed_comm_us
        for inst in comp.instructions:
            if inst.opcode in ("while", "call", "conditional"):
                own += control_flow_time_us(inst, self.exposed_us)
        return own


def rate_final(final: Any, target: str, devices: int, memory: dict[str, int]) -> dict[str, Any]:
    """The figures of one XLA:GPU final module: `modeled_us` (XLA's estimates on XLA:GPU's streams, what
    `hlopt compile` reports), `exposed_comm_us` on the same estimates, `makespan_us` (hlopt's analytical model
    in the module's order), `peak_memory_bytes` (XLA's memory statistics) and launches per execution."""
    from hlopt.cost_model.devices import get_device
    from hlopt.runtime.xla_gpu_path.xla_gpu import XlaEstimateLatency, estimate
    from hlopt.scheduler.costs import AnalyticalLatencyEstimator

    est = estimate(final, target, devices)
    xla = _RolledUp(XlaEstimateLatency(target, float(get_device(target).kernel_launch_us), devices))
    ours = _RolledUp(AnalyticalLatencyEstimator(target))
    peak = memory.get("peak_memory_bytes")
    if peak is None:  # older drivers: arguments, outputs and temporaries
        peak = sum(int(memory.get(k, 0)) for k in ("argument_bytes", "output_bytes", "temp_bytes"))
    return {"modeled_us": round(est.modeled_us, 3), "exposed_comm_us": round(xla.exposed_us(final.entry), 3),
            "makespan_us": round(ours.simulation(final.entry).makespan_us, 3),
            "peak_memory_bytes": int(peak), "launches": est.dynamic_launches}


@dataclass(frozen=True)
class TrialJob:
    """Everything a worker needs for one trial (picklable)."""

    modules: tuple[tuple[str, str], ...]  # (name, HLO text)
    target: str
    devices: int | None
    flags: str
    hlopt: dict[str, Any] | None
    timeout: float = 600.0


def _rate_one(name: str, text: str, job: TrialJob) -> dict[str, Any]:
    """One module under one configuration: its figures (module docstring)."""
    from hlopt.hlo.parser import parse
    from hlopt.runtime.xla_gpu_path.reemit import compile_for_gpu
    from hlopt.runtime.xla_gpu_path.xla_gpu import run_driver

    module = parse(text, filename=name)
    devices = job.devices or module_devices(module)
    started = time.perf_counter()
    if job.hlopt is None:
        result = run_driver(text, job.target, devices, "", job.flags, False, job.timeout)
        figures = {**rate_final(result.final, job.target, devices, result.memory), "kept": "xla"}
    else:
        opts = job.hlopt
        result = compile_for_gpu(module, job.target, devices, before=before_pipeline(opts.get("pipeliner", True)),
                                 after=after_pipeline(opts.get("heuristic", "xla-default"), opts.get("overlap_limit", 1)),
                                 xla_flags=job.flags, timeout=job.timeout,
                                 double_buffering=double_buffering_option(opts.get("double_buffering", "best")))
        ours = rate_final(result.final.final, job.target, devices, result.final.memory)
        xla = rate_final(result.xla_default.final, job.target, devices, result.xla_default.memory)
        guarded = opts.get("guard", True) and xla["modeled_us"] < ours["modeled_us"]
        figures = {**(xla if guarded else ours), "kept": "xla (guard)" if guarded else "hlopt",
                   "hlopt_modeled_us": ours["modeled_us"], "xla_alone_modeled_us": xla["modeled_us"]}
    return {"module": name, "devices": devices, **figures, "seconds": round(time.perf_counter() - started, 2)}


def double_buffering_option(option: str) -> bool | str:
    """hlopt's `double_buffering` option as `compile_for_gpu` takes it ("best", True, False)."""
    return {"always": True, "never": False}.get(option, "best")


def run_trial(job: TrialJob) -> dict[str, Any]:
    """Compile and rate every module of `job` (a worker's entry point): the summed times, the largest peak
    memory, per-module figures; {"error": ...} where a compile failed."""
    started = time.perf_counter()
    try:
        per_module = [_rate_one(name, text, job) for name, text in job.modules]
    except Exception as e:  # noqa: BLE001 - a failed trial is a result (XLA refused the flags, a step failed)
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500],
                "seconds": round(time.perf_counter() - started, 2)}
    out: dict[str, Any] = {k: round(sum(m[k] for m in per_module), 3)
                           for k in ("modeled_us", "exposed_comm_us", "makespan_us")}
    out["peak_memory_bytes"] = max(m["peak_memory_bytes"] for m in per_module)
    out["launches"] = sum(m["launches"] for m in per_module)
    out["kept"] = ",".join(sorted({m["kept"] for m in per_module}))
    for key in ("hlopt_modeled_us", "xla_alone_modeled_us"):
        if all(key in m for m in per_module):
            out[key] = round(sum(m[key] for m in per_module), 3)
    out["seconds"] = round(time.perf_counter() - started, 2)
    if len(per_module) > 1:
        out["modules"] = per_module
    return out


# ----------------------------------------------------------------------------- where trials run


class _InProcess:
    """One trial at a time in this process (`workers=1`): futures run when asked for their result."""

    def submit(self, job: TrialJob) -> cf.Future:
        future: cf.Future = cf.Future()
        future.set_running_or_notify_cancel()
        try:
            future.set_result(run_trial(job))
        except BaseException as e:  # an interrupt reaches the caller through the future
            future.set_exception(e)
        return future

    def close(self) -> None:
        """Nothing to release."""


class _Processes:
    """Local worker processes (spawned: the workers import jax afresh)."""

    def __init__(self, workers: int) -> None:
        import multiprocessing

        self.pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))

    def submit(self, job: TrialJob) -> cf.Future:
        return self.pool.submit(run_trial, job)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class _Ray:
    """Ray tasks: on a cluster (`ray://HOST:PORT`, or `auto` for the one this machine belongs to) or a Ray
    instance started here (`local`, `workers` CPUs). hlopt and the XLA:GPU compiler must be installed on the
    cluster's workers."""

    def __init__(self, address: str, workers: int) -> None:
        if address.startswith("ray://"):
            _use_ray_token_if_present()  # before Ray is imported: it reads the mode once
        try:
            import ray
        except ImportError:
            raise TuneError(f"--cluster needs Ray: {RAY_INSTALL}") from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            kwargs: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
            kwargs["address"] = address  # "local": a new instance even where this machine belongs to a cluster
            if address == "local":
                kwargs.update(num_cpus=workers, object_store_memory=256 * 1024 * 1024)
            try:
                ray.init(**kwargs)
            except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError
                raise TuneError(f"--cluster {address}: cannot connect to Ray: {str(e).splitlines()[0]}"
                                f"{_RAY_AUTH_HINT if address.startswith('ray://') else ''}") from None
        self.remote = ray.remote(num_cpus=1, max_retries=0)(run_trial)

    def submit(self, job: TrialJob) -> cf.Future:
        return self.remote.remote(job).future()

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


_RAY_AUTH_HINT = (" (a cluster with token authentication, on by default for `ray start` in recent Ray, needs its token here: "
                  "RAY_AUTH_TOKEN, or ~/.ray/auth_token, with RAY_AUTH_MODE=token)")


def _use_ray_token_if_present() -> None:
    """Connect to a `ray://` cluster with token authentication where a token is at hand.

    `ray start` turns token authentication on by default, and a Ray Client reads its token (`RAY_AUTH_TOKEN`,
    `RAY_AUTH_TOKEN_PATH` or `~/.ray/auth_token`) only when `RAY_AUTH_MODE=token`; a mode the user set is kept.
    """
    if "RAY_AUTH_MODE" in os.environ:
        return
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    if os.environ.get("RAY_AUTH_TOKEN") or token_file.is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


def _pool(workers: int, cluster: str | None) -> Any:
    if cluster:
        return _Ray(cluster, workers)
    return _InProcess() if workers == 1 else _Processes(workers)


# ----------------------------------------------------------------------------- the search


@dataclass
class TuneResult:
    """A finished (or interrupted) tuning run: every trial's record, in trial order."""

    name: str
    out: Path
    space: Space
    target: str
    memory_limit_bytes: int
    records: list[dict[str, Any]]
    interrupted: bool = False
    seconds: float = 0.0

    def ok(self) -> list[dict[str, Any]]:
        """The rated trials within the memory limit."""
        return [r for r in self.records if r["status"] == "ok"]

    def default(self) -> dict[str, Any] | None:
        """XLA's default configuration's trial (trial 0)."""
        return next((r for r in self.records if r["trial"] == 0 and r["status"] != "failed"), None)

    def best(self, mode: str | None = None) -> dict[str, Any] | None:
        """The best rated trial within the memory limit, of one mode ("xla", "hlopt") or any."""
        rows = [r for r in self.ok() if mode is None or r["mode"] == mode]
        return min(rows, key=lambda r: (r["objective_us"], r["trial"])) if rows else None


@dataclass
class Tuner:
    """One search over one set of modules (one module, or a dump directory tuned jointly)."""

    name: str
    modules: list[tuple[str, str]]
    out: Path
    space: Space
    target: str = "h100"
    devices: int | None = None
    trials: int = 30
    budget_s: float | None = None
    workers: int = 1
    cluster: str | None = None
    seed: int = 0
    memory_limit_bytes: int | None = None
    timeout: float = 600.0
    restart: bool = False  # discard the trials an earlier run left in `out`
    on_record: Callable[[dict[str, Any], TuneResult], None] | None = field(default=None, repr=False)

    @property
    def memory_limit(self) -> int:
        """Bytes: the given limit, the space's, else the target's memory."""
        if self.memory_limit_bytes:
            return self.memory_limit_bytes
        if self.space.memory_limit_gb:
            return int(self.space.memory_limit_gb * 2**30)
        return device_memory_bytes(self.target)

    def run(self) -> TuneResult:
        """Search (module docstring); KeyboardInterrupt stops it with the finished trials kept."""
        optuna = _import_optuna()
        self.out.mkdir(parents=True, exist_ok=True)
        records = self._resume()
        result = TuneResult(self.name, self.out, self.space, self.target, self.memory_limit, records)
        study = self._study(optuna)
        for record in records:
            study.add_trial(_frozen(optuna, self.space, record))
        for point in self._fixed_points():
            study.enqueue_trial(point, skip_if_exists=True)
        started = time.perf_counter()
        pool = _pool(self.workers, self.cluster)
        try:
            while len(result.records) < self.trials:
                if self.budget_s is not None and time.perf_counter() - started >= self.budget_s:
                    break
                remaining = self.trials - len(result.records)
                if remaining <= self.workers and (point := self._hlopt_on_best_flags(result)) is not None:
                    study.enqueue_trial(point, skip_if_exists=True)
                batch = [study.ask() for _ in range(min(self.workers, remaining))]
                points = [_suggest(t, self.space) for t in batch]
                futures = {pool.submit(self._job(p)): (t, p) for t, p in zip(batch, points, strict=True)}
                finished: dict[int, dict[str, Any]] = {}
                for future in cf.as_completed(futures):
                    trial, point = futures[future]
                    finished[trial.number] = self._record(trial.number, point, future.result())
                    self._save(finished[trial.number])
                    result.records.append(finished[trial.number])
                    result.records.sort(key=lambda r: r["trial"])
                    if self.on_record:
                        self.on_record(finished[trial.number], result)
                for trial in batch:
                    _tell(optuna, study, trial, finished[trial.number])
        except KeyboardInterrupt:
            result.interrupted = True
        finally:
            pool.close()
        result.seconds = time.perf_counter() - started
        return result

    # -- pieces

    def _study(self, optuna: Any) -> Any:
        sampler = optuna.samplers.TPESampler(seed=self.seed, multivariate=True, group=True,
                                             n_startup_trials=max(4, min(10, self.trials // 3)))
        return optuna.create_study(direction="minimize", sampler=sampler)

    def _fixed_points(self) -> list[dict[str, Any]]:
        """XLA's defaults, then hlopt compile's defaults where the space allows hlopt."""
        points = [self.space.defaults()]
        if True in (self.space.hlopt.use.choices or []):
            points.append(self.space.defaults(use_hlopt=True))
        return points

    def _hlopt_on_best_flags(self, result: TuneResult) -> dict[str, Any] | None:
        """The point the last batch starts with: hlopt's default options on the best flags of XLA:GPU alone so
        far, without hlopt's pipeliner where those flags switch XLA's on (the loops pipelined once). None where
        the space has no hlopt or no trial of XLA alone was rated."""
        best = result.best("xla")
        if best is None or True not in (self.space.hlopt.use.choices or []):
            return None
        point = self.space.defaults(use_hlopt=True)
        point.update({n: v for n, v in best["params"].items() if not n.startswith("hlopt.")})
        pipelined = any(v is True for n, v in point.items() if n.startswith("xla_gpu_enable_pipelined_"))
        if "hlopt.pipeliner" in point and self.space.hlopt.pipeliner.contains(not pipelined):
            point["hlopt.pipeliner"] = not pipelined
        return point

    def _job(self, point: dict[str, Any]) -> TrialJob:
        config = Config.of(self.space, point)
        return TrialJob(tuple(self.modules), self.target, self.devices, config.xla_flags, config.hlopt, self.timeout)

    def _record(self, number: int, point: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
        config = Config.of(self.space, point)
        record: dict[str, Any] = {"trial": number, "mode": "xla" if config.hlopt is None else "hlopt",
                                  "xla_flags": config.xla_flags, "hlopt": config.hlopt, "config": config.describe(),
                                  "params": point}
        if "error" in figures:
            record.update(status="failed", error=figures["error"], seconds=figures.get("seconds"))
            return record
        objective = figures["makespan_us"] if self.space.objective == "makespan" else figures["modeled_us"]
        over = max(0, figures["peak_memory_bytes"] - self.memory_limit)
        record.update(status="over_memory" if over else "ok", objective_us=objective, over_memory_bytes=over,
                      **figures)
        return record

    def _key(self) -> str:
        """What a resumed run must share with the saved one: modules, target, devices, space, seed."""
        h = hashlib.sha256()
        for part in (*[t for _, t in self.modules], self.target, str(self.devices), self.space.model_dump_json(),
                     str(self.seed), str(self.memory_limit)):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:16]

    def _resume(self) -> list[dict[str, Any]]:
        """The records of an earlier run of the same search in `out` (none for a new one)."""
        trials, state = self.out / "trials.jsonl", self.out / "tune_state.json"
        key = self._key()
        if self.restart:
            trials.unlink(missing_ok=True)
            state.unlink(missing_ok=True)
        if trials.exists() and state.exists():
            saved = json.loads(state.read_text()).get("key")
            if saved != key:
                raise TuneError(f"{self.out} holds a tuning run of another module, space, target or seed: "
                                "give another --out, or --restart to discard it")
            records = [json.loads(line) for line in trials.read_text().splitlines() if line.strip()]
            records.sort(key=lambda r: r["trial"])
            kept = []
            for record in records:  # a gap (a batch cut short) ends them: the search re-asks from there
                if record["trial"] != len(kept):
                    break
                kept.append(record)
            trials.write_text("".join(json.dumps(r) + "\n" for r in kept))
            return kept
        state.write_text(json.dumps({"key": key, "name": self.name, "target": self.target}) + "\n")
        trials.write_text("")
        return []

    def _save(self, record: dict[str, Any]) -> None:
        with (self.out / "trials.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise TuneError(f"hlopt tune needs optuna: {OPTUNA_INSTALL}") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def _suggest(trial: Any, space: Space) -> dict[str, Any]:
    """Ask `trial` for a point of `space` (hlopt's options only where the trial uses hlopt)."""
    names = list(space.xla_flags) + ["hlopt.use"]
    point = {name: _suggest_one(trial, name, space.param(name)) for name in names}
    if point["hlopt.use"]:
        for name in space.names():
            if name.startswith("hlopt.") and name != "hlopt.use":
                point[name] = _suggest_one(trial, name, space.param(name))
    return point


def _suggest_one(trial: Any, name: str, param: Any) -> Any:
    if param.choices is not None:
        return trial.suggest_categorical(name, param.choices)
    if param.is_int:
        return trial.suggest_int(name, int(param.low), int(param.high), step=int(param.step or 1), log=param.log)
    return trial.suggest_float(name, float(param.low), float(param.high), step=param.step, log=param.log)


def _tell(optuna: Any, study: Any, trial: Any, record: dict[str, Any]) -> None:
    if record["status"] == "failed":
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return
    trial.set_constraint("memory", float(record["over_memory_bytes"]))  # feasible when <= 0
    study.tell(trial, record["objective_us"])


def _frozen(optuna: Any, space: Space, record: dict[str, Any]) -> Any:
    """A saved record as an optuna trial (a resumed run tells the search what it already knows)."""
    point = record["params"]
    distributions = {name: space.param(name).distribution() for name in point}
    if record["status"] == "failed":
        return optuna.trial.create_trial(params=point, distributions=distributions,
                                         state=optuna.trial.TrialState.FAIL)
    return optuna.trial.create_trial(params=point, distributions=distributions, value=record["objective_us"],
                                     constraints={"memory": float(record["over_memory_bytes"])})


def pareto_front(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rated trials no other trial beats on both objective time and peak memory, by memory."""
    rows = sorted((r for r in records if r["status"] in ("ok", "over_memory")),
                  key=lambda r: (r["peak_memory_bytes"], r["objective_us"], r["trial"]))
    front, best = [], math.inf
    for r in rows:
        if r["objective_us"] < best:
            front.append(r)
            best = r["objective_us"]
    return front


__all__ += ["pareto_front"]
