"""job.yaml written without importing PyYAML, byte for byte as yaml12.dump writes it.

PyYAML is ~15 ms of imports, which every `create` paid only to write job.yaml (it reads YAML
only for a --config file). A spec's values are few shapes: a mapping of scalars, lists of
scalars and mappings of the same. For those, what PyYAML's emitter decides is a short rule,
written here from its `analyze_scalar` and `choose_scalar_style`: a string is plain unless it
starts or ends with a space, holds an indicator where YAML reads one, or would read back as
another type (yaml12.Yaml12Dumper's resolvers: YAML 1.1's and the 1.2 core schema's), in which
case it is single-quoted. Anything else (a character outside printable ASCII, a line long
enough for PyYAML to fold, a list of lists or of mappings as a sweep has, NaN) is not decided
here: `dump` answers None and the caller uses yaml12.dump. A test holds the two writers equal
over every shape this one takes and many strings made to be awkward.
"""

from __future__ import annotations

import re

from slurmgen.generate.written import WrittenFloat, WrittenInt

# The implicit resolvers of yaml12.Yaml12Dumper, by the first character they are looked up by
# (PyYAML's yaml/resolver.py for YAML 1.1, then yaml12._CORE for 1.2): a plain scalar that one
# of them matches would read back as a bool, number, null, date... so a string like it is quoted.
_BOOL_11 = r"yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF"
_FLOAT_11 = (
    r"[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
    r"|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)
_INT_11 = (
    r"[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+"
)
_TIMESTAMP = (
    r"[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?"
    r"(?:[Tt]|[ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?"
)
_CORE = {  # yaml12._CORE, as Yaml12Dumper adds it
    "null": (r"~|null|Null|NULL|", "~nN"),
    "bool": (r"true|True|TRUE|false|False|FALSE", "tTfF"),
    "int": (r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    "float": (
        r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
        "-+.0123456789",
    ),
}
_RESOLVERS: dict[str, list[re.Pattern[str]]] = {}
for _pattern, _first in (
    (_BOOL_11, "yYnNtTfFoO"),
    (_FLOAT_11, "-+0123456789."),
    (_INT_11, "-+0123456789"),
    ("<<", "<"),
    (r"~|null|Null|NULL|", "~nN"),
    (_TIMESTAMP, "0123456789"),
    ("=", "="),
    (r"!|&|\*", "!&*"),
    *_CORE.values(),
):
    _compiled = re.compile(f"^(?:{_pattern})$")  # as PyYAML's: `$` also before a final newline
    for _ch in _first:
        _RESOLVERS.setdefault(_ch, []).append(_compiled)

# Where PyYAML's analyze_scalar finds a block indicator (or a leading or trailing space) in a
# string of printable ASCII: then a plain scalar is not allowed.
_NOT_PLAIN = re.compile(r"\A(?:---|\.\.\.|[#,\[\]{}&*!|>'\"%@`]|[?:-](?: |\Z))|:(?: |\Z)| #|\A | \Z")
_PRINTABLE = re.compile(r"[\x20-\x7e]+")
LONGEST = 400  # characters of a string written here: PyYAML folds a line past its width (1000)
INDENT = "  "


def _scalar(value: object, key: bool = False) -> str | None:
    """A scalar as PyYAML writes it in block context, or None when that is not decided here."""
    kind = type(value)
    if kind is bool:
        return "true" if value else "false"
    if kind in (int, WrittenInt):  # the types yaml12's dumper writes as ints
        return str(value)
    if kind in (float, WrittenFloat):
        text = repr(value).lower()
        if not re.fullmatch(r"-?[0-9]+(?:\.[0-9]+)?(?:e[-+][0-9]+)?", text):
            return None  # nan, inf: PyYAML spells them its own way
        return text.replace("e", ".0e", 1) if "." not in text and "e" in text else text
    if kind is str and value == "" and not key:
        return "''"  # an empty value would read back as null
    if kind is not str or not _PRINTABLE.fullmatch(str(value)) or len(str(value)) > (100 if key else LONGEST):
        return None
    text = str(value)
    typed = any(r.match(text) for r in _RESOLVERS.get(text[0], ()))
    if typed or _NOT_PLAIN.search(text):
        return "'" + text.replace("'", "''") + "'"
    return text


def _lines(mapping: dict, depth: int) -> list[str] | None:
    """A block mapping's lines at `depth` (PyYAML's default: indent 2, lists not indented under
    their key, empty collections as [] and {}), or None."""
    out: list[str] = []
    pad = INDENT * depth
    for k, v in mapping.items():
        key = _scalar(k, key=True) if type(k) is str else None
        if key is None:
            return None
        if isinstance(v, (list, dict)) and not v:
            out.append(f"{pad}{key}: {'[]' if isinstance(v, list) else '{}'}")
        elif type(v) is dict:
            inner = _lines(v, depth + 1)
            if inner is None:
                return None
            out += [f"{pad}{key}:", *inner]
        elif type(v) is list:
            items = [_scalar(item) for item in v]
            if any(item is None for item in items):
                return None
            out += [f"{pad}{key}:", *(f"{pad}- {item}" for item in items)]
        else:
            text = _scalar(v)
            if text is None:
                return None
            out.append(f"{pad}{key}: {text}")
    return out


def dump(data: dict) -> str | None:
    """`data` (a spec's resolved mapping) as yaml12.dump would write it, or None when this
    writer does not decide it (then yaml12.dump does)."""
    if type(data) is not dict or not data:
        return None
    lines = _lines(data, 0)
    return None if lines is None else "\n".join(lines) + "\n"
