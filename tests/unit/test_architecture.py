"""The shape of `slurmgen/` itself: no import cycle, no function over 60 lines, no private name
reached from another module (issue 21).

Read from the source with `ast`, nothing is imported: every `import` and `from ... import`
counts, also inside functions (a lazy import still ties two modules together), except those
under `if TYPE_CHECKING:`, which never run. A cycle is reported as the set of modules that
reach each other (a strongly connected component), so one entry covers every loop inside it.
A second check counts the TYPE_CHECKING imports too: that is how the heartbeat <-> service
cycle of issue 21 hid (service imported heartbeat inside a method, heartbeat named the
service only for its annotations and called its private `_judge`), so a loop closed only by
annotations still fails.

The allow-lists below hold what was already there when the checks were written; they may only
shrink. A new cycle, a new long function or a new private reach fails; an entry that no longer
matches fails too, so a fix also removes its entry and the list cannot hide a relapse.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "slurmgen"
MAX_LINES = 60

# Known cycles (each a set of modules that import each other). May only shrink.
ALLOWED_CYCLES: list[frozenset[str]] = []
# Known functions over MAX_LINES ("path/in/slurmgen.py:Qualified.name"). May only shrink.
ALLOWED_LONG: set[str] = set()
# Known imports of a higher layer ("importer -> imported"). May only shrink.
ALLOWED_UPWARD: set[str] = set()
# Known private names reached from another module ("importer -> provider._name"). May only shrink.
ALLOWED_PRIVATE: set[str] = set()


# ---- reading the package ---------------------------------------------------------------------
@dataclass
class Module:
    name: str  # dotted: slurmgen.coordinator.service
    path: Path
    tree: ast.Module
    imports: set[str] = field(default_factory=set)  # slurmgen modules imported at run time
    type_imports: set[str] = field(default_factory=set)  # ... and those only under TYPE_CHECKING
    bindings: dict[str, str] = field(default_factory=dict)  # local name -> dotted target (also TYPE_CHECKING)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(
    nodes: Iterable[ast.AST], type_only: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement anywhere under `nodes`, with whether it sits under TYPE_CHECKING."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, type_only
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            yield from import_nodes(node.body, True)
            yield from import_nodes(node.orelse, type_only)
        else:
            yield from import_nodes(ast.iter_child_nodes(node), type_only)


def resolve(module: Module, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module a `from` import names (`from ..x import y` in a.b.c -> a.x)."""
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def read_package(root: Path = PACKAGE) -> dict[str, Module]:
    modules = {}
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        modules[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    for m in modules.values():
        for node, type_only in import_nodes(m.tree.body):
            for target, local in _targets(m, node):
                if not target.startswith(root.name + ".") and target != root.name:
                    continue
                if "." not in local:
                    m.bindings[local] = target
                owner = target if target in modules else target.rsplit(".", 1)[0]
                if owner in modules and owner != m.name:
                    (m.type_imports if type_only else m.imports).add(owner)
    return modules


def _targets(m: Module, node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str]]:
    """(dotted target, local name) for each name the statement binds; a target that is not a
    module is `module.name`."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            # `import a.b as m` binds `m` to `a.b`; plain `import a.b` yields the dotted name,
            # which read_package counts as an import but does not track as a binding.
            yield alias.name, alias.asname or alias.name
        return
    base = resolve(m, node, m.path.name == "__init__.py")
    for alias in node.names:
        yield f"{base}.{alias.name}", alias.asname or alias.name


# ---- cycles ----------------------------------------------------------------------------------
def cycles(modules: dict[str, Module], with_types: bool = False) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan); `with_types`
    counts the imports under TYPE_CHECKING as well."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(modules[v].imports | (modules[v].type_imports if with_types else set())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return found


# ---- long functions --------------------------------------------------------------------------
def function_lengths(modules: dict[str, Module], root: Path = PACKAGE) -> dict[str, int]:
    """ "path:Qualified.name" -> lines of the body, from its first statement (the docstring, if
    any) to the last line. Neither decorators nor the signature count: a command's signature lists
    its options one a line (ruff format), which is declaration, not logic. A nested function
    counts in its parent too."""
    lengths = {}

    def walk(node: ast.AST, prefix: str, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lengths[f"{where}:{qual}"] = child.end_lineno - child.body[0].lineno + 1
                walk(child, qual + ".", where)
            else:
                walk(child, prefix, where)

    for m in modules.values():
        walk(m.tree, "", m.path.relative_to(root).as_posix())
    return lengths


def long_functions(modules: dict[str, Module], root: Path = PACKAGE) -> dict[str, int]:
    return {k: v for k, v in function_lengths(modules, root).items() if v > MAX_LINES}


# ---- private names across modules ------------------------------------------------------------
def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reaches(modules: dict[str, Module]) -> set[str]:
    """ "importer -> provider._name" for each private name a module takes from another: imported
    by name, read from an imported module or class, or read from a parameter annotated with a
    class of another module (`c: "Coordinator"` ... `c._judge(...)`)."""
    found = set()
    for m in modules.values():
        for target in m.bindings.values():
            owner, _, name = target.rpartition(".")
            if target not in modules and is_private(name) and owner in modules and owner != m.name:
                found.add(f"{m.name} -> {target}")
        found |= _attribute_reaches(m, m.tree, m.bindings, modules)
        for fn in ast.walk(m.tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                typed = {a.arg: _annotation_target(a.annotation, m) for a in _params(fn)}
                found |= _attribute_reaches(m, fn, {k: v for k, v in typed.items() if v}, modules)
    return found


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []), *([a.kwarg] if a.kwarg else [])]


def _annotation_target(annotation: ast.expr | None, m: Module) -> str | None:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(annotation, ast.Name):
        return m.bindings.get(annotation.id)
    return None


def _attribute_reaches(m: Module, fn: ast.AST, names: dict[str, str], modules: dict[str, Module]) -> set[str]:
    found = set()
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Attribute)
            and is_private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in names
        ):
            target = names[node.value.id]
            owner = target if target in modules else target.rpartition(".")[0]
            if owner in modules and owner != m.name:
                found.add(f"{m.name} -> {target}.{node.attr}")
    return found


# ---- the tests -------------------------------------------------------------------------------
# ---- layers ---------------------------------------------------------------------------------
# Data flows one way (docs/architecture.md): a module may import its own layer or lower ones.
# The contract imports nothing of slurmgen; the plumbing and the generator build on it; the
# services (SSH, the run registry, tracking, observe) are shared by the features and import
# none of them; the features stand on all of those; the CLI root composes them and nothing
# imports it.
LAYERS: dict[str, int] = {
    "slurmgen.contract": 0,
    "slurmgen.errors": 1,
    "slurmgen.jsonl": 1,
    "slurmgen.atomic": 1,
    "slurmgen.nodelink": 1,
    "slurmgen.generate": 2,
    "slurmgen.cliopts": 2,
    "slurmgen.ssh": 3,
    "slurmgen.runs": 3,
    "slurmgen.tracking": 3,
    "slurmgen.observe": 3,
    "slurmgen.launch": 4,
    "slurmgen.jobs": 4,
    "slurmgen.heal": 4,
    "slurmgen.doctor": 4,
    "slurmgen.coordinator": 4,
    "slurmgen.train": 4,
    # The Python API: jobs, launches and functions driven from Python through the features above.
    "slurmgen.api": 4,
    # Callbacks for Lightning and transformers programs, over observe/ and tracking/.
    "slurmgen.integrations": 4,
    # The package's face: `slurmgen.beat` for any program (observe/), `__version__` (contract).
    "slurmgen": 5,
    "slurmgen.cli": 5,
    "slurmgen.__main__": 5,
}


def layer_of(module: str) -> int:
    """The layer of a dotted module name: its longest prefix in LAYERS."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    raise KeyError(f"{module} belongs to no layer: add its package to LAYERS")


def upward_imports(modules: dict[str, Module]) -> set[str]:
    return {
        f"{m.name} -> {target}"
        for m in modules.values()
        for target in m.imports | m.type_imports
        if layer_of(target) > layer_of(m.name)
    }


@functools.lru_cache(maxsize=1)
def package() -> dict[str, Module]:
    """slurmgen/ read once for all the checks below (they only read it)."""
    return read_package()


def test_no_new_import_cycle():
    found = cycles(package())
    new = [sorted(c) for c in found if not any(c <= allowed for allowed in ALLOWED_CYCLES)]
    assert not new, f"import cycles (break them, see issue 21): {new}"


def test_no_new_cycle_closed_by_type_checking_imports():
    found = cycles(package(), with_types=True)
    new = [sorted(c) for c in found if not any(c <= allowed for allowed in ALLOWED_CYCLES)]
    assert not new, f"import cycles counting TYPE_CHECKING imports (pass data, not the other module): {new}"


def test_no_upward_import():
    """A lower layer never imports a higher one, at run time or for annotations."""
    assert sorted(upward_imports(package()) - ALLOWED_UPWARD) == []


def test_the_layer_check_sees_an_upward_import(tmp_path):
    root = tmp_path / "slurmgen"
    (root / "contract").mkdir(parents=True)
    (root / "jobs").mkdir()
    for path in (root / "__init__.py", root / "contract" / "__init__.py", root / "jobs" / "__init__.py"):
        path.write_text("")
    (root / "jobs" / "sweep.py").write_text("X = 1\n")
    (root / "contract" / "ports.py").write_text("from slurmgen.jobs.sweep import X\n")
    assert upward_imports(read_package(root)) == {"slurmgen.contract.ports -> slurmgen.jobs.sweep"}


SERVICES = ("slurmgen.ssh", "slurmgen.runs", "slurmgen.tracking", "slurmgen.observe")
FEATURES = (
    "slurmgen.launch",
    "slurmgen.jobs",
    "slurmgen.heal",
    "slurmgen.doctor",
    "slurmgen.coordinator",
    "slurmgen.train",
)


def test_the_layer_check_sees_a_service_importing_a_feature(tmp_path):
    """The services are shared by the features, so none imports one, not even for annotations
    (as jobs/remote.py once imported launch/ssh/, the SSH layer kept inside a feature)."""
    assert max(LAYERS[s] for s in SERVICES) < min(LAYERS[f] for f in FEATURES)
    root = tmp_path / "slurmgen"
    for package in ("", "runs", "ssh", "jobs", "launch"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    (root / "jobs" / "slurm_runner.py").write_text("class Runner:\n    pass\n")
    (root / "launch" / "fanout.py").write_text("X = 1\n")
    (root / "ssh" / "connect.py").write_text("X = 1\n")
    (root / "runs" / "trainer_records.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from slurmgen.ssh.connect import X\n"
        "if TYPE_CHECKING:\n    from slurmgen.jobs.slurm_runner import Runner\n"
    )
    (root / "ssh" / "keys.py").write_text("def f():\n    from slurmgen.launch.fanout import X\n")
    (root / "launch" / "plan.py").write_text(
        "from slurmgen.runs.trainer_records import X\nfrom slurmgen.jobs import slurm_runner\n"
    )
    assert upward_imports(read_package(root)) == {
        "slurmgen.runs.trainer_records -> slurmgen.jobs.slurm_runner",
        "slurmgen.ssh.keys -> slurmgen.launch.fanout",
    }


def test_no_new_long_function():
    found = long_functions(package())
    new = {k: v for k, v in found.items() if k not in ALLOWED_LONG}
    assert not new, f"functions over {MAX_LINES} lines (split them by concept): {new}"


def test_no_new_private_name_across_modules():
    new = private_reaches(package()) - ALLOWED_PRIVATE
    assert not new, f"private names used from another module (make them public or move them): {sorted(new)}"


def test_the_allow_lists_only_shrink():
    """An entry that no longer matches must go, so the lists record only what is left to fix."""
    modules = package()
    found = cycles(modules)
    assert [sorted(a) for a in ALLOWED_CYCLES if not any(c <= a for c in found)] == []
    assert ALLOWED_LONG - set(long_functions(modules)) == set()
    assert ALLOWED_PRIVATE - private_reaches(modules) == set()
    assert ALLOWED_UPWARD - upward_imports(modules) == set()


def test_the_checks_see_the_old_heartbeat_service_tie(tmp_path):
    """The checks themselves, on a small package shaped like the coordinator before issue 21:
    service imported heartbeat inside a method, heartbeat named service only under
    TYPE_CHECKING and called the private `Coordinator._judge`. No run-time cycle, but a cycle
    through the annotations and a private reach; one real import back makes it a run-time
    cycle too."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "service.py").write_text(
        "class Coordinator:\n"
        "    def _judge(self):\n        pass\n\n"
        "    def heartbeat(self):\n"
        "        from pkg.sub.heartbeat import apply_report\n"
        "        return apply_report(self)\n"
    )
    heartbeat = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .service import Coordinator\n\n"
        "def apply_report(c: 'Coordinator'):\n"
        "    c._judge()\n"
        "    return long()\n\n"
        "def long(\n    a=1,\n):\n" + "    x = 1\n" * (MAX_LINES + 1)
    )
    (pkg / "sub" / "heartbeat.py").write_text(heartbeat)
    modules = read_package(pkg)
    assert modules["pkg.sub.service"].imports == {"pkg.sub.heartbeat"}
    assert modules["pkg.sub.heartbeat"].imports == set()
    assert modules["pkg.sub.heartbeat"].type_imports == {"pkg.sub.service"}
    assert cycles(modules) == []
    assert cycles(modules, with_types=True) == [frozenset({"pkg.sub.service", "pkg.sub.heartbeat"})]
    assert private_reaches(modules) == {"pkg.sub.heartbeat -> pkg.sub.service.Coordinator._judge"}
    assert long_functions(modules, pkg) == {"sub/heartbeat.py:long": MAX_LINES + 1}

    (pkg / "sub" / "heartbeat.py").write_text(heartbeat.replace("if TYPE_CHECKING:\n    from", "if True:\n    from"))
    assert cycles(read_package(pkg)) == [frozenset({"pkg.sub.service", "pkg.sub.heartbeat"})]
