"""From a YAML file plus CLI overrides to one validated `JobSpec`, and back to YAML.

Every problem is collected before failing, each as `field.path: what is wrong (got X)`,
with a "did you mean" for misspelt keys.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from slurmgen.errors import SlurmgenError, show
from slurmgen.generate.spec import JobSpec
from slurmgen.generate.user_files import read_text


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a job spec file: a non-empty YAML mapping, scalars read as YAML 1.2 (see yaml12)."""
    from slurmgen.generate import yaml12  # PyYAML: only for a --config file and job.yaml

    data = yaml12.load(read_text(path, "config"), str(path), "config")
    if data is None:
        raise SlurmgenError(f"config: {path} holds no spec fields (it is empty or only comments)",
                            hint="give at least nodes: and gpus:, or leave out --config for the defaults")
    if not isinstance(data, dict):
        raise SlurmgenError(f"config: {path} must hold a mapping of spec fields, like 'nodes: 2' "
                            f"(got a {type(data).__name__})")
    return data


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """CLI flags over the file: scalars and lists replace, `env` and `container` merge per key."""
    merged = dict(base)
    for key, value in overrides.items():
        if key in ("env", "container") and isinstance(merged.get(key), dict) and isinstance(value, dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


# Names people bring from sbatch, torchrun or other launchers, and the field they mean.
SYNONYMS = {
    "gpus_per_node": "gpus", "ntasks_per_node": "gpus", "nproc_per_node": "gpus", "procs_per_node": "gpus",
    "num_nodes": "nodes", "nnodes": "nodes", "name": "job_name", "time_limit": "time",
    "output": "log_dir", "gres": "gpu_request", "port": "master_port", "master": "master_addr",
    "image": "container", "environment": "env", "cmd": "command",
}


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model class whose fields a validation error location refers to."""
    model: type[BaseModel] = JobSpec
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        candidates = [a for a in getattr(field.annotation, "__args__", (field.annotation,))
                      if isinstance(a, type) and issubclass(a, BaseModel)]
        if not candidates:
            return None
        model = candidates[0]
    return model


# The expected form, by pydantic error type and, where a field needs an example, by field.
_EXPECTED = {
    "int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
    "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "text",
    "dict_type": "a mapping", "model_type": "a mapping", "list_type": "a list",
}
_EXPECTED_FOR = {
    "env": "a mapping of NAME: value, e.g. env: {NCCL_DEBUG: INFO}",
    "container": "a mapping, e.g. container: {image: torch.sif, runtime: apptainer}",
    "command": "a list of words or one string, e.g. [python, train.py]",
    "setup": "a list of shell lines", "sbatch_extra": "a list of options, e.g. [--mail-type=END]",
    "container.mounts": "a list of SRC:DST[:FLAGS]",
}


def _shown(value: object) -> str:
    """A value as the user wrote it in YAML: true, null, 'text', [1, 2]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return show(value)


def _describe(error: Mapping[str, Any]) -> str:
    loc = tuple(error["loc"])
    path = ".".join(str(p) for p in loc) or "spec"
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        model = _model_at(loc)
        known = list(model.model_fields) if model else []
        key = str(loc[-1]).replace("-", "_")
        synonym = SYNONYMS.get(key) if model is JobSpec else None
        guess = [synonym] if synonym else difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"did you mean {guess[0]!r}?" if guess else f"known keys: {', '.join(known)}"
        return f"{path}: unknown key ({hint})"
    if kind == "missing":
        return f"{path}: required, but not given"
    if kind in _EXPECTED:
        message = f"expected {_EXPECTED_FOR.get(path, _EXPECTED[kind])}"
    elif error["msg"].startswith("Input should be "):  # a choice or a range: 'srun' or 'torchrun'
        rest = error["msg"].removeprefix("Input should be ")
        message = "expected " + ("a number " + rest if rest.startswith(("greater", "less")) else rest)
    else:
        message = error["msg"].removeprefix("Value error, ")
    if not loc:  # a rule across fields: its message names them, the input is the whole spec
        return f"{path}: {message}"
    return f"{path}: {message} (got {_shown(value)})"


def build_spec(values: Mapping[str, Any]) -> JobSpec:
    """Validate merged values into a JobSpec, or raise one SlurmgenError listing every problem."""
    try:
        return JobSpec.model_validate(dict(values))
    except ValidationError as exc:
        raise SlurmgenError(*[_describe(e) for e in exc.errors()]) from None


def spec_from_sources(config: Path | None, overrides: Mapping[str, Any]) -> JobSpec:
    """The spec a command works on: the YAML file (if any) with the CLI flags over it."""
    base = load_yaml(config) if config is not None else {}
    return build_spec(merge(base, overrides))


def dump_yaml(spec: JobSpec) -> str:
    """The resolved spec as YAML, ready for `--config` to reproduce the same scripts."""
    from slurmgen.generate import yaml12

    header = (f"# slurmgen job spec, resolved (digest {spec.digest()}).\n"
              f"# Reproduce: slurmgen create --config {spec.output_dir.rstrip('/')}/job.yaml --force\n")
    return header + yaml12.dump(spec.resolved())
