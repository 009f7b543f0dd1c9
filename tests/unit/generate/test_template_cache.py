"""The per-user cache of compiled templates: used when safe, never stale, never a failure."""

import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from slurmgen.generate.template_cache import TemplateCodeCache, cache_dir

REPO = Path(__file__).resolve().parents[3]


def _env(directory: Path, source: str = "here", **settings) -> tuple[jinja2.Environment, TemplateCodeCache]:
    env = jinja2.Environment(loader=jinja2.DictLoader({}), **settings)
    cache = TemplateCodeCache(directory, source, env)
    return env, cache


def _cached(cache: TemplateCodeCache, env: jinja2.Environment, text: str) -> bool:
    """Would `env` get the code of a template with this text from the cache instead of compiling it?"""
    return cache.get_bucket(env, "t.j2", None, text).code is not None


def _store(cache: TemplateCodeCache, env: jinja2.Environment, text: str) -> None:
    bucket = cache.get_bucket(env, "t.j2", None, text)
    bucket.code = env.compile(text, "t.j2")
    cache.set_bucket(bucket)


def test_compiled_code_is_kept_in_a_private_directory_and_used_again(tmp_path):
    env, cache = _env(tmp_path / "templates")
    _store(cache, env, "{{ x }}")
    assert (tmp_path / "templates").stat().st_mode & 0o777 == 0o700
    assert _cached(cache, env, "{{ x }}")
    env.bytecode_cache = cache
    env.loader = jinja2.DictLoader({"t.j2": "{{ x }}"})
    assert env.get_template("t.j2").render(x=3) == "3"


def test_a_changed_template_or_other_settings_or_another_checkout_are_compiled_afresh(tmp_path):
    env, cache = _env(tmp_path)
    _store(cache, env, "{{ x }}\n")
    assert not _cached(cache, env, "{{ y }}\n")  # the text changed
    trimmed, trimmed_cache = _env(tmp_path, trim_blocks=True)
    assert not _cached(trimmed_cache, trimmed, "{{ x }}\n")  # the same text compiles differently
    other, other_cache = _env(tmp_path, source="another checkout")
    assert not _cached(other_cache, other, "{{ x }}\n")


def test_a_directory_others_may_write_to_is_not_used(tmp_path):
    shared = tmp_path / "templates"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    env, cache = _env(shared)
    _store(cache, env, "{{ x }}")
    assert list(shared.iterdir()) == []  # nothing written: what is read from here is run
    shared.chmod(0o700)
    _store(cache, env, "{{ x }}")
    shared.chmod(0o777)  # someone opened it since
    assert not _cached(cache, env, "{{ x }}")


def test_damaged_or_unwritable_caches_only_cost_the_compilation(tmp_path):
    env, cache = _env(tmp_path / "templates")
    _store(cache, env, "{{ x }}")
    for path in (tmp_path / "templates").iterdir():
        path.write_bytes(path.read_bytes()[:20])  # cut short
    assert not _cached(cache, env, "{{ x }}")
    (tmp_path / "file").write_text("")
    env, cache = _env(tmp_path / "file" / "templates")  # cannot be created
    _store(cache, env, "{{ x }}")
    assert not _cached(cache, env, "{{ x }}")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"XDG_CACHE_HOME": "/c", "HOME": "/h"}, "/c/slurmgen/templates"),
        ({"XDG_CACHE_HOME": "", "HOME": "/h"}, "/h/.cache/slurmgen/templates"),
        ({"XDG_CACHE_HOME": "relative", "HOME": "/h"}, "/h/.cache/slurmgen/templates"),  # XDG: ignored
        ({}, None),
        ({"HOME": "relative"}, None),
    ],
)
def test_the_cache_is_the_users_own(environ, expected):
    found = cache_dir(environ)
    assert (None if found is None else str(found)) == expected


# `slurmgen ...` that reports on stderr how many templates Jinja compiled.
COUNTING = (
    "import runpy, sys, jinja2\n"
    "compile_ = jinja2.Environment.compile\n"
    "def counted(self, *args, **kwargs):\n"
    "    counted.n += 1\n"
    "    return compile_(self, *args, **kwargs)\n"
    "counted.n = 0\n"
    "jinja2.Environment.compile = counted\n"
    "sys.argv = ['slurmgen', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('slurmgen', run_name='__main__')\n"
    "finally:\n    print('COMPILED', counted.n, file=sys.stderr)\n"
)


def test_create_compiles_its_templates_once_and_writes_the_same_scripts(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", COUNTING, "create", "--nodes", "2", "--gpus", "4", "--dry-run"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env, check=True)
    stored = sorted(p.name for p in (tmp_path / "cache" / "slurmgen" / "templates").iterdir())
    again = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env, check=True)
    assert "COMPILED 0" not in first.stderr and "COMPILED 0" in again.stderr, (first.stderr, again.stderr)
    assert stored and again.stdout == first.stdout
    assert sorted(p.name for p in (tmp_path / "cache" / "slurmgen" / "templates").iterdir()) == stored
