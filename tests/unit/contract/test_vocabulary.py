"""The shared words are spelt in the contract only: the rest of slurmgen takes its constants.

Each test reads slurmgen's source with `ast` and fails on a literal that spells one of the
contract's words where it should name the contract's constant instead, so a new copy (which
drifts the day the word changes) is caught when it is written.
"""

import ast
import fnmatch
import re
import typing
from collections.abc import Iterator
from pathlib import Path

from slurmgen.contract import envvars, files, states
from slurmgen.coordinator import models

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


STATE_WORDS = (
    {s.value for s in states.State} | set(states.HEARTBEAT_WORD.values()) | set(states.RUN_RECORD_WORD.values())
)
# Homonyms: the same word in a format of its own, not a state. Each is spelt once, where its
# own constant is defined (or, for a message, where it is written), and may not spread.
HOMONYMS = {
    ("coordinator/web/timeline_svg.py", "running"): "a timeline segment: a rank that ran but took no step (RAN)",
    ("doctor/fabric_verdict.py", "failed"): "a doctor check's mark text (fabric_verdict.FAILED)",
    ("heal/attempts.py", "finished"): "a healing record's action after a run that ended well (FINISHED_ACTION)",
    ("jobs/query.py", "failed"): "the message's stand-in when sacct fails and says nothing on stderr",
    ("observe/goodput.py", "lost"): "goodput's breakdown part: time spent on steps done again (LOST_PART)",
}


def state_words(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """String constants that are exactly a state word and used as a value: prose (docstrings,
    f-string text), keys (a dict's, a subscript's, `.get(KEY)`) and Literal types are not."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and node.value in STATE_WORDS):
            continue
        up = parents.get(node)
        while isinstance(up, ast.Tuple) and isinstance(parents.get(up), ast.Subscript):
            up = parents[up]  # Literal["a", "b"]
        if not _key_or_prose(node, up):
            yield node.lineno, node.value


def _key_or_prose(node: ast.Constant, up: ast.AST | None) -> bool:
    if isinstance(up, (ast.JoinedStr, ast.Expr)):
        return True
    if isinstance(up, ast.Dict):
        return node in up.keys
    if isinstance(up, ast.Subscript):
        return up.slice is node or ast.unparse(up.value).endswith("Literal")
    return isinstance(up, ast.Call) and ast.unparse(up.func).endswith(".get") and up.args[:1] == [node]


def test_no_state_word_is_spelt_outside_the_contract():
    """Code says State.FAILED (or the mapping of its format), not "failed": a spelling of its own
    drifts from the contract unseen (launch's FAILED_STATES, the coordinator's comparisons)."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in modules("contract"):
        if path in STANDALONE:  # the node link's wire words: it runs without slurmgen
            continue
        for line, word in state_words(ast.parse(path.read_text())):
            found.setdefault((path.relative_to(PACKAGE).as_posix(), word), []).append(f"line {line}")
    spelt = {place: len(lines) for place, lines in found.items()}
    assert {place: n for place, n in spelt.items() if place not in HOMONYMS or n > 1} == {}, found
    assert set(HOMONYMS) - set(spelt) == set(), "a homonym no longer spelt: drop it from HOMONYMS"


def test_the_state_scan_sees_values_not_keys_or_prose():
    code = (
        'if s == "failed": x = ("running",)\nd = {"failed": "lost"}\nd.get("done", "idle")\n"""failed"""\n'
        'T = Literal["idle"]'
    )
    assert sorted(w for _, w in state_words(ast.parse(code))) == ["failed", "idle", "lost", "running"]


def test_the_coordinators_literal_states_are_the_contracts():
    """Literal types (pydantic and mypy need them spelt) list only the contract's words, and a
    worker's own `exited`."""
    for literal in (models.WorkerState, models.GroupState):
        assert set(typing.get_args(literal)) - {"exited"} <= {s.value for s in states.State}
