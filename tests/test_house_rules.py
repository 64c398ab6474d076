"""The house rules that keep the library and the benchmarks small enough to read, checked from the source text.

Each test parses files with :mod:`ast` (nothing is imported or run, so the whole check takes about a second) and
fails with one line per violation, ``path:line: what``. What is checked:

- **File size**: no ``.py`` file under ``cde_st/`` or ``benchmarks/`` over :data:`MAX_FILE_LINES` lines.
- **Function size**: no function or method (``def`` / ``async def``, nested ones included) under ``cde_st/`` or
  ``benchmarks/`` over :data:`MAX_FUNCTION_LINES` lines, counted from its ``def`` line to its last line (decorators
  excluded, docstring and comments included).
- **Private names stay private**: in ``cde_st/``, ``benchmarks/``, ``train/``, ``eval/`` and ``examples/``, no
  ``from x import _y`` where ``x`` is another module of this repository, and no ``alias._y`` attribute read where
  ``alias`` is bound to a module of this repository (``import x.y as alias``, ``from pkg import module``).
  Dunder names (``__version__``) are not private; relative imports count like absolute ones. Not checked:
  ``obj._y`` on objects (that needs types to tell apart), other projects' private names (a dependency's
  ``_helper`` is a pinning question, not a layering one), and tests (they may look inside what they test).
- **``__all__`` is complete**: in a ``cde_st/`` module that defines ``__all__``, every public name it *defines* at
  module level (``def``, ``class``, or an assignment to a plain name; not imported names, so a re-export stays a
  choice) is listed. A name is public when it does not start with an underscore. Constants and type aliases
  count; a module's ``logger = logging.getLogger(...)`` does not (it is logging's handle, not an API). Modules
  without ``__all__`` are not checked.
- **The results page stays a page**: ``docs/RESULTS.md`` holds at most :data:`MAX_RESULTS_LINES` lines of current
  numbers (history goes to ``docs/experiment_log.md``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 70
MAX_RESULTS_LINES = 250
CODE_DIRS = ("cde_st", "benchmarks", "train", "eval", "examples")


def python_files(*dirs: str) -> list[Path]:
    """The ``.py`` files below the given repository folders, sorted."""
    return sorted(path for name in dirs for path in (ROOT / name).rglob("*.py") if ".venv" not in path.parts)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def oversized_files(paths: list[Path]) -> list[str]:
    return [
        f"{relative(path)}: {n} lines (limit {MAX_FILE_LINES})"
        for path in paths
        if (n := line_count(path)) > MAX_FILE_LINES
    ]


def long_functions(path: Path) -> list[str]:
    """``path:line: name is N lines`` for each function of ``path`` over the limit."""
    found = []
    for node in ast.walk(parse(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                found.append(f"{relative(path)}:{node.lineno}: {node.name} is {n} lines (limit {MAX_FUNCTION_LINES})")
    return found


def module_aliases(tree: ast.Module, package: str) -> set[str]:
    """Names ``tree`` binds to modules of this repository: ``import x.y as z`` (z), ``import x`` (x) and
    ``from pkg import mod`` (mod)."""
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_repository_module(alias.name):
                    aliases.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = resolve_from(node, package)
            for alias in node.names:
                if is_repository_module(f"{base}.{alias.name}" if base else alias.name):
                    aliases.add(alias.asname or alias.name)
    return aliases


def resolve_from(node: ast.ImportFrom, package: str) -> str:
    """The absolute module name of a ``from ... import`` (relative levels resolved against ``package``)."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def is_repository_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_imports(path: Path) -> list[str]:
    """``path:line: ...`` for each underscore-prefixed name of another module that ``path`` imports or reads."""
    tree = parse(path)
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = resolve_from(node, package)
            for alias in node.names:
                if is_private(alias.name) and source != module and is_repository_module(source):
                    found.append(f"{relative(path)}:{node.lineno}: imports {alias.name} from {source}")
    aliases = module_aliases(tree, package)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and is_private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.append(f"{relative(path)}:{node.lineno}: reads {node.value.id}.{node.attr} of another module")
    return found


def defined_public_names(tree: ast.Module) -> dict[str, int]:
    """Public names ``tree`` defines at module level (def, class, plain assignment), with their line."""
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            targets = [node.name]
        elif isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            targets = [node.target.id]
        else:
            continue
        if is_logger(node):
            continue
        for name in targets:
            if not name.startswith("_"):
                names.setdefault(name, node.lineno)
    return names


def is_logger(node: ast.stmt) -> bool:
    """``name = logging.getLogger(...)``."""
    value = getattr(node, "value", None)
    return isinstance(value, ast.Call) and getattr(value.func, "attr", None) == "getLogger"


def declared_all(tree: ast.Module) -> list[str] | None:
    """The literal ``__all__`` of ``tree`` (list/tuple of strings, ``+=`` included); None where it has none."""
    declared = None
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                continue
            if not isinstance(node, ast.AugAssign):
                declared = []
            declared = (declared or []) + [
                e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)
            ]
    return declared


def missing_from_all(path: Path) -> list[str]:
    tree = parse(path)
    declared = declared_all(tree)
    if declared is None:
        return []
    return [
        f"{relative(path)}:{line}: {name} is public but not in __all__"
        for name, line in defined_public_names(tree).items()
        if name not in declared
    ]


def report(violations: list[str]) -> str:
    return f"{len(violations)} violation(s):\n" + "\n".join(violations)


def test_no_library_file_over_the_limit():
    violations = oversized_files(python_files("cde_st"))
    assert not violations, report(violations)


def checked_benchmarks() -> list[Path]:
    return python_files("benchmarks")


def test_no_benchmark_file_over_the_limit():
    violations = oversized_files(checked_benchmarks())
    assert not violations, report(violations)


def test_no_function_over_the_limit():
    violations = [v for path in python_files("cde_st") + checked_benchmarks() for v in long_functions(path)]
    assert not violations, report(violations)


def test_no_import_of_another_modules_private_name():
    violations = [v for path in python_files(*CODE_DIRS) for v in private_imports(path)]
    assert not violations, report(violations)


def test_every_public_name_is_in_its_modules_all():
    violations = [v for path in python_files("cde_st") for v in missing_from_all(path)]
    assert not violations, report(violations)


def test_results_page_holds_current_numbers_only():
    lines = line_count(ROOT / "docs" / "RESULTS.md")
    assert lines <= MAX_RESULTS_LINES, (
        f"docs/RESULTS.md has {lines} lines (at most {MAX_RESULTS_LINES}): move history to docs/experiment_log.md"
    )


# The checks themselves, on small sources: each must find what it is meant to find.
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "probe.py"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_checks_find_what_they_look_for(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)  # paths are reported relative to ROOT
    long_body = "\n".join(["def f():"] + ["    x = 1"] * MAX_FUNCTION_LINES)
    assert long_functions(write(tmp_path, long_body))
    assert not long_functions(write(tmp_path, "\n".join(["def f():"] + ["    x = 1"] * (MAX_FUNCTION_LINES - 1))))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("_y = 1\n")
    assert private_imports(write(tmp_path, "from pkg.mod import _y\n"))
    assert private_imports(write(tmp_path, "import pkg.mod as m\nm._y\n"))
    assert private_imports(write(tmp_path, "from pkg import mod\nmod._y\n"))
    assert not private_imports(write(tmp_path, "from pkg import __name__, mod\nmod.y\n"))
    assert not private_imports(write(tmp_path, "from os.path import _joinrealpath\n"))  # another project's
    assert missing_from_all(
        write(tmp_path, "__all__ = ['a']\ndef a(): pass\ndef b(): pass\nC = 1\nlogger = logging.getLogger(__name__)\n")
    ) == [
        "probe.py:3: b is public but not in __all__",
        "probe.py:4: C is public but not in __all__",
    ]
    assert not missing_from_all(write(tmp_path, "from os import path\ndef b(): pass\n"))
    assert oversized_files([write(tmp_path, "x = 1\n" * (MAX_FILE_LINES + 1))])


def test_importing_the_package_loads_no_heavy_library():
    """``import cde_st`` stays cheap (the ``--workers`` parent and ``--help`` need no torch); its names load on use."""
    import subprocess
    import sys

    code = (
        "import sys, cde_st\n"
        "print(sorted(m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules))\n"
        "assert sorted(cde_st.__all__) == sorted(cde_st._HOMES)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["[]"]


def test_test_files_have_unique_names():
    # tests/ has no __init__.py files: pytest imports each test file by its base name, so two files of one name in
    # two folders make the second fail to collect ("import file mismatch") as soon as both run in one process.
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    repeated = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not repeated, f"test files share a name (rename one of each): {repeated}"
