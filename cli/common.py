"""What every `hlopt` verb shares: reading inputs, one module at a time with partial results, clear errors,
atomic writes, validated numbers and deprecated flag names."""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["load_inputs", "is_collection", "ModuleOutcome", "run_each", "report_failures", "write_atomic",
           "internal_error", "positive_int", "nonnegative_int", "warn_deprecated", "REPORT_TO", "warn",
           "output_error", "user_os_error", "atomic_path", "written_files", "note_written", "start_xla_quietly", "XLA_LOGS_ENV"]

REPORT_TO = "the hlopt issue tracker (with the command line and the module file)"
"""Where internal errors should be reported."""


def warn(message: str) -> None:
    """One warning line on stderr."""
    print(f"hlopt: warning: {message}", file=sys.stderr)


# ----------------------------------------------------------------------------- inputs


def _decode(data: bytes, name: str) -> str:
    """The text of an HLO file, or a one-line error for binary data."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SystemExit(f"hlopt: {name}: not HLO text (binary data: byte 0x{data[e.start]:02x} at offset "
                         f"{e.start} is not UTF-8)") from None


def _read(path: Path) -> str:
    try:
        return _decode(path.read_bytes(), str(path))
    except PermissionError:
        raise SystemExit(f"hlopt: {path}: permission denied") from None
    except OSError as e:
        raise SystemExit(f"hlopt: {path}: cannot read ({e.strerror or e})") from None


def _looks_like_hlo(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4096).lstrip().startswith(b"HloModule")
    except OSError:
        return False


def is_collection(source: str) -> bool:
    """True when `source` names a dump directory (several modules) rather than one file or stdin."""
    return source != "-" and Path(source).is_dir()


def load_inputs(source: str) -> list[tuple[str, str]]:
    """(name, text) of each module: a file, '-' for stdin, or every HLO module in an XLA dump directory.

    Raises SystemExit with one line for a missing, unreadable or binary file and for a directory without HLO.
    """
    if source == "-":
        return [("stdin", _decode(sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer")
                                  else sys.stdin.read().encode(), "stdin"))]
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".txt", ".hlo") and _looks_like_hlo(p))
        if not files:
            raise SystemExit(f"hlopt: no HLO modules (.txt/.hlo files starting with 'HloModule') in directory {path}")
        return [(str(p), _read(p)) for p in files]
    if not path.exists():
        raise SystemExit(f"hlopt: no such file: {path}")
    return [(str(path), _read(path))]


# ----------------------------------------------------------------------------- errors


def internal_error(error: BaseException, module: str | None = None, pass_name: str | None = None) -> str:
    """The one-line message of an unexpected error: what failed, where, and where to report it."""
    where = []
    if pass_name:
        where.append(f"pass {pass_name!r}")
    if module:
        where.append(f"module {module}")
    at = f" in {' on '.join(where)}" if where else ""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    owner = _pass_owner(pass_name)
    report = (f"report it to the author of {owner}" if owner else f"this is a bug in hlopt: please report it in {REPORT_TO}")
    return (f"hlopt: internal error{at}: {type(error).__name__}{': ' + first if first else ''} ({report}; "
            "HLOPT_TRACEBACK=1 prints the traceback)")


def _pass_owner(pass_name: str | None) -> str | None:
    """Where a pass that is not hlopt's own (a plugin) comes from (`class Liar in /path/liar.py`), else None."""
    if not pass_name:
        return None
    from hlopt.passes.framework.registry import PASSES, pass_origin

    cls = PASSES.get(pass_name.split("{", 1)[0])
    module = getattr(cls, "__module__", "hlopt.")
    return None if module.startswith("hlopt.") else pass_origin(cls)


def _pass_failure_message(error: Exception, module: str) -> str:
    """A PassFailure as the CLI reports it: the pass's reason, the module, and whom to tell."""
    reason_lines = str(error.reason).strip().splitlines() or [""]  # type: ignore[attr-defined]
    pass_name = error.pass_name  # type: ignore[attr-defined]
    owner = _pass_owner(pass_name)
    report = (f"report it to the author of {owner}" if owner else f"a bug in hlopt: please report it in {REPORT_TO}")
    ran = ", ".join(error.history[-6:]) or "none"  # type: ignore[attr-defined]
    return (f"hlopt: pass {pass_name!r} failed on module {module}: {reason_lines[0]} (passes before it: {ran}; "
            f"{report})" + ("\n" + "\n".join(reason_lines[1:]) if len(reason_lines) > 1 else ""))


@dataclass
class ModuleOutcome:
    """What one module of an input gave: its result, or the error that stopped it."""

    name: str
    result: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True if the module was processed."""
        return self.error is None


def _message(error: BaseException, name: str) -> str:
    from hlopt.passes.framework.pipeline import PassFailure

    user = user_os_error(error)
    if user is not None:
        return user
    if isinstance(error, SystemExit):
        return str(error.code) if error.code not in (None, 0, 1) else f"hlopt: {name} failed"
    if isinstance(error, PassFailure):
        return _pass_failure_message(error, name)
    return internal_error(error, module=name)


def run_each(inputs: list[tuple[str, str]], work: Callable[[str, str], Any], collection: bool,
             fail_fast: bool = False) -> list[ModuleOutcome]:
    """Run `work(name, text)` on every module; errors become outcomes (a single module's error is raised
    as one line, as is the first of a collection's with `fail_fast`)."""
    outcomes = []
    for name, text in inputs:
        try:
            outcomes.append(ModuleOutcome(name, work(name, text)))
        except (BrokenPipeError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - reported per module, one line each
            if os.environ.get("HLOPT_TRACEBACK"):
                raise
            if not collection or fail_fast:
                raise SystemExit(_message(e, name)) from None
            outcomes.append(ModuleOutcome(name, error=_message(e, name)))
        except SystemExit as e:
            if not collection or fail_fast:
                raise
            outcomes.append(ModuleOutcome(name, error=_message(e, name)))
    return outcomes


def report_failures(outcomes: list[ModuleOutcome]) -> int:
    """List the failed modules on stderr; the exit status (1 if any failed)."""
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return 0
    print(f"hlopt: {len(failed)} of {len(outcomes)} module(s) failed:", file=sys.stderr)
    for o in failed:
        print(f"  {o.name}: {o.error.splitlines()[0].removeprefix('hlopt: ')}", file=sys.stderr)
    return 1


def output_error(path: str | Path, error: OSError) -> SystemExit:
    """The one-line user error of an OS error on an output path: the path and the reason
    (`raise output_error(path, e) from None`)."""
    reason = error.strerror or str(error)
    if isinstance(error, IsADirectoryError) or (Path(path).is_dir() and not isinstance(error, PermissionError)):
        reason = "is a directory"
    return SystemExit(f"hlopt: cannot write {path}: {reason}")


def user_os_error(error: BaseException) -> str | None:
    """The one line of an OS error on a path the user gave (an output folder under /proc, a full disk), or
    None for anything else: an OS error on a file of hlopt's own installation stays an internal error."""
    if not isinstance(error, OSError) or not getattr(error, "filename", None):
        return None
    filename = str(error.filename)
    try:
        own = Path(filename).resolve().is_relative_to(_INSTALLATION)
    except (OSError, ValueError):
        own = False
    if own:
        return None
    return f"hlopt: {filename}: {error.strerror or error}"


_INSTALLATION = Path(__file__).resolve().parent.parent
"""The folder holding hlopt's subpackages: OS errors on files inside it are hlopt's."""


# ----------------------------------------------------------------------------- XLA's start-up logs

XLA_LOGS_ENV = "HLOPT_XLA_LOGS"
"""Set (to anything but 0) to see XLA's and the plugins' start-up logs, as `--verbose` does."""

_STARTUP_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} [\d:. ]+\d+ [\w.]+:\d+\] ")
"""Lines of XLA's start-up that are not the user's business: absl's banner and INFO-level log lines (the
CUDA plugin's `cudart_stub.cc ... Could not find cuda drivers` on a machine without a GPU). Warnings,
errors and anything else are passed on."""


def start_xla_quietly(verbose: bool = False) -> None:
    """Import jax and start its backends with XLA's start-up noise kept out of the terminal (unless `verbose`
    or $HLOPT_XLA_LOGS). C++ libraries log to file descriptor 2 directly, so meanwhile it is a pipe read by a
    forked filter process, which passes on every line that is not noise as it comes: a fatal error
    (`F... Unknown flag in XLA_FLAGS`, then abort) still reaches the terminal, since the filter outlives
    this process and drains the pipe."""
    if (verbose or os.environ.get(XLA_LOGS_ENV, "0") not in ("", "0") or "jax" in sys.modules
            or not hasattr(os, "fork")):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the filter: its fd 2 is the terminal's
        os.close(write_end)
        try:
            _forward_filtered(read_end, 2)
        finally:
            os._exit(0)
    os.close(read_end)
    saved = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        import jax

        jax.devices()
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last write end closes: the filter drains it and exits
        os.close(saved)
        os.waitpid(pid, 0)


def _forward_filtered(source: int, target: int) -> None:
    """Copy the lines read from fd `source` to fd `target`, start-up noise left out, until end of file."""
    pending = b""
    while True:
        chunk = os.read(source, 65536)
        pending += chunk
        lines = pending.split(b"\n")
        pending = lines.pop() if chunk else b""
        if not chunk and lines and lines[-1] == b"":
            lines.pop()
        kept = [line + b"\n" for line in lines if not _STARTUP_NOISE.match(line.decode("utf-8", "replace"))]
        if kept:
            os.write(target, b"".join(kept))
        if not chunk:
            return


# ----------------------------------------------------------------------------- outputs

_WRITTEN: list[str] = []


def written_files() -> list[str]:
    """The files this process has written through `write_atomic` and `atomic_path`, in order (what an
    interrupted run reports)."""
    return list(_WRITTEN)


def note_written(path: str | Path) -> None:
    """Record a file written another way than `write_atomic` (a CSV written row by row)."""
    if str(path) not in _WRITTEN:
        _WRITTEN.append(str(path))


def _umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same directory and a rename, so that a failed
    run never leaves a half-written file."""
    path = Path(path)
    if path.is_dir():
        raise SystemExit(f"hlopt: cannot write {path}: is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise output_error(path, e) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600: give what open(path, "w") would
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise output_error(path, e) from None
        raise
    _WRITTEN.append(str(path))


def atomic_path(path: str | Path, write: Callable[[str], None]) -> None:
    """Let `write(tmp_path)` produce a file (a plot, a trace), then rename it onto `path`."""
    path = Path(path)
    if path.is_dir():
        raise SystemExit(f"hlopt: cannot write {path}: is a directory")
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(str(tmp))
        os.replace(tmp, path)
    except OSError as e:
        raise output_error(path, e) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the folder itself could not be written
    _WRITTEN.append(str(path))


# ----------------------------------------------------------------------------- argument types


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _bounded_int(text, 1)


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _bounded_int(text, 0)


def _bounded_int(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} is out of range (must be at least {low})")
    return value


def warn_deprecated(args: argparse.Namespace, old_dest: str, new_dest: str, old_flag: str, new_flag: str,
                    convert: Callable[[Any], Any] = lambda v: v) -> None:
    """Move a deprecated flag's value onto its new name, with a warning."""
    value = getattr(args, old_dest, None)
    if value is None:
        return
    warn(f"{old_flag} is deprecated; use {new_flag}")
    setattr(args, new_dest, convert(value))
