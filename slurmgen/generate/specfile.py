"""From a YAML file plus CLI overrides to one validated `JobSpec`, and back to YAML.

Every problem is collected before failing, each as `field.path: what is wrong (got X)`,
with a "did you mean" for misspelt keys.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import msgspec

from slurmgen.errors import SlurmgenError, show
from slurmgen.generate.spec import RULES, JobSpec, field_type, fields
from slurmgen.generate.user_files import read_text


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a job spec file: a non-empty YAML mapping, scalars read as YAML 1.2 (see yaml12)."""
    from slurmgen.generate import yaml12  # PyYAML: only for a --config file (and an odd job.yaml)

    data = yaml12.load(read_text(path, "config"), str(path), "config")
    if data is None:
        raise SlurmgenError(
            f"config: {path} holds no spec fields (it is empty or only comments)",
            hint="give at least nodes: and gpus:, or leave out --config for the defaults",
        )
    if not isinstance(data, dict):
        raise SlurmgenError(
            f"config: {path} must hold a mapping of spec fields, like 'nodes: 2' (got a {type(data).__name__})"
        )
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
    "gpus_per_node": "gpus",
    "ntasks_per_node": "gpus",
    "nproc_per_node": "gpus",
    "procs_per_node": "gpus",
    "num_nodes": "nodes",
    "nnodes": "nodes",
    "name": "job_name",
    "time_limit": "time",
    "output": "log_dir",
    "gres": "gpu_request",
    "port": "master_port",
    "master": "master_addr",
    "image": "container",
    "environment": "env",
    "cmd": "command",
}


# The expected form, by the type msgspec names in its message and, where a field needs an example, by field.
_EXPECTED = {
    "int": "a whole number",
    "bool": "true or false",
    "str": "text",
    "object": "a mapping",
    "array": "a list",
    "float": "a number",
}
_EXPECTED_FOR = {
    "env": "a mapping of NAME: value, e.g. env: {NCCL_DEBUG: INFO}",
    "container": "a mapping, e.g. container: {image: torch.sif, runtime: apptainer}",
    "command": "a list of words or one string, e.g. [python, train.py]",
    "setup": "a list of shell lines",
    "sbatch_extra": "a list of options, e.g. [--mail-type=END]",
    "container.mounts": "a list of SRC:DST[:FLAGS]",
    "sweep": "a grid {key: [values]} or a list of points [{key: value}], each value text, a number or true/false",
}
_BOUNDS = {">=": "greater than or equal to", ">": "greater than", "<=": "less than or equal to", "<": "less than"}
# msgspec's messages: "Expected `int` >= 1 - at `$[0]`", "Expected `int`, got `str`", "Invalid enum value 'x'".
_BOUND = re.compile(r"Expected `[^`]+` (>=|<=|>|<) (\S+)")
_TYPE = re.compile(r"Expected `([^`]+)`, got")
_AT = re.compile(r" - at `\$(.*)`$")


def _shown(value: object) -> str:
    """A value as the user wrote it in YAML: true, null, 'text', [1, 2]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return show(value)


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _type_problem(path: tuple, kind: Any, exc: msgspec.ValidationError, value: object) -> str:
    """One line for a value msgspec refused: where, the expected form, what was given."""
    text = str(exc)
    at = _AT.search(text)
    for index in re.findall(r"\[(\d+)\]", at.group(1).split("[...]")[0]) if at else ():  # name a list's item
        path, value = (*path, int(index)), value[int(index)] if isinstance(value, list) else value
    bound, named = _BOUND.match(text), _TYPE.match(text)
    words = [repr(w) for part in (kind, *get_args(kind)) if get_origin(part) is Literal for w in get_args(part)]
    if bound:
        number = bound.group(2).removesuffix(".0")
        expected = f"a number {_BOUNDS[bound.group(1)]} {number}"
    elif words:
        expected = ", ".join(words[:-1]) + " or " + words[-1]
    else:
        first = named.group(1).split(" | ")[0] if named else ""
        expected = _EXPECTED_FOR.get(_dotted(path), _EXPECTED.get(first, "a valid value"))
    return f"{_dotted(path)}: expected {expected} (got {_shown(value)})"


def _unknown(model: type[msgspec.Struct], path: tuple, key: object) -> str:
    known = list(model.__struct_fields__)
    name = str(key).replace("-", "_")
    synonym = SYNONYMS.get(name) if model is JobSpec else None
    guess = [synonym] if synonym else difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {guess[0]!r}?" if guess else f"known keys: {', '.join(known)}"
    return f"{_dotted((*path, key))}: unknown key ({hint})"


def _struct_in(kind: Any) -> type[msgspec.Struct] | None:
    """The struct a field holds (`container: Container | None`), checked field by field like the spec."""
    for part in (kind, *get_args(kind)):
        if isinstance(part, type) and issubclass(part, msgspec.Struct):
            return part
    return None


def _field_value(model: type[msgspec.Struct], name: str, raw: object, path: tuple) -> tuple[object, list[str]]:
    """One field's value, after its rules: (value, []) or (None, the problems)."""
    rules, kind = RULES[model], field_type(model, name)
    try:
        value = raw
        for rule in rules.before.get(name, ()):
            value = rule(value)
        nested = _struct_in(kind)
        if nested is not None and isinstance(value, Mapping):
            value, problems = _check(nested, value, path)
            if problems:
                return None, problems
        else:
            value = _converted(_plain(value), fields(model)[name].type)
        for rule in rules.after.get(name, ()):
            value = rule(value)
    except msgspec.ValidationError as exc:
        return None, [_type_problem(path, kind, exc, raw)]
    except ValueError as exc:
        return None, [f"{_dotted(path)}: {exc} (got {_shown(raw)})"]
    return value, []


def _plain(value: object) -> object:
    """Numbers that remember their text (yaml12) as plain numbers: msgspec takes no float subclass."""
    if isinstance(value, float):
        return float(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _converted(value: object, annotation: Any) -> object:
    """The value as written if it has the field's type, else read from its text (`nodes: "2"`,
    `exclusive: "true"`: a quoted number from YAML, an --env value); that reading's complaint is reported.
    Strict first: a sweep value "3" stays text where the lax reading would make it a number."""
    try:
        return msgspec.convert(value, annotation, strict=True)
    except msgspec.ValidationError:
        return msgspec.convert(value, annotation, strict=False)


def _check(model: type[msgspec.Struct], values: Mapping[str, Any], path: tuple = ()) -> tuple[Any, list[str]]:
    """Every field of `model` checked on its own, so that all problems are found in one pass; then the
    rules across fields, of which the first broken one is reported (they assume valid fields)."""
    problems: list[str] = []
    checked: dict[str, object] = {}
    for info in fields(model).values():
        if info.name not in values:
            if info.required:
                problems.append(f"{_dotted((*path, info.name))}: required, but not given")
            continue
        value, found = _field_value(model, info.name, values[info.name], (*path, info.name))
        problems += found
        checked[info.name] = value
    problems += [_unknown(model, path, key) for key in values if key not in model.__struct_fields__]
    if problems:
        return None, problems
    struct = model(**checked)
    for rule in RULES[model].across:
        try:
            rule(struct)
        except ValueError as exc:
            return None, [f"{_dotted(path) or 'spec'}: {exc}"]
    return struct, []


def build_spec(values: Mapping[str, Any]) -> JobSpec:
    """Validate merged values into a JobSpec, or raise one SlurmgenError listing every problem."""
    spec, problems = _check(JobSpec, values)
    if problems:
        raise SlurmgenError(*problems)
    return spec


def spec_from_sources(config: Path | None, overrides: Mapping[str, Any]) -> JobSpec:
    """The spec a command works on: the YAML file (if any) with the CLI flags over it."""
    base = load_yaml(config) if config is not None else {}
    return build_spec(merge(base, overrides))


def dump_yaml(spec: JobSpec) -> str:
    """The resolved spec as YAML, ready for `--config` to reproduce the same scripts."""
    from slurmgen.generate import yaml_writer

    header = (
        f"# slurmgen job spec, resolved (digest {spec.digest()}).\n"
        f"# Reproduce: slurmgen create --config {spec.output_dir.rstrip('/')}/job.yaml --force\n"
    )
    resolved = spec.resolved()
    text = yaml_writer.dump(resolved)
    if text is None:  # a shape or a string the plain writer leaves to PyYAML
        from slurmgen.generate import yaml12

        text = yaml12.dump(resolved)
    return header + text
