"""Reading user YAML so that every scalar means what the user wrote.

PyYAML implements YAML 1.1, whose implicit types surprise people: `time: 1:30:00` is the
integer 5400 (base 60), `on`/`no` are booleans, `0755` is octal, `2024-01-01` a date. Specs
are read with the YAML 1.2 core schema instead (null, true/false, decimal/0o/0x integers,
plain floats; everything else stays a string), and a key given twice in one mapping is an
error naming both lines rather than the last one silently winning.

A YAML error becomes one `SlurmgenError` line naming the file and the line.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from slurmgen.errors import SlurmgenError, show
from slurmgen.generate.written import WrittenFloat, WrittenInt


class Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 core schema's resolvers and no duplicate keys."""

    yaml_implicit_resolvers: dict = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise DuplicateKey(key, seen[key], line)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, first: int, second: int):
        super().__init__(f"key {show(key)} is given twice (lines {first} and {second})")
        self.line = second


_CORE = [
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        list("-+.0123456789"),
    ),
]
for _tag, _pattern, _first in _CORE:
    Yaml12Loader.add_implicit_resolver(_tag, re.compile(_pattern), _first)


def _int_12(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        value = WrittenInt(int(text[2:], 8))
    elif text.startswith("0x"):
        value = WrittenInt(int(text[2:], 16))
    else:
        value = WrittenInt(int(text, 10))  # 0755 is 755 in YAML 1.2, not octal
    value.written = text
    return value


def _float_12(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    value = WrittenFloat(loader.construct_yaml_float(node))
    value.written = loader.construct_scalar(node)
    return value


Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _int_12)
Yaml12Loader.add_constructor("tag:yaml.org,2002:float", _float_12)


class Yaml12Dumper(yaml.SafeDumper):
    """Quotes every string that a YAML 1.1 or a YAML 1.2 reader would take for another type."""


for _tag, _pattern, _first in _CORE:
    Yaml12Dumper.add_implicit_resolver(_tag, re.compile(_pattern), _first)
Yaml12Dumper.add_representer(WrittenInt, yaml.SafeDumper.represent_int)
Yaml12Dumper.add_representer(WrittenFloat, yaml.SafeDumper.represent_float)


def dump(data: object) -> str:
    return yaml.dump(data, Dumper=Yaml12Dumper, sort_keys=False, allow_unicode=True, width=1000)


def load(text: str, source: str, what: str) -> Any:
    """Parse YAML 1.2 text; errors name `source` and the line."""
    try:
        return yaml.load(text, Loader=Yaml12Loader)  # noqa: S506 (a SafeLoader subclass)
    except DuplicateKey as exc:
        raise SlurmgenError(f"{what}: {source}:{exc.line}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or "not valid YAML"
        raise SlurmgenError(f"{what}: {where}: {problem}") from None
