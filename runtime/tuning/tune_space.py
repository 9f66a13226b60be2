"""The search space of `hlopt tune`: XLA:GPU flags and hlopt's own options, declared in YAML, validated by pydantic.

    objective: xla                  # or makespan (hlopt's analytical model)
    memory_limit_gb: null           # null: the target's device memory
    xla_flags:
      xla_gpu_all_gather_combine_threshold_bytes: {low: 1048576, high: 1073741824, log: true, default: 31457287}
      xla_gpu_enable_pipelined_all_gather: {choices: [false, true], default: false}
    hlopt:
      use: {choices: [false, true], default: false}
      heuristic: {choices: [xla-default, critical-path], default: xla-default}

A parameter is `choices` or a range (`low`, `high`, optional `log` or `step`) and its `default` (XLA's default for
a flag: a trial passes a flag only where it differs from it). The default space ships with hlopt
(`tune_default_space.yaml`, `default_space()`). `Config` is one point of the space.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = ["Param", "HloptOptions", "Space", "Config", "SpaceError", "load_space", "default_space",
           "DEFAULT_SPACE_PATH", "HLOPT_OPTIONS"]

DEFAULT_SPACE_PATH = Path(__file__).resolve().with_name("tune_default_space.yaml")
#: hlopt's own options a space may declare, with their value types.
HLOPT_OPTIONS = {"use": bool, "pipeliner": bool, "heuristic": str, "guard": bool, "overlap_limit": int,
                 "double_buffering": str}

Scalar = bool | int | float | str


class SpaceError(ValueError):
    """A search space file that cannot be read or does not validate (one line per problem)."""


class Param(BaseModel):
    """One dimension: `choices`, or a range `low`..`high` (`log` scale or `step`), and the `default` value."""

    model_config = ConfigDict(extra="forbid")
    choices: list[Scalar] | None = None
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    default: Scalar

    @model_validator(mode="after")
    def _consistent(self) -> Param:
        if self.choices is not None:
            if self.low is not None or self.high is not None or self.step is not None or self.log:
                raise ValueError("give either choices or low/high, not both")
            if not self.choices:
                raise ValueError("choices is empty")
            if self.default not in self.choices or any(type(c) is not type(self.default) for c in self.choices
                                                        if c == self.default):
                raise ValueError(f"default {self.default!r} is not one of the choices {self.choices}")
            return self
        if self.low is None or self.high is None:
            raise ValueError("give choices, or low and high")
        if isinstance(self.default, bool | str) or isinstance(self.low, bool) or isinstance(self.high, bool):
            raise ValueError("a range takes numbers")
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("a log range needs low > 0 and no step")
        if self.step is not None and self.step <= 0:
            raise ValueError("step must be positive")
        if not self.low <= self.default <= self.high:
            raise ValueError(f"default {self.default} is outside [{self.low}, {self.high}]")
        return self

    @property
    def is_int(self) -> bool:
        """A range of integers (low, high, step and default all integers)."""
        values = [self.low, self.high, self.default] + ([self.step] if self.step is not None else [])
        return self.choices is None and all(isinstance(v, int) for v in values)

    def distribution(self) -> Any:
        """The optuna distribution of this dimension."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.choices is not None:
            return CategoricalDistribution(self.choices)
        if self.is_int:
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(float(self.low), float(self.high), log=self.log,
                                 step=None if self.step is None else float(self.step))

    def contains(self, value: Any) -> bool:
        """Whether `value` is a point of this dimension."""
        if self.choices is not None:
            return any(value == c and type(value) is type(c) for c in self.choices)
        return isinstance(value, int | float) and not isinstance(value, bool) and self.low <= value <= self.high


class HloptOptions(BaseModel):
    """hlopt's own options: `use` (hlopt compile, else XLA:GPU alone), `pipeliner` (hlopt's collective-pipeliner
    before XLA), `heuristic` and `overlap_limit` (its latency-hiding-scheduler), `guard` (keep XLA's default
    compile where it rates faster), `double_buffering` (`best`, `always` or `never`: whether hlopt compile adds
    XLA's loop double buffering where a loop holds a collective; a trial whose XLA flags choose XLA's unrolling
    keeps that choice)."""

    model_config = ConfigDict(extra="forbid")
    use: Param = Field(default_factory=lambda: Param(choices=[False], default=False))
    pipeliner: Param | None = None
    heuristic: Param | None = None
    guard: Param | None = None
    overlap_limit: Param | None = None
    double_buffering: Param | None = None

    @model_validator(mode="after")
    def _typed(self) -> HloptOptions:
        if not self.use.contains(False):
            raise ValueError("hlopt.use must allow false: XLA's default configuration is always a trial")
        for name, kind in HLOPT_OPTIONS.items():
            param = getattr(self, name)
            values = ([param.default, *(param.choices or [])] if param is not None else [])
            if any(type(v) is not kind for v in values):
                raise ValueError(f"hlopt.{name} takes {kind.__name__} values")
        if self.heuristic is not None:
            from hlopt.scheduler.heuristics import HEURISTICS

            unknown = sorted({h for h in [self.heuristic.default, *(self.heuristic.choices or [])] if h not in HEURISTICS})
            if unknown:
                raise ValueError(f"hlopt.heuristic: unknown {unknown} (known: {', '.join(sorted(HEURISTICS))})")
        if self.double_buffering is not None:
            unknown = sorted({v for v in [self.double_buffering.default, *(self.double_buffering.choices or [])]
                              if v not in ("best", "always", "never")})
            if unknown:
                raise ValueError(f"hlopt.double_buffering: unknown {unknown} (known: best, always, never)")
        if self.overlap_limit is not None and (self.overlap_limit.choices is not None or self.overlap_limit.low < 1):
            raise ValueError("hlopt.overlap_limit is a range of integers from 1")
        return self

    def params(self) -> dict[str, Param]:
        """The declared options (name -> Param)."""
        return {name: getattr(self, name) for name in HLOPT_OPTIONS if getattr(self, name) is not None}


class Space(BaseModel):
    """A whole search space."""

    model_config = ConfigDict(extra="forbid")
    objective: Literal["xla", "makespan"] = "xla"
    memory_limit_gb: float | None = Field(None, gt=0)
    xla_flags: dict[str, Param] = Field(default_factory=dict)
    hlopt: HloptOptions = Field(default_factory=HloptOptions)

    @field_validator("xla_flags")
    @classmethod
    def _flag_names(cls, flags: dict[str, Param]) -> dict[str, Param]:
        bad = [name for name in flags if not name.startswith("xla_") or "=" in name or " " in name]
        if bad:
            raise ValueError(f"XLA flags are named without dashes, like xla_gpu_enable_pipelined_all_gather: {bad}")
        return flags

    @model_validator(mode="after")
    def _something_to_tune(self) -> Space:
        if not self.xla_flags and not self.hlopt.params().keys() - {"use"} and len(self.hlopt.use.choices or []) < 2:
            raise ValueError("the space has nothing to tune (no xla_flags, no hlopt options)")
        return self

    def names(self) -> list[str]:
        """Every dimension, as optuna names them: flags by name, hlopt options as `hlopt.NAME`."""
        return list(self.xla_flags) + [f"hlopt.{n}" for n in self.hlopt.params()]

    def param(self, name: str) -> Param:
        """The dimension called `name` (see `names`)."""
        return self.hlopt.params()[name[6:]] if name.startswith("hlopt.") else self.xla_flags[name]

    def defaults(self, use_hlopt: bool = False) -> dict[str, Any]:
        """The default point: XLA's defaults, XLA:GPU alone (or hlopt compile's defaults with `use_hlopt`)."""
        point = {name: p.default for name, p in self.xla_flags.items()}
        point["hlopt.use"] = use_hlopt
        if use_hlopt:
            point.update({f"hlopt.{n}": p.default for n, p in self.hlopt.params().items() if n != "use"})
        return point

    def contains(self, point: dict[str, Any]) -> bool:
        """Whether every value of `point` is in its dimension."""
        return all(name in self.names() and self.param(name).contains(v) for name, v in point.items())


@dataclass(frozen=True)
class Config:
    """One point of a space: XLA flags (only those differing from XLA's defaults) and hlopt's options (None:
    XLA:GPU alone)."""

    flags: dict[str, Any] = field(default_factory=dict)
    hlopt: dict[str, Any] | None = None

    @staticmethod
    def of(space: Space, point: dict[str, Any]) -> Config:
        """The configuration of an optuna point (`Space.names` keys)."""
        flags = {n: v for n, v in point.items() if not n.startswith("hlopt.") and v != space.xla_flags[n].default}
        if not point.get("hlopt.use", False):
            return Config(flags, None)
        options = {n: p.default for n, p in space.hlopt.params().items() if n != "use"}
        options.update({n[6:]: v for n, v in point.items() if n.startswith("hlopt.") and n != "hlopt.use"})
        return Config(flags, options)

    @property
    def xla_flags(self) -> str:
        """The flags as XLA_FLAGS takes them: `--xla_a=1 --xla_b=false`."""
        return " ".join(f"--{n}={_flag_text(v)}" for n, v in sorted(self.flags.items()))

    def describe(self) -> str:
        """Short text for tables: the flags (without their `xla_gpu_` prefix) and hlopt's options."""
        parts = [f"{n.removeprefix('xla_gpu_').removeprefix('xla_')}={_flag_text(v)}" for n, v in sorted(self.flags.items())]
        if self.hlopt is not None:
            parts.insert(0, "hlopt(" + ",".join(f"{k}={_flag_text(v)}" for k, v in sorted(self.hlopt.items())) + ")")
        return " ".join(parts) or "XLA defaults"


def _flag_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def load_space(path: str | Path | None = None) -> Space:
    """The space of a YAML (or JSON) file; the default space without a path. SpaceError with one line per problem."""
    import yaml

    path = Path(path) if path is not None else DEFAULT_SPACE_PATH
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise SpaceError(f"{path}: cannot read ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise SpaceError(f"{path}: not YAML: {str(e).splitlines()[0]}") from None
    try:
        return Space.model_validate(data if data is not None else {})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'space'}: {err['msg'].removeprefix('Value error, ')}"
                             for err in e.errors())
        raise SpaceError(f"{path}: invalid search space: {problems}") from None


def default_space() -> Space:
    """The space that ships with hlopt (`tune_default_space.yaml`)."""
    return load_space(DEFAULT_SPACE_PATH)
