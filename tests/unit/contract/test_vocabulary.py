"""The shared words are spelt in the contract only: the rest of slurmgen takes its constants.

Each test reads slurmgen's source with `ast` and fails on a literal that spells one of the
contract's words where it should name the contract's constant instead, so a new copy (which
drifts the day the word changes) is caught when it is written.
"""

import ast
import fnmatch
import re
from collections.abc import Iterator
from pathlib import Path

from slurmgen.contract import envvars, files

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "slurmgen"

# "SLURMGEN_..." words that are not environment variables: the node link's here-document
# delimiter (nodelink/__init__.py) and the probe's output line tag (train/probe.py).
NOT_VARIABLES = {"SLURMGEN_LINK_AGENT", "SLURMGEN_PROBE "}
# nodelink/agent.py runs on nodes without slurmgen (embedded in the generated script), so it
# reads its token variable by name; test_every_slurmgen_variable_used_anywhere_is_declared
# keeps that name declared.
STANDALONE = {PACKAGE / "nodelink" / "agent.py": {envvars.LINK_TOKEN}}


def modules(outside: str) -> Iterator[Path]:
    """slurmgen's modules but those of `outside` (a path relative to slurmgen/)."""
    skip = PACKAGE / outside
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != skip and skip not in path.parents:
            yield path


def strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every string the code spells, with its line: constants (f-strings' pieces included) and
    keyword argument names (`dict(NAME=...)` spells NAME)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.keyword) and node.arg:
            yield node.lineno, node.arg


def test_no_slurmgen_variable_is_spelt_outside_envvars():
    found = []
    for path in modules("contract/envvars.py"):
        allowed = NOT_VARIABLES | STANDALONE.get(path, set())
        for line, text in strings(ast.parse(path.read_text())):
            if text.startswith("SLURMGEN_") and text not in allowed:
                found.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert found == [], "use slurmgen.contract.envvars' constant"


def test_the_scan_sees_fstrings_and_keywords():
    tree = ast.parse('f"SLURMGEN_{x}"; env.update(SLURMGEN_TRACK="1"); f"see {os.environ[\'SLURMGEN_GROUP\']}"')
    assert {t for _, t in strings(tree) if t.startswith("SLURMGEN_")} == {
        "SLURMGEN_",
        "SLURMGEN_TRACK",
        "SLURMGEN_GROUP",
    }


def test_every_name_code_uses_is_a_declared_variable():
    constants = {v for k, v in vars(envvars).items() if k.isupper() and isinstance(v, str)}
    assert constants <= set(envvars.VARS)


def test_heartbeat_and_stack_files_are_named_in_the_contract_only():
    """The rank's heartbeat and stack dump names reach Python and the templates from contract/files.py."""
    spelt = re.compile(r"(rank|stack)-(%05d|\{[^}]*:05d\}|\*)\.(json|txt)")
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for path in [*modules("contract"), *(ROOT / "templates").glob("*.j2")]
        for m in spelt.finditer(path.read_text())
    ]
    assert found == []
    assert files.HEARTBEAT_NAME % 7 == "rank-00007.json" and files.STACK_NAME % 7 == "stack-00007.txt"
    assert fnmatch.fnmatch(files.HEARTBEAT_NAME % 12345, files.HEARTBEAT_GLOB)
