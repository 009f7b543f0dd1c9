"""Quoting for the two languages the generated scripts speak: bash, and sbatch's #SBATCH lines.

Every value interpolated into a template is bash-quoted by default (see `render.py`); only
text built here and marked `ShellCode` passes through as is. That keeps quoting in one
place, in Python, instead of split between Python and the templates.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable


class ShellCode(str):
    """Text that is meant to be shell code (a user's setup line, a built argument list)."""


_DOUBLE_SPECIAL = re.compile(r'([\\$`"])')


def quote(value: object) -> str:
    """One bash word that reaches the program literally, whatever the value holds.

    Like `shlex.quote`, but in the form that shellcheck reads as intended, since the
    generated scripts must lint clean for every input:
    - `$`, a backtick or a backslash: double quotes, those three and `"` escaped (in single quotes
      shellcheck takes `$x` for a forgotten expansion, SC2016, and `\'` for a failed
      escape, SC1003);
    - a leading `~`: a backslash-escaped tilde then the rest (a quoted tilde looks like a forgotten expansion, SC2088);
    - a comma or a leading `=`: always quoted (read as a mistaken array separator or index,
      SC2054 and SC2191).
    """
    if isinstance(value, ShellCode):
        return value
    if isinstance(value, bool):
        value = int(value)
    text = str(value)
    if text.startswith("~"):
        return "\\~" + quote(text[1:]) if len(text) > 1 else "\\~"
    if any(c in text for c in "$`\\"):
        return '"' + _DOUBLE_SPECIAL.sub(r"\\\1", text) + '"'
    quoted = shlex.quote(text)
    if quoted == text and ("," in text or text.startswith("=")):
        return f"'{text}'"
    return quoted


def always_quoted(value: object) -> ShellCode:
    """Like `quote`, but quoted even when plain (pyxis options, which hold commas and colons)."""
    text = quote(value)
    return ShellCode(text if text != str(value) else f"'{text}'")


def words(values: Iterable[object]) -> ShellCode:
    """Several bash words, each quoted: the body of an array or an argument list."""
    return ShellCode(" ".join(quote(v) for v in values))


def sbatch_value(value: object) -> ShellCode:
    """A value for an `#SBATCH --opt=VALUE` line, as sbatch's own parser reads it.

    sbatch (not bash) reads these lines: a double quote toggles quoting (so spaces need
    quotes), a backslash escapes the next character, and an unescaped `#` starts a comment
    even inside quotes. A newline cannot be expressed at all; the spec rejects it earlier.
    """
    text = str(value)
    if "\n" in text or "\r" in text:
        raise ValueError("an #SBATCH value cannot hold a line break")
    if text and all(c.isalnum() or c in "-_.,:/=+@%[]" for c in text):
        return ShellCode(text)
    escaped = "".join("\\" + c if c in '\\"#' else c for c in text)
    return ShellCode(f'"{escaped}"')
