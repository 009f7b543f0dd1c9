"""The compiled templates, kept per user between runs: Jinja compiles every template it loads,
and that was ~70 ms of each `create` and `launch --dry-run` (10 templates, ~1400 code objects).

The templates stay the one source: Jinja's bytecode cache stores the compiled code with a
checksum of the template's text and rejects it as soon as that text changes (and when Jinja or
Python change: its magic header). The key adds what else the code depends on: the template's
directory (two checkouts keep apart) and the environment's syntax settings (a changed
`trim_blocks` compiles differently from the same text).

The directory, `$XDG_CACHE_HOME/slurmgen/templates` (default `~/.cache/...`), is the user's
own: created mode 0700 and used only while it is a real directory owned by this user and open
to nobody else, because what it holds is code that is run. A cache that cannot be used (no
home, a read-only or full disk, a foreign or damaged file) costs only the compilation: nothing
fails because of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

import jinja2
from jinja2.bccache import Bucket


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where the compiled templates of this user live (None without a home to put them in)."""
    base = environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):  # the XDG rule: a relative value is ignored
        home = environ.get("HOME") or ""
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return Path(base) / "slurmgen" / "templates"


def _private(path: Path) -> bool:
    """Is `path` a directory (not a link to one) of this user that nobody else may write to?"""
    try:
        info = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _settings(env: jinja2.Environment) -> str:
    """The environment's settings that shape the compiled code (filters and globals are looked
    up when a template runs, so they are not among them)."""
    return repr(
        (
            env.block_start_string,
            env.block_end_string,
            env.variable_start_string,
            env.variable_end_string,
            env.comment_start_string,
            env.comment_end_string,
            env.line_statement_prefix,
            env.line_comment_prefix,
            env.trim_blocks,
            env.lstrip_blocks,
            env.newline_sequence,
            env.keep_trailing_newline,
            env.optimized,
            env.autoescape,
            env.finalize is not None,
            sorted(env.extensions),
            env.is_async,
        )
    )


class TemplateCodeCache(jinja2.FileSystemBytecodeCache):
    """Jinja's file system bytecode cache in a private directory, keyed by source and settings,
    that never fails a render."""

    def __init__(self, directory: Path, source: str, env: jinja2.Environment):
        super().__init__(str(directory), "%s.jinja")
        self._salt = f"|{source}|{_settings(env)}"

    def get_cache_key(self, name: str, filename: str | None = None) -> str:
        return hashlib.sha1(f"{name}|{filename}{self._salt}".encode()).hexdigest()

    def load_bytecode(self, bucket: Bucket) -> None:
        if not _private(Path(self.directory)):
            return
        try:
            super().load_bytecode(bucket)
        except Exception:  # a damaged file (cut short, not Jinja's): compile instead
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        directory = Path(self.directory)
        with contextlib.suppress(OSError):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if _private(directory):
                super().dump_bytecode(bucket)


def attach(env: jinja2.Environment, source: str) -> None:
    """Give `env` (whose templates come from `source`) this user's cache, when there is one."""
    directory = cache_dir()
    if directory is not None:
        env.bytecode_cache = TemplateCodeCache(directory, source, env)
