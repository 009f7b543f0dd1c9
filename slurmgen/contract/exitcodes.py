"""Exit codes: the one contract between the trainer, the generated scripts, the launchers,
the coordinator and the CLI.

Import-free on purpose: every rank, the node bootstrap and `slurmgen --help` import it.
A code that must appear inside a bash template is passed to the template from here, never
spelt there as a literal.
"""

OK = 0
# A run (a rank, a node, a job) failed; the message says which and why.
FAILED = 1
# Bad input: a flag, a spec field, a path. Nothing was started and nothing half-written.
BAD_INPUT = 2
# EX_TEMPFAIL in sysexits.h, "temporary failure, the user is invited to retry": the trainer
# wrote a checkpoint after a preemption signal and wants to be run again. Not a signal code
# (128+N), not Python's 1 or argparse's 2, and it means exactly "run me again".
PREEMPTED = 75
# As timeout(1) reports a time-out: a rank whose heartbeat went stale, a node that never
# showed up before the start timeout.
HUNG = 124
# As a shell reports a command it could not find (bash: `command not found`, or a path that
# does not exist): the program never started.
NOT_FOUND = 127
# 128 + SIGINT / SIGTERM, as a shell reports a process ended by that signal.
INTERRUPTED = 130
TERMINATED = 143
# As ssh(1) reports a connection that failed or was lost.
LOST = 255

NAMES = {
    OK: "ok",
    FAILED: "failed",
    BAD_INPUT: "bad input",
    PREEMPTED: "preempted",
    HUNG: "hung",
    NOT_FOUND: "command not found",
    INTERRUPTED: "interrupted",
    TERMINATED: "terminated",
    LOST: "lost",
}


def by_signal(code: int) -> bool:
    """Whether the process was ended by a signal: negative as Python reports it, 128+N as a shell does."""
    return code < 0 or 128 < code < 160


def describe(code: int) -> str:
    """A short word for an exit code: 'preempted', 'killed by signal 9', 'exit 3'."""
    if code in NAMES:
        return NAMES[code]
    if by_signal(code):
        return f"killed by signal {abs(code) if code < 0 else code - 128}"
    return f"exit {code}"


def with_meaning(code: int) -> str:
    """An exit code with its meaning when it has one: "143 (killed by signal 15)", "75
    (preempted)", but "3", not "3 (exit 3)"."""
    meaning = describe(code)
    return str(code) if meaning == f"exit {code}" else f"{code} ({meaning})"
