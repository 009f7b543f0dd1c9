"""The one error type users see.

Expected failures (bad input, a missing file, a refused host key) raise `SlurmgenError`;
the CLI prints each problem on one line and exits with `exit_code` without a traceback.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from slurmgen.contract import exitcodes

EXIT_OK = exitcodes.OK
EXIT_RUN_FAILED = exitcodes.FAILED
EXIT_BAD_INPUT = exitcodes.BAD_INPUT


class SlurmgenError(Exception):
    """An error the user can act on: one or more problems, an optional hint, an exit code."""

    def __init__(self, *problems: str, hint: str | None = None, exit_code: int = EXIT_BAD_INPUT):
        if not problems:
            raise ValueError("SlurmgenError needs at least one problem")
        super().__init__(problems[0])
        self.problems = list(problems)
        self.hint = hint
        self.exit_code = exit_code

    def lines(self) -> list[str]:
        """The message as printed: one line a problem, the hint after the last one."""
        lines = [p.replace("\n", "\\n") for p in self.problems]
        if self.hint:
            lines[-1] = f"{lines[-1]} (hint: {self.hint})"
        return lines

    def __str__(self) -> str:
        return "; ".join(self.lines())


def show(value: object) -> str:
    """How a bad value appears inside an error line: repr-like, never spanning lines."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."
