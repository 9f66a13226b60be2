"""A small reader for protobuf text format (`.txtpb`), enough for XLA's GPU target configs.

No schema is needed: a message becomes a dict; a field that occurs more than once becomes a list (use
`repeated(msg, key)` to read a field as a list whatever its count). Scalars are int, float, bool or str
(enum names such as `ACCELERATED_FEATURES` stay strings). Comments (`# ...`) are ignored, and both
`field { ... }` and `field: { ... }` / `field < ... >` message forms are accepted.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["parse_txtpb", "repeated", "TxtpbError"]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<comment>\#[^\n]*)
      | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<punct>[{}<>:;,\[\]])
      | (?P<word>[^\s{}<>:;,\[\]"'#]+)
    )""",
    re.X,
)
_CLOSE = {"{": "}", "<": ">"}


class TxtpbError(ValueError):
    """The text is not valid protobuf text format."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip():
                raise TxtpbError(f"unexpected text at offset {pos}: {text[pos:pos + 20]!r}")
            break
        pos = m.end()
        kind = m.lastgroup
        if kind != "comment" and kind is not None:
            out.append((kind, m.group(kind)))
    return out


def _scalar(kind: str, text: str) -> Any:
    if kind == "string":
        return bytes(text[1:-1], "utf-8").decode("unicode_escape")
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text.lower().endswith("f"):
        try:
            return float(text[:-1])
        except ValueError:
            pass
    return text


def _add(msg: dict[str, Any], key: str, value: Any) -> None:
    if key not in msg:
        msg[key] = value
    elif isinstance(msg[key], list) and key in msg.get("__lists__", ()):
        msg[key].append(value)
    else:
        msg[key] = [msg[key], value]
        msg.setdefault("__lists__", set()).add(key)


def _parse_message(toks: list[tuple[str, str]], i: int, close: str | None) -> tuple[dict[str, Any], int]:
    msg: dict[str, Any] = {}
    while i < len(toks):
        kind, text = toks[i]
        if close is not None and kind == "punct" and text == close:
            return msg, i + 1
        if kind == "punct" and text in ";,":
            i += 1
            continue
        if kind != "word":
            raise TxtpbError(f"expected a field name, got {text!r}")
        key, i = text, i + 1
        if i < len(toks) and toks[i] == ("punct", ":"):
            i += 1
        if i >= len(toks):
            raise TxtpbError(f"field {key!r} has no value")
        kind, text = toks[i]
        if kind == "punct" and text in _CLOSE:
            value, i = _parse_message(toks, i + 1, _CLOSE[text])
            _add(msg, key, value)
        elif kind == "punct" and text == "[":
            i += 1
            while toks[i] != ("punct", "]"):
                if toks[i] != ("punct", ","):
                    _add(msg, key, _scalar(*toks[i]))
                i += 1
            i += 1
        else:
            _add(msg, key, _scalar(kind, text))
            i += 1
    if close is not None:
        raise TxtpbError(f"missing {close!r}")
    return msg, i


def _strip(msg: Any) -> Any:
    if isinstance(msg, dict):
        msg.pop("__lists__", None)
        return {k: _strip(v) for k, v in msg.items()}
    if isinstance(msg, list):
        return [_strip(v) for v in msg]
    return msg


def parse_txtpb(text: str) -> dict[str, Any]:
    """Parse protobuf text format into nested dicts (repeated fields as lists)."""
    msg, _ = _parse_message(_tokens(text), 0, None)
    return _strip(msg)


def repeated(msg: dict[str, Any], key: str) -> list[Any]:
    """Field `key` of `msg` as a list (empty when absent)."""
    value = msg.get(key)
    if value is None:
        return []
    return value if isinstance(value, list) else [value]
