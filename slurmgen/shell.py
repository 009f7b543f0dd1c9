"""Quoting for the two languages the generated scripts speak: bash, and sbatch's #SBATCH lines.

Every value interpolated into a template is bash-quoted by default (see `render.py`); only
text built here and marked `ShellCode` passes through as is. That keeps quoting in one
place, in Python, instead of split between Python and the templates.
"""

from __future__ import annotations

import re
import shlex
from typing import Iterable


class ShellCode(str):
    """Text that is meant to be shell code (a user's setup line, a built argument list)."""


_DOUBLE_SPECIAL = re.compile(r'([\\$`"])')


def quote(value: object) -> str:
    """One bash word that reaches the program literally, whatever the value holds.

    Like `shlex.quote`, except that text with `$` or a backtick is put in double quotes with
    those characters escaped: in single quotes shellcheck reads it as a forgotten expansion
    (SC2016), and the generated scripts must lint clean.
    """
    if isinstance(value, ShellCode):
        return value
    if isinstance(value, bool):
        value = int(value)
    text = str(value)
    if "$" not in text and "`" not in text:
        return shlex.quote(text)
    return '"' + _DOUBLE_SPECIAL.sub(r"\\\1", text) + '"'


def always_quoted(value: object) -> ShellCode:
    """Like `quote`, but quoted even when plain: shellcheck reads a bare comma in an array
    element as a mistaken separator (SC2054), and pyxis mount lists are comma-separated."""
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
