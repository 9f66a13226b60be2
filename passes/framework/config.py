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
from typing import Annotated, Any, Union

from hlopt.passes.framework.pipeline import Fix, Pipeline, parse_pipeline
from hlopt.passes.framework.registry import PassOptionError, create_pass
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

__all__ = ["PipelineConfig", "load_pipeline_config", "ConfigError"]


class ConfigError(ValueError):
    """A configuration file that does not describe a valid pipeline."""


class PassEntry(BaseModel):
    """One pass with options."""

    model_config = ConfigDict(extra="forbid")
    name: str
    options: dict[str, Any] = Field(default_factory=dict)


def _entry_kind(value: Any) -> str | None:
    """Which form a pipeline entry is written in (a spec string, a pass with options, a fix group), so that
    pydantic reports the errors of that form only, not of every form it might have been."""
    if isinstance(value, str):
        return "spec"
    if isinstance(value, PassEntry | FixEntry):
        return "pass" if isinstance(value, PassEntry) else "fix"
    if isinstance(value, dict):
        return "fix" if "fix" in value else "pass"
    return None


_ENTRY_FORMS = ("a pass name or spec string, a mapping {name, options}, or a mapping "
                "{fix: [...], max_iterations}")

Entry = Annotated[
    Union[Annotated[str, Tag("spec")], Annotated[PassEntry, Tag("pass")],  # noqa: UP007 - pydantic forward ref
          Annotated["FixEntry", Tag("fix")]],
    Discriminator(_entry_kind, custom_error_type="entry_form", custom_error_message=f"expected {_ENTRY_FORMS}"),
]
"""One element of a pipeline or a fix group."""


class FixEntry(BaseModel):
    """A fixed-point group."""

    model_config = ConfigDict(extra="forbid")
    fix: list[Entry]
    max_iterations: int = Field(25, ge=1, le=10_000)


class PipelineConfig(BaseModel):
    """A whole pipeline configuration."""

    model_config = ConfigDict(extra="forbid")
    pipeline: list[Entry]
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


_TAGS = frozenset({"spec", "pass", "fix"})


def validation_message(error: ValidationError) -> str:
    """pydantic's errors as one line: each error's field (`pipeline[1].max_iterations`), the value given and
    what was expected, joined by '; '."""
    parts = []
    for err in error.errors(include_url=False):
        loc = [x for i, x in enumerate(err["loc"]) if not (x in _TAGS and i > 0 and isinstance(err["loc"][i - 1], int))]
        field = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in loc).lstrip(".")
        if not field:
            parts.append(_expected(err["msg"]))
            continue
        if err["type"] in ("missing",):
            parts.append(f"{field}: missing (a required field)")
            continue
        if err["type"] == "extra_forbidden":
            parts.append(f"{field}: unknown field")
            continue
        parts.append(f"{field}: {err['input']!r}: {_expected(err['msg'])}")
    return "; ".join(parts)


def _expected(message: str) -> str:
    """pydantic's message phrased as what was expected (`Input should be a valid integer` -> `expected a
    valid integer`)."""
    for prefix in ("Input should be ", "Value error, "):
        if message.startswith(prefix):
            rest = message[len(prefix):]
            return f"expected {rest}" if prefix.startswith("Input") else rest
    return message


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
        raise ConfigError(f"{p}: invalid pipeline configuration: {validation_message(e)}") from None
    try:
        return config.build()
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
