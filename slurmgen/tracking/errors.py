"""Errors of the tracking API: one line each, naming the field and the value.

A mistake in a `run.log(...)` call is found on the first logging step, often after minutes of
start-up on many nodes; the message is then all a person has. So every error says which
argument was wrong and what it got, on one line, like the rest of slurmgen's errors. They are
`ValueError`s, so code that already guards against bad values catches them too.
"""

from __future__ import annotations


def show(value: object) -> str:
    """A value as it appears in an error line: repr, never spanning lines, cut at 80 characters."""
    text = repr(value).replace("\n", "\\n")
    return text if len(text) <= 80 else text[:77] + "..."


class TrackingError(ValueError):
    """Bad input to the tracking API. `field` names the argument, `value` is what was given."""

    def __init__(self, field: str, problem: str, value: object = None, *, has_value: bool = True):
        self.field, self.value = field, value
        message = f"{field}: {problem}" + (f" (got {show(value)})" if has_value else "")
        super().__init__(message)


class UnknownTypeError(TrackingError):
    """A metric type, artifact type or tracker name that is not one of the known ones."""


class MetricValueError(TrackingError):
    """A metric that is not a finite or infinite real number (a string, None, a list...)."""


class ArtifactFileError(TrackingError):
    """`add_file` of a path that is missing or not a regular file."""


class RunStateError(TrackingError):
    """A call that does not fit the run's state: logging after `finish`, resuming what is not there."""


class TrackerUnavailableError(TrackingError):
    """A tracker adapter was asked for but its package (the optional extra) is not installed."""
