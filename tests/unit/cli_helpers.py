"""Shared by the CLI unit tests: run `slurmgen` in-process and capture what it printed."""

from __future__ import annotations

import pytest

from slurmgen.cli import main


def run(capsys, *args):
    """`slurmgen ARGS` in-process: (exit code, stdout, stderr). main() must end in SystemExit."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err
