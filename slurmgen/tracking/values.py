"""Checking what users hand to the API, and flattening hyperparameters. Pure.

Why check at all: a tracker that silently stores `"0.5"` or drops `None` shows a broken curve
days later; a clear error on the first `log` call costs one line. Numbers are accepted in every
form a training loop produces them (int, float, numpy scalars, 0-d tensors through `.item()`)
without importing numpy or torch here: this module is imported on every rank.

Hyperparameters are stored flat (`optimizer.lr: 0.001`), because that is how every tracker
shows and compares them and how a person greps for them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import MetricValueError, TrackingError, UnknownTypeError

METRIC_TYPES = ("train", "val", "test")
ARTIFACT_TYPES = ("checkpoint", "model", "dataset", "code", "config", "result", "other")
SCALARS = (str, int, float, bool, type(None))


def check_choice(field: str, value: object, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise UnknownTypeError(field, f"must be one of {', '.join(options)}", value)
    return value


def as_number(field: str, value: object) -> float | int:
    """The value as a plain int or float, or MetricValueError. bool is refused: True is not a loss."""
    if hasattr(value, "item") and not isinstance(value, (numbers.Number, str)):
        try:
            value = value.item()  # a 0-d tensor or array; a bigger one raises and is refused below
        except (TypeError, ValueError, RuntimeError):
            raise MetricValueError(field, "must be a single number, not an array", _describe(value)) from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise MetricValueError(field, "must be a number", value)
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value)


def _describe(value: object) -> object:
    shape = getattr(value, "shape", None)
    return f"{type(value).__name__} of shape {tuple(shape)}" if shape is not None else value


def check_metrics(metrics: object) -> dict[str, float | int]:
    """A non-empty mapping of metric name -> number, returned as plain Python values."""
    if not isinstance(metrics, Mapping):
        raise MetricValueError("metrics", "must be a dict of name -> number", metrics)
    if not metrics:
        raise MetricValueError("metrics", "must not be empty", metrics)
    out: dict[str, float | int] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key.strip():
            raise MetricValueError("metrics", "names must be non-empty strings", key)
        out[key] = as_number(f"metrics[{key!r}]", value)
    return out


def check_step(field: str, value: object, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 0:
        raise TrackingError(field, "must be a whole number >= 0", value)
    return int(value)


def check_epoch(value: object) -> float | int | None:
    if value is None:
        return None
    number = as_number("epoch", value)
    if not math.isfinite(number) or number < 0:
        raise MetricValueError("epoch", "must be a finite number >= 0", value)
    return number


def check_name(field: str, value: object) -> str:
    """A name people read: non-empty, one line."""
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise TrackingError(field, "must be a non-empty one-line string", value)
    return value.strip()


def _plain(value: Any) -> Any:
    """A leaf value as JSON/YAML can hold it: scalars as they are, sequences of scalars as
    lists, anything else as its str (a Path, an enum, a torch.dtype)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, SCALARS):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, SCALARS) for v in value):
        return list(value)
    return str(value)


def to_mapping(config: object) -> Mapping[str, Any]:
    """A dict, a dataclass instance or an argparse Namespace as a mapping."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return config
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    if hasattr(config, "__dict__") and not callable(config):
        return vars(config)
    raise TrackingError("config", "must be a dict, a dataclass or an argparse.Namespace", type(config).__name__)


def flatten(config: object, prefix: str = "") -> dict[str, Any]:
    """{'opt': {'lr': 1e-3}, 'layers': [1, 2]} -> {'opt.lr': 0.001, 'layers': [1, 2]}, sorted."""
    flat: dict[str, Any] = {}
    for key, value in to_mapping(config).items():
        name = f"{prefix}{key}"
        nested = isinstance(value, Mapping) or (dataclasses.is_dataclass(value) and not isinstance(value, type))
        if nested and value:
            flat.update(flatten(value, f"{name}."))
        elif nested:
            flat[name] = {}
        else:
            flat[name] = _plain(value)
    return dict(sorted(flat.items()))
