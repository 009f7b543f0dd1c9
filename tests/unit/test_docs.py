"""The manual is checked like code (issue 25): the site builds in strict mode, the generated
reference matches the code, and every shell example in README.md and docs/ runs here.

A ```bash block runs as one script (`set -e -o pipefail`) in a fresh directory where
`examples/` is the repository's, with the venv first on PATH and HOME a temporary directory,
unless the line right above its fence is `<!-- illustrative: needs ... -->`, saying what it
needs that this machine lacks (a Slurm cluster, SSH hosts, a GPU...). Shell blocks under
another name (sh, shell, console) are refused, so none slips past.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
MARKER = re.compile(r"<!-- illustrative: needs \S.* -->")
FENCE = re.compile(r"^```(\S*)\s*$")
SHELL_ALIASES = {"sh", "shell", "console", "zsh", "shell-session"}


def manual_pages() -> list[Path]:
    """README.md and the hand-written pages (the generated reference holds no shell examples)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [p for p in pages if "reference" not in p.relative_to(REPO).parts]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None  # the line above the fence, when it is a comment

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = lines[i - 1].strip() if i and lines[i - 1].strip().startswith("<!--") else None
        found.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1 : end]) + "\n", above))
        i = end + 1
    return found


ALL_BLOCKS = [b for page in manual_pages() for b in blocks(page)]
BASH = [b for b in ALL_BLOCKS if b.lang == "bash"]
RUNNABLE = [b for b in BASH if b.marker is None]


# ---- shell examples ----------------------------------------------------------------------------
def test_every_shell_block_is_bash_and_every_marker_says_what_it_needs():
    assert len(RUNNABLE) >= 10, [b.id for b in RUNNABLE]
    others = [b.id for b in ALL_BLOCKS if b.lang in SHELL_ALIASES]
    assert not others, f"shell examples must be ```bash to be checked: {others}"
    bad = [f"{b.id}: {b.marker}" for b in BASH if b.marker is not None and not MARKER.fullmatch(b.marker)]
    assert not bad, f"a comment above a bash block must be <!-- illustrative: needs WHAT -->: {bad}"
    stray = [b.id for b in ALL_BLOCKS if b.lang != "bash" and b.marker and MARKER.fullmatch(b.marker)]
    assert not stray, f"the illustrative marker belongs above a bash block only: {stray}"


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_shell_example_runs(block, tmp_path):
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "home").mkdir()
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path / "home"),
        "COLUMNS": "120",
    }
    env.pop("SLURMGEN_REGISTRY", None)
    proc = subprocess.run(
        ["bash", "-c", "set -e -o pipefail\n" + block.text],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, f"{block.id} exited {proc.returncode}:\n{block.text}\n{proc.stdout}\n{proc.stderr}"


# ---- the generated reference -------------------------------------------------------------------
def generator():
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "scripts" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    return generator().render_all()


def test_the_committed_reference_is_current(reference):
    stale = [
        name
        for name, text in reference.items()
        if not (REPO / "docs" / "reference" / name).is_file()
        or (REPO / "docs" / "reference" / name).read_text() != text
    ]
    assert not stale, f"docs/reference/{stale} is stale: run python scripts/gen_reference.py and commit"


def test_the_reference_covers_every_command_field_variable_and_code(reference):
    from slurmgen.cli import app
    from slurmgen.contract import exitcodes
    from slurmgen.contract.envvars import VARS
    from slurmgen.generate.spec import json_schema

    gen = generator()
    paths = [" ".join(("slurmgen", *p)) for p, _ in gen.walk(typer.main.get_command(app))]
    assert len(paths) > 25 and all(f"`{p}`" in reference["commands.md"] for p in paths)
    for _, command in gen.walk(typer.main.get_command(app)):
        for opt in (o for p in command.params for o in p.opts if o.startswith("-")):
            assert f"`{opt}`" in reference["commands.md"], opt
    assert "`--heartbeat-every`" in reference["commands.md"]  # the trainer's own flags too
    assert all(f"| `{f}` |" in reference["spec.md"] for f in json_schema()["properties"])
    assert all(f"| `{name}` |" in reference["envvars.md"] for name in VARS)
    assert all(f"| {code} |" in reference["exit-codes.md"] for code in exitcodes.NAMES)


def test_the_reference_covers_every_name_and_member_of_the_python_api(reference):
    """Generated like the commands: every name `slurmgen.api` exports, and each public method and
    property of its classes, with its signature and a docstring (none is left undocumented)."""
    import inspect

    import slurmgen.api as api

    gen, page = generator(), reference["python-api.md"]
    assert set(gen.API_NAMES) == set(api.__all__)
    for name in api.__all__:
        obj = getattr(api, name)
        assert f"## `slurmgen.{name}`" in page and inspect.getdoc(obj), name
        for member, _, fn in gen.api_members(obj) if inspect.isclass(obj) else []:
            assert re.search(rf"^### `\w+\.{member}\b", page, re.M) and inspect.getdoc(fn), f"{name}.{member}"
    assert "### `handle.wait(timeout: float | None = None) -> str`" in page
    assert "def submit(fn: Callable[..., T], *args: Any, nodes: int = 1, gpus: int = 1," in page


# ---- the site ----------------------------------------------------------------------------------
def test_the_site_builds_in_strict_mode_and_loads_nothing_from_elsewhere(tmp_path):
    # Not -q: mkdocs counts warnings through its log, and -q drops them before they are counted,
    # so a broken link would pass.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(REPO / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pages = list((tmp_path / "site").rglob("*.html"))
    assert len(pages) >= 20
    outside = re.compile(r'<(script|img|iframe)[^>]*\ssrc="(https?:)?//|<link[^>]*\shref="(https?:)?//')
    loaded = [p.name for p in pages if outside.search(p.read_text())]
    assert not loaded, f"pages that load from another origin: {loaded}"


def test_readme_is_short_and_keeps_the_quick_start():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 210
    assert "bash scripts/quickstart.sh" in readme and "bash scripts/test.sh" in readme
    # GitHub renders the README outside the site, so mkdocs does not check its links: every
    # relative link must name a file of the repository.
    targets = re.findall(r"\]\((?!https?:)([^)#]+)", readme)
    assert len(targets) > 20
    missing = [t for t in targets if not (REPO / t).is_file()]
    assert not missing, missing


# ---- the map of the code -----------------------------------------------------------------------
# docs/architecture.md names every module of slurmgen/ (issue 32). Under "## The packages", each
# `###` section whose heading starts with a package's directory in backticks (`coordinator/`)
# names its modules relative to it (`state.py`, `web/routes.py`); a name that is not in that
# package is read from slurmgen/ (`runs/model.py` in the coordinator's section), and one whose
# first part is a directory of the repository (`benchmarks/bench_hang.py`, `slurmgen/cli.py`,
# `templates/run_slurm.sh.j2`) from the repository. A package's `__init__.py` is named by its
# directory. Elsewhere on the page names are read from slurmgen/ or the repository, and dotted
# names (`slurmgen.train`) must be a module or an attribute of one. Fenced blocks are drawings.
ARCHITECTURE = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "slurmgen"
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PATH_NAME = re.compile(r"[\w.-]+(/[\w.-]+)*(\.py|/)")
REPO_PATH = re.compile(r"[\w.-]+/([\w.-]+/?)*")
DOTTED = re.compile(r"slurmgen(\.\w+)+")


@dataclass(frozen=True)
class Part:
    base: Path  # the directory names are read from first
    text: str
    in_map: bool  # a section of "## The packages"


def page_parts(text: str) -> list[Part]:
    """The page cut at its headings, fenced blocks left out."""
    parts, base, in_map, chunk, fenced = [], PACKAGE, False, [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            continue
        elif line.startswith(("## ", "### ")):
            parts.append(Part(base, "\n".join(chunk), in_map))
            chunk, base = [], PACKAGE
            if line.startswith("## "):
                in_map = line.strip() == "## The packages"
            elif in_map and (m := re.match(r"### `([\w/]+/)`", line)):
                base = PACKAGE / m.group(1)
                chunk.append(f"`{m.group(1)}`")  # the heading names its package
        else:
            chunk.append(line)
    parts.append(Part(base, "\n".join(chunk), in_map))
    return parts


def named_paths(part: Part) -> Iterator[tuple[str, Path | None]]:
    """Each path named in the code spans of a part, with the file or directory it is (None: nothing)."""
    top = {p.name for p in REPO.iterdir()}
    for span in CODE_SPAN.findall(part.text):
        for token in span.split():
            if REPO_PATH.fullmatch(token) and token.split("/")[0] in top:
                candidates = [REPO / token]
            elif PATH_NAME.fullmatch(token):
                candidates = [part.base / token, PACKAGE / token]
            else:
                continue
            yield token, next((c for c in candidates if c.exists()), None)


def module_file(parts: list[str]) -> Path | None:
    for path in (REPO.joinpath(*parts).with_suffix(".py"), REPO.joinpath(*parts, "__init__.py")):
        if path.is_file():
            return path
    return None


def is_module_or_attribute(dotted: str) -> bool:
    """A module, or a name its source defines or imports (slurmgen.beat, slurmgen.contract.verdict.decide)."""
    *parent, last = dotted.split(".")
    if module_file(parent + [last]):
        return True
    source = module_file(parent)
    return source is not None and re.search(rf"\b{last}\b", source.read_text()) is not None


def test_the_architecture_page_names_every_module_and_only_what_exists():
    text = ARCHITECTURE.read_text()
    named: set[Path] = set()
    missing = [d.group(0) for d in DOTTED.finditer(text) if not is_module_or_attribute(d.group(0))]
    for part in page_parts(text):
        for token, path in named_paths(part):
            if path is None:
                missing.append(f"{token} (read from {part.base.relative_to(REPO)}/)")
            elif part.in_map:
                named.add(path.resolve())
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
    unnamed = [
        str(m.relative_to(REPO))
        for m in sorted(PACKAGE.rglob("*.py"))
        if m.resolve() not in named and not (m.name == "__init__.py" and m.parent.resolve() in named)
    ]
    assert not unnamed, f"modules of slurmgen/ named in no entry of docs/architecture.md's map: {unnamed}"


def test_every_screenshot_is_shown_by_a_page():
    """docs/screenshots/ held 11 pictures no page showed, taken of pages since changed: a
    screenshot is kept only while README.md or a page of docs/ shows it (retaken with its view)."""
    text = "\n".join(p.read_text() for p in [REPO / "README.md", *(REPO / "docs").rglob("*.md")])
    shown = set(re.findall(r"screenshots/([^)\s\"']+)", text))
    shots = {p.name for p in (REPO / "docs" / "screenshots").iterdir()}
    assert sorted(shots - shown) == [], "shown by no page of docs/ nor README.md: show it in a guide or delete it"
