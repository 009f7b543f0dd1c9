"""The settings form <-> the API's GroupConfig, and the API's errors -> messages per field.

Pure functions: a form is what the browser posts (strings), a config is the JSON body of
`PUT /api/groups/{name}/config`. What the form alone can tell (a world size that is not a
number, an env line without '=', unbalanced quotes) is refused here with the same kind of
message the server gives; everything else is the server's to judge, and its 422 comes back
next to the field it names.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from slurmgen.contract.backends import DEFAULT_BACKEND
from slurmgen.contract.ports import DEFAULT_MASTER_PORT
from slurmgen.contract.strategies import DEFAULT_STRATEGY
from slurmgen.contract.warm import COLD

FIELDS = (
    "master",
    "world_size",
    "master_port",
    "backend",
    "strategy",
    "command",
    "workdir",
    "env",
    "max_restarts",
    "spare_nodes",
    "min_nodes",
    "restart_mode",
    "heartbeat_timeout",
    "stop_grace",
)
# Limits of a group's life, each its API field's name; empty: the server's default.
LIMITS = ("max_restarts", "spare_nodes", "min_nodes", "heartbeat_timeout", "stop_grace")
# API field -> form field, for the server's messages.
_API_FIELD = {
    "master": "master",
    "master_addr": "master",
    "world_size": "world_size",
    "master_port": "master_port",
    "backend": "backend",
    "strategy": "strategy",
    "argv": "command",
    "cwd": "workdir",
    "env": "env",
    "restart_mode": "restart_mode",
    **{f: f for f in LIMITS},
}
GENERAL = "_"


class FormErrors(ValueError):
    """Field -> message, for the fields the form itself could not turn into a config."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(errors.values()))
        self.errors = errors


def form_from_config(config: Mapping[str, Any]) -> dict[str, str]:
    """The form's text values for a saved config (what the settings page shows first)."""
    env = config.get("env") or {}
    return {
        "master": config.get("master_addr") or config.get("master") or "",
        "world_size": "" if config.get("world_size") is None else str(config["world_size"]),
        "master_port": str(config.get("master_port") or DEFAULT_MASTER_PORT),
        "backend": config.get("backend") or DEFAULT_BACKEND,
        "strategy": config.get("strategy") or DEFAULT_STRATEGY,
        "command": shlex.join(config.get("argv") or []),
        "workdir": config.get("cwd") or "",
        "env": "\n".join(f"{k}={v}" for k, v in env.items()),
        "restart_mode": config.get("restart_mode") or COLD,
        **{f: "" if config.get(f) is None else f"{config[f]:g}" for f in LIMITS},
    }


def posted(data: Mapping[str, str]) -> dict[str, str]:
    """The form's fields from a posted body (a missing one is empty)."""
    return {field: data.get(field, "") for field in FIELDS}


def _seconds(field: str, text: str, errors: dict[str, str]) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        errors[field] = f"{field}: expected a number of seconds, e.g. 30 or 2.5 (got {text!r})"
        return None
    return value


def _in_range(field: str, value: float | None, text: str, errors: dict[str, str]) -> float | None:
    """`value` within the bounds GroupConfig declares for `field` (models.py: one definition of
    them), else an error naming the field, the bounds and what was typed."""
    from slurmgen.coordinator.models import GroupConfig

    if value is None:
        return None
    bounds = {
        name: getattr(m, name)
        for m in GroupConfig.model_fields[field].metadata
        for name in ("ge", "le")
        if hasattr(m, name)
    }
    lo, hi = bounds.get("ge"), bounds.get("le")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        expected = (
            f"{lo:g} to {hi:g}"
            if lo is not None and hi is not None
            else f"at least {lo:g}"
            if lo is not None
            else f"at most {hi:g}"
        )
        errors[field] = f"{field}: expected {expected} (got {text.strip()!r})"
        return None
    return value


def _whole_number(field: str, text: str, errors: dict[str, str]) -> int | None:
    text = text.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        errors[field] = f"{field}: expected a whole number (got {text!r})"
        return None


def config_from_form(
    form: Mapping[str, str], nodes: Iterable[str], members: Iterable[str], saved: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The config body for a posted form; keeps the saved settings the form does not show.
    The master field is a node of the group (rank order starts there), a worker name (sent as
    the master so the server refuses it with its hint), or any other address ranks dial."""
    errors: dict[str, str] = {}
    body: dict[str, Any] = {
        k: v
        for k, v in (saved or {}).items()
        if k
        not in (
            "master",
            "master_addr",
            "world_size",
            "master_port",
            "backend",
            "strategy",
            "argv",
            "cwd",
            "env",
            "restart_mode",
            *LIMITS,
        )
    }
    master = form.get("master", "").strip()
    body["master"], body["master_addr"] = None, None
    if master in set(nodes) or master in set(members):
        body["master"] = master
    elif master:
        body["master_addr"] = master
    body["world_size"] = _whole_number("world_size", form.get("world_size", ""), errors)
    port = _whole_number("master_port", form.get("master_port", ""), errors)
    body["master_port"] = DEFAULT_MASTER_PORT if port is None else port
    body["backend"] = form.get("backend", DEFAULT_BACKEND).strip() or DEFAULT_BACKEND
    body["strategy"] = form.get("strategy", DEFAULT_STRATEGY).strip() or DEFAULT_STRATEGY
    body["restart_mode"] = form.get("restart_mode", COLD).strip() or COLD
    try:
        body["argv"] = shlex.split(form.get("command", ""))
    except ValueError as exc:
        errors["command"] = f"command: {exc} (quote words with ' or \")"
    body["cwd"] = form.get("workdir", "").strip() or None
    env: dict[str, str] = {}
    for number, line in enumerate(form.get("env", "").splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            errors["env"] = f"env line {number}: expected KEY=VALUE (got {line!r})"
            break
        env[key.strip()] = value
    body["env"] = env
    limits = {
        **{f: _whole_number(f, form.get(f, ""), errors) for f in ("max_restarts", "spare_nodes", "min_nodes")},
        **{f: _seconds(f, form.get(f, ""), errors) for f in ("heartbeat_timeout", "stop_grace")},
    }
    limits = {f: _in_range(f, v, form.get(f, ""), errors) for f, v in limits.items()}
    body.update({f: v for f, v in limits.items() if v is not None})  # empty: the server's default
    if errors:
        raise FormErrors(errors)
    return body


def _message(entry: Mapping[str, Any]) -> str:
    msg = str(entry.get("msg", entry))
    return msg.removeprefix("Value error, ")


def errors_from_response(status: int, payload: Any) -> dict[str, str]:
    """Field -> message from an API error: FastAPI's list of {loc, msg}, or one `detail` text
    (placed at the field it starts with, else shown above the form)."""
    detail = payload.get("detail") if isinstance(payload, Mapping) else payload
    errors: dict[str, str] = {}
    if isinstance(detail, list):
        for entry in detail:
            loc = (
                [str(part) for part in (entry.get("loc") or []) if not str(part).isdigit()]
                if isinstance(entry, Mapping)
                else []
            )
            field = next((_API_FIELD[p] for p in reversed(loc) if p in _API_FIELD), GENERAL)
            errors.setdefault(field, _message(entry) if isinstance(entry, Mapping) else str(entry))
        return errors or {GENERAL: f"the server refused the settings (HTTP {status})"}
    text = str(detail if detail is not None else f"HTTP {status}")
    first = text.split(" ", 1)[0].rstrip(":").split(".", 1)[0]
    return {_API_FIELD.get(first, GENERAL): text}
