"""The pass registry: built-in passes (this package's and, through `hlopt.pipelines`, the scheduler's), passes
from installed packages (the `hlopt.passes` entry points), passes from a user's file."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import sys
import threading
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hlopt.passes.framework.base import Pass

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["register", "get_pass", "has_pass", "create_pass", "pass_options", "registered_passes", "load_plugin_file", "PassOptionError", "pass_origin",
           "plugin_entry_points", "load_builtins", "OWN_PLUGIN_MODULE"]

PASSES: dict[str, type[Pass]] = {}
ENTRY_POINT_GROUP = "hlopt.passes"
_BUILTINS_LOADED = False
_BUILTINS_LOADING = False
_LOAD_LOCK = threading.RLock()
_ENTRY_POINTS_LOADED = False

P = TypeVar("P", bound=type[Pass])


class PassOptionError(ValueError):
    """An unknown pass, or an option it does not have or cannot take (`option`: which, when one is at fault)."""

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option


def register(cls: P) -> P:
    """Class decorator: make a pass available by its `name`."""
    if not cls.name:
        raise PassOptionError(f"{cls.__qualname__} has no `name`")
    PASSES[cls.name] = cls
    return cls


#: hlopt's own module above `passes`: it registers the passes of the higher layers (the scheduler's) and
#: names every pipeline (`hlopt/pipelines.py`). Loaded with the built-in passes, as an installed plugin's entry
#: point would be, but without importlib.metadata: a pipeline of hlopt's own passes reads no distribution's
#: metadata, and a source checkout needs no install to see them.
OWN_PLUGIN_MODULE = "hlopt.pipelines"


def load_builtins() -> None:
    """Import this package's pass modules, then hlopt's own plugin module (once; another thread asking
    meanwhile waits for the whole set, and the loading thread's own nested lookups see what is loaded so far)."""
    global _BUILTINS_LOADED, _BUILTINS_LOADING
    if _BUILTINS_LOADED:
        return
    with _LOAD_LOCK:
        if _BUILTINS_LOADED or _BUILTINS_LOADING:
            return
        _BUILTINS_LOADING = True
        try:
            from hlopt import passes

            for mod in [*passes.BUILTIN_PASS_MODULES, OWN_PLUGIN_MODULE]:
                importlib.import_module(mod)
            _BUILTINS_LOADED = True
        finally:
            _BUILTINS_LOADING = False


def plugin_entry_points() -> list[EntryPoint]:
    """Every `hlopt.passes` entry point of the installed distributions, each value once (importlib.metadata
    is imported here: a pipeline of hlopt's own passes never needs it)."""
    from importlib.metadata import entry_points

    seen: set[str] = set()
    out = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.value not in seen:
            seen.add(ep.value)
            out.append(ep)
    return out


def _register_plugin(name: str, value: str, load: Callable[[], Any]) -> None:
    """Load one entry point (`load()`) and register the pass it names, unless one of that name is known."""
    try:
        obj = load()
    except Exception as e:  # noqa: BLE001 - a broken plugin is named, not a deep traceback
        raise PassOptionError(f"the pass plugin {name} = {value} (entry-point group "
                              f"{ENTRY_POINT_GROUP}) failed to load: {type(e).__name__}: {e}") from e
    if isinstance(obj, type) and issubclass(obj, Pass) and obj.name and obj.name not in PASSES:
        register(obj)


def _load_entry_points() -> None:
    """Import the passes registered through the `hlopt.passes` entry-point group (once)."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in plugin_entry_points():
        _register_plugin(ep.name, ep.value, ep.load)


def registered_passes() -> dict[str, type[Pass]]:
    """Every known pass by name: built-ins and plugins."""
    load_builtins()
    _load_entry_points()
    return dict(sorted(PASSES.items()))


def has_pass(name: str) -> bool:
    """Whether a pass of this name is known; installed plugins are looked for only when it is not one of
    hlopt's own passes."""
    load_builtins()
    if name not in PASSES:
        _load_entry_points()  # plugins are imported only when a name is not a built-in
    return name in PASSES


def get_pass(name: str) -> type[Pass]:
    """The pass class of this name."""
    if not has_pass(name):
        import difflib

        from hlopt.passes.framework.pipeline import NAMED_PIPELINES

        close = difflib.get_close_matches(name, [*PASSES, *NAMED_PIPELINES], n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        loaded = "; ".join(f"{file} registers {', '.join(names) or 'no pass'}" for file, names in _FROM_FILES.items())
        raise PassOptionError(f"unknown pass {name!r}{hint}" + (f" ({loaded})" if loaded else ""))
    return PASSES[name]


def pass_options(cls: type) -> list[dataclasses.Field]:
    """The options of a pass class: its dataclass fields set through the constructor (none for a
    plain class; state such as the fusion passes' `explanations` is not an option)."""
    if not dataclasses.is_dataclass(cls):
        return []
    return [f for f in dataclasses.fields(cls) if f.init]


def create_pass(name: str, **options: Any) -> Pass:
    """An instance of pass `name` with options (strings are converted to the field types)."""
    cls = get_pass(name)
    if not dataclasses.is_dataclass(cls):
        if options:
            raise PassOptionError(f"pass {name!r} takes no options")
        return cls()
    fields = {f.name: f for f in pass_options(cls)}
    hints = _option_hints(cls, False)
    kwargs = {}
    for key, value in options.items():
        if key not in fields:
            import difflib

            valid = ", ".join(fields) or "none"
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise PassOptionError(f"pass {name!r} has no option {key!r}{hint} (options: {valid})", option=key)
        try:
            kwargs[key] = _convert(value, hints.get(key, str), name, key)
            _validate(cls, key, kwargs[key], name, options[key])
            if key in _DEVICE_OPTIONS and isinstance(kwargs[key], str) and kwargs[key]:
                _check_device(name, key, kwargs[key])
        except PassOptionError as e:
            raise PassOptionError(str(e), option=key) from None
    return cls(**kwargs)


_DEVICE_OPTIONS = frozenset({"device"})
"""Options that name a GPU of the cost model (`priority-fusion{device=h200}`): checked when the pass is
made, so that a misspelt device is the user's one-line error, not a failure inside the pass."""


def _check_device(pass_name: str, key: str, value: str) -> None:
    """Refuse a device option naming neither a built-in GPU, a device spec file, nor a user cost model."""
    from hlopt.cost_model.devices import get_device
    from hlopt.cost_model.profile import user_cost_model

    try:
        if user_cost_model(value) is None:
            get_device(value)
    except (ValueError, OSError, TypeError) as e:
        raise PassOptionError(f"{pass_name}: option {key}={value!r} is not valid: {e}") from None


_VALIDATORS: dict[tuple[type, str], Any] = {}


@functools.lru_cache(maxsize=256)
def _option_hints(cls: type, include_extras: bool) -> dict[str, Any]:
    """The type hints of a pass class's options (`Annotated` constraints kept with `include_extras`), read
    once per class: a pipeline spec names the same passes many times."""
    return typing.get_type_hints(cls, include_extras=include_extras)


def _validate(cls: type, key: str, value: Any, pass_name: str, written: Any) -> None:
    """Check an option value with pydantic against the field's annotation, constraints included (a pass
    declares ranges as `overlap_limit: Annotated[int, Ge(1)] = 1`). A value that already is exactly what
    an unconstrained annotation names (`str`, a `Literal` member, a tuple of `str`) needs no check, and
    pydantic is imported only for the others."""
    hint = _option_hints(cls, True).get(key, Any)
    if _exactly_of(value, hint):
        return
    from pydantic import ConfigDict, TypeAdapter, ValidationError
    from pydantic.errors import PydanticSchemaGenerationError

    if (cls, key) not in _VALIDATORS:
        try:
            _VALIDATORS[cls, key] = TypeAdapter(hint, config=ConfigDict(arbitrary_types_allowed=True))
        except (PydanticSchemaGenerationError, TypeError):
            _VALIDATORS[cls, key] = None
    adapter = _VALIDATORS[cls, key]
    if adapter is None:
        return
    try:
        adapter.validate_python(value)
    except ValidationError as e:
        reason = "; ".join(err["msg"] for err in e.errors())
        raise PassOptionError(f"{pass_name}: option {key}={written!r} is not valid: {reason}") from None


_PLAIN_TYPES = (str, int, float, bool)


def _exactly_of(value: Any, hint: Any) -> bool:
    """Whether `value` is, with no conversion, of the unconstrained type `hint`: one of str/int/float/bool
    (the very type), a member of a `Literal` (equal and of the same type), or a homogeneous tuple of such.
    Anything else (`Annotated` constraints, unions, other types) is for pydantic to decide."""
    if hint in _PLAIN_TYPES:
        return type(value) is hint
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return any(type(value) is type(arg) and value == arg for arg in typing.get_args(hint))
    if origin is tuple:
        args = typing.get_args(hint)
        return (len(args) == 2 and args[1] is Ellipsis and type(value) is tuple
                and all(_exactly_of(item, args[0]) for item in value))
    return False


def _convert(value: Any, hint: Any, pass_name: str, key: str) -> Any:
    if not isinstance(value, str):
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value.lower() in ("none", "null", "") and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, pass_name, key)
            except PassOptionError:
                continue
        raise PassOptionError(f"{pass_name}: option {key}={value!r} does not fit {hint}")
    try:
        if hint is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return value.lower() in ("true", "1")
        if hint is int:
            return int(value)
        if hint is float:
            return float(value)
        if origin in (tuple, frozenset, list, set):
            elem = args[0] if args else str
            items = [_convert(v, elem, pass_name, key) for v in value.split(":") if v]
            return (origin or tuple)(items)
        return value
    except ValueError:
        raise PassOptionError(f"{pass_name}: option {key}={value!r} is not a valid {getattr(hint, '__name__', hint)}") from None


def load_plugin_file(path: str | Path) -> list[type[Pass]]:
    """Import a user's Python file; every pass it registers (or defines) becomes available."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"plugin file not found: {p}")
    load_builtins()
    mod_name = f"hlopt_user_{p.stem}_{abs(hash(str(p.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, p)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    before = set(PASSES)
    spec.loader.exec_module(module)
    found = [obj for obj in vars(module).values()
             if isinstance(obj, type) and issubclass(obj, Pass) and obj.name and obj.__module__ == mod_name]
    for cls in found:
        PASSES.setdefault(cls.name, cls)
    loaded = [PASSES[n] for n in sorted(set(PASSES) - before)] or found
    _FROM_FILES[str(p)] = [cls.name for cls in loaded]
    return loaded


_FROM_FILES: dict[str, list[str]] = {}
"""The passes each file given to `load_plugin_file` registered (named when a spec asks for an unknown pass)."""


def pass_origin(cls: type) -> str:
    """Where a pass class comes from, for messages: `class Liar in /path/liar.py` for a pass loaded from a
    file (its module has a generated name), else `class Liar in module pkg.mod`."""
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if file and cls.__module__.startswith("hlopt_user_"):
        return f"class {cls.__qualname__} in {file}"
    return f"class {cls.__qualname__} in module {cls.__module__}"


Factory = Callable[..., Pass]
