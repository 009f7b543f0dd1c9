"""Every command's help, rendered as a user sees it, keeps its whole text.

Typer renders help strings as Rich markup, which ate "[default: out]" and left "Where to write
the scripts ." (issue 20 item 5): these tests walk the whole command tree, so a new command or
flag is checked without being listed here.
"""

from __future__ import annotations

import re

import pytest
import typer
from helpers import run

from slurmgen.cli import app, command_tree


def _commands(command, path=()):
    """(path, command) for the root, every group and every command under it."""
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


def _written_help(command) -> list[str]:
    """The help strings as written in the source (the tree Typer builds, before any escaping)."""
    return [text for holder in (command, *command.params) if (text := getattr(holder, "help", None))]


def _rendered(capsys, path: tuple[str, ...], command) -> str:
    if command.get_help_option(command.make_context("slurmgen", [], resilient_parsing=True)) is None:
        # `train` hands --help to the trainer's own parser: its Click help is rendered directly.
        parent = command_tree().make_context("slurmgen", list(path), resilient_parsing=True)
        command.get_help(command.make_context(path[-1], [], parent=parent, resilient_parsing=True))
        return capsys.readouterr().out
    code, out, err = run(capsys, *path, "--help")
    assert code == 0, err
    return out


PATHS = [path for path, _ in _commands(typer.main.get_command(app))]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "slurmgen")
def test_every_help_text_is_shown_whole(capsys, monkeypatch, path):
    monkeypatch.setenv("COLUMNS", "400")  # one line per option, so a written text is found as written
    command = dict(_commands(typer.main.get_command(app)))[path]
    shown = _rendered(capsys, path, dict(_commands(command_tree()))[path])
    assert "[]" not in shown and not re.search(r"\S \.(\s|$)", shown), shown
    for text in _written_help(command):
        for bracketed in re.findall(r"\[[^\]]*\]", text):
            assert bracketed in shown, f"{' '.join(path)}: {bracketed!r} of {text!r} is not shown:\n{shown}"


def test_the_walk_reaches_the_commands_the_issue_names():
    assert {
        ("create",),
        ("submit",),
        ("ranks",),
        ("plot",),
        ("serve",),
        ("agent",),
        ("workers",),
        ("group", "logs"),
        ("train",),
    } <= set(PATHS)


def test_create_help_says_where_the_scripts_go_by_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = run(capsys, "create", "--help")
    assert code == 0 and "Where to write the scripts [default: out]." in out
