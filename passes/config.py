"""Pipeline configuration files (JSON or YAML), validated with pydantic.

    pipeline:
      - call-inliner
      - fix: [algebraic-simplifier, dce]
        max_iterations: 10
      - name: my-pass
        options: {threshold: 8}
    verify_each: true
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

from hlopt.passes.pipeline import Fix, Pipeline, parse_pipeline
from hlopt.passes.registry import PassOptionError, create_pass
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["PipelineConfig", "load_pipeline_config", "ConfigError"]


class ConfigError(ValueError):
    """A configuration file that does not describe a valid pipeline."""


class PassEntry(BaseModel):
    """One pass with options."""

    model_config = ConfigDict(extra="forbid")
    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class FixEntry(BaseModel):
    """A fixed-point group."""

    model_config = ConfigDict(extra="forbid")
    fix: list[Union[str, PassEntry, FixEntry]]  # noqa: UP007 - pydantic forward ref
    max_iterations: int = Field(25, ge=1, le=10_000)


class PipelineConfig(BaseModel):
    """A whole pipeline configuration."""

    model_config = ConfigDict(extra="forbid")
    pipeline: list[Union[str, PassEntry, FixEntry]]  # noqa: UP007
    verify_each: bool = True
    check_changed: bool = True
    dump_dir: str | None = None
    timing: bool = False

    @model_validator(mode="after")
    def _not_empty(self) -> PipelineConfig:
        if not self.pipeline:
            raise ValueError("pipeline is empty")
        return self

    def build(self) -> Pipeline:
        """The Pipeline this configuration describes (unknown passes/options raise ConfigError)."""
        passes = [p for entry in self.pipeline for p in _build(entry, "pipeline")]
        return Pipeline(passes, verify_each=self.verify_each, check_changed=self.check_changed,
                        dump_dir=Path(self.dump_dir) if self.dump_dir else None, timing=self.timing)


FixEntry.model_rebuild()
PipelineConfig.model_rebuild()


def _build(entry: str | PassEntry | FixEntry, where: str) -> list:
    try:
        if isinstance(entry, str):
            return parse_pipeline(entry)
        if isinstance(entry, PassEntry):
            return [create_pass(entry.name, **{k: _opt(v) for k, v in entry.options.items()})]
        inner = [p for e in entry.fix for p in _build(e, where + ".fix")]
        return [Fix(inner, entry.max_iterations)]
    except (PassOptionError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _opt(value: Any) -> Any:
    if isinstance(value, list):
        return ":".join(map(str, value))
    return value if isinstance(value, str | bool | int | float) else str(value)


def load_pipeline_config(path: str | Path) -> Pipeline:
    """Read a .json/.yaml/.yml pipeline configuration and build the Pipeline."""
    p = Path(path)
    text = p.read_text()
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - any syntax error becomes a ConfigError
        raise ConfigError(f"{p}: cannot read configuration: {e}") from None
    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{p}: invalid pipeline configuration:\n{e}") from None
    try:
        return config.build()
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
