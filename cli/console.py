"""One rich Console for every table hlopt prints."""

from __future__ import annotations

from rich.console import Console

PIPED_WIDTH = 200
"""Columns of tables written to a pipe or file: rich would otherwise squeeze them into 80."""


def table_console() -> Console:
    """A Console as wide as the terminal, or `PIPED_WIDTH` columns when output is not a terminal. Markup is
    off: table cells and titles carry module, file and pass names (`[...]` in a path is text); a caller
    that styles its own words passes `markup=True` and escapes the rest (`rich.markup.escape`)."""
    console = Console(markup=False)
    return console if console.is_terminal else Console(width=PIPED_WIDTH, markup=False)
