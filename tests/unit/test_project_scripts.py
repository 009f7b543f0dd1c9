"""The project's own scripts and code lint clean, like the scripts it generates."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_project_scripts_pass_shellcheck(request):
    scripts = sorted(REPO.glob("scripts/**/*.sh")) + [REPO / ".ci" / "run"]
    assert scripts
    for script in scripts:
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script
    shellcheck = request.getfixturevalue("shellcheck")  # after `bash -n`, which runs without it
    result = subprocess.run([shellcheck, "-x", *map(str, scripts)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    try:
        import ruff  # noqa: F401  (installed by the test extra)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("ruff is not installed (the test extra has it: scripts/setup.sh --test)")
        pytest.skip("ruff is not installed")
    return subprocess.run([sys.executable, "-m", "ruff", *args], capture_output=True, text=True, cwd=REPO)


def test_the_python_code_has_no_unused_or_undefined_names():
    # ruff with the project's own configuration (pyproject.toml: pyflakes, syntax errors, the line length...).
    result = _ruff("check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout[-4000:]


def test_the_python_code_is_formatted():
    # One formatter, ruff format, with the same configuration (line length 120); `ruff format .` mends it.
    result = _ruff("format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout[-4000:]


def test_the_whole_package_type_checks():
    # mypy with pyproject.toml's [tool.mypy]: every module of slurmgen/.
    try:
        import mypy  # noqa: F401  (installed by the test extra)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("mypy is not installed (the test extra has it: scripts/setup.sh --test)")
        pytest.skip("mypy is not installed")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"], capture_output=True, text=True, cwd=REPO, timeout=240
    )
    assert result.returncode == 0, result.stdout[-4000:]


def test_no_test_module_imports_another():
    # What tests share lives in tests/helpers.py; a test module imported by another runs its
    # module-level code twice and ties two files' fixtures together.
    import ast

    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names if n.startswith("test_")]
    assert offenders == []


def test_no_two_test_modules_share_a_name():
    # tests/ has no __init__.py: pytest imports each test module by its file name alone, so a second
    # test_x.py anywhere under tests/ stops the whole run at collection ("import file mismatch").
    seen: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert [paths for paths in seen.values() if len(paths) > 1] == []


def test_the_wheel_lists_every_package_of_slurmgen():
    # setuptools packs the packages [tool.setuptools] names, no more: a package left off the list
    # (a subpackage added or moved) installs without its modules, while every test run from the
    # checkout passes. So the list is exactly slurmgen/'s packages, and the templates.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+: on 3.10 the other versions check it

    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    package = REPO / "slurmgen"
    found = {".".join(p.parent.relative_to(REPO).parts) for p in package.rglob("__init__.py")}
    assert sorted(listed) == sorted(found | {"slurmgen.templates"})
    assert len(listed) == len(set(listed))
    # A directory of modules without __init__.py would be no package, so not on the list either.
    assert {p.parent for p in package.rglob("*.py")} <= {p.parent for p in package.rglob("__init__.py")}
