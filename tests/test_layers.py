"""The package's layers point one way: each part of ``cde_st`` imports only parts of a lower layer, never a part of
its own layer (unless the pair is declared in :data:`ALLOWED`), no part imports names from the package root
(``cde_st/__init__.py`` is the public face, not a dependency), and no modules import each other in a circle,
within a layer or a part either.

Read from the source with ``ast`` (imports inside functions count too), so the test sees every arrow without
importing anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cde_st"

#: Lowest first. A part is a top-level module or subpackage of cde_st. Parts of one layer do not import each other,
#: so a layer is a set of peers and the order of the list is the whole story of who may use whom.
LAYERS = [
    {"backend_options", "coercion", "context", "context_errors", "prompts", "data", "defaults", "atomic_files",
     "distributed", "text_bounds"},
    {"modules"},
    {"released", "context_files"},
    {"cache_key_warning", "command_line"},
    {"model_card"},
    {"model"},
    {"fingerprints", "hard_negatives", "model_loading"},
    {"batching", "losses", "fast_encode", "export"},
    {"evaluation", "serving", "corpus"},
    {"training", "vector_stores"},
    {"convert_command"},
    {"cli"},
]  # fmt: skip

#: (importing part, imported part) pairs of one layer that may import each other anyway, each with the reason it is
#: not better moved. Empty: every sibling import so far was code in the wrong place, moved down instead.
ALLOWED: set[tuple[str, str]] = set()


def _ranks(layers: list[set[str]]) -> dict[str, int]:
    return {part: rank for rank, parts in enumerate(layers) for part in parts}


RANK = _ranks(LAYERS)


def _part(module: str) -> str:
    return module.split(".")[1]


def _imports(path: Path, parts=RANK) -> list[tuple[int, str]]:
    """(line, imported cde_st part or root name as "cde_st:NAME") for every import of cde_st in the file; ``parts``:
    the names that are parts (so ``from cde_st import model`` is an import of the part ``model``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("cde_st"):
            if node.module == "cde_st":
                found += [(node.lineno, a.name if a.name in parts else f"cde_st:{a.name}") for a in node.names]
            else:
                found.append((node.lineno, _part(node.module)))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, _part(a.name)) for a in node.names if a.name.startswith("cde_st.")]
    return found


def _modules(package: Path = PACKAGE):
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts != ("__init__",):  # the root re-exports the public API
            yield path, parts[0]


def _layer_faults(package: Path, layers: list[set[str]], allowed: set[tuple[str, str]]) -> list[str]:
    """One line per import under ``package`` that breaks the layering: ``path:line`` and what it breaks."""
    rank, wrong = _ranks(layers), []
    for path, part in _modules(package):
        for line, target in _imports(path, rank):
            where = f"{path.relative_to(package.parent)}:{line}"
            if target.startswith("cde_st:"):
                wrong.append(f"{where} imports {target[7:]} from the package root (import it from its module)")
            elif target not in rank or target == part:
                continue
            elif rank[target] > rank.get(part, len(layers)):
                wrong.append(f"{where}: {part} (layer {rank[part]}) imports {target} (layer {rank[target]})")
            elif rank[target] == rank.get(part) and (part, target) not in allowed:
                wrong.append(
                    f"{where}: {part} imports {target}, both in layer {rank[part]} (move the shared code down, or "
                    "put one of them in a layer of its own)"
                )
    return wrong


def test_every_part_has_a_layer():
    unknown = {part for _, part in _modules()} - set(RANK) - {"__main__"}
    assert not unknown, f"give these parts of cde_st a layer in LAYERS: {sorted(unknown)}"


def test_every_allowed_pair_is_one_layer_and_still_needed():
    needed = {(part, target) for path, part in _modules() for _, target in _imports(path)}
    stale = [pair for pair in sorted(ALLOWED) if RANK.get(pair[0]) != RANK.get(pair[1]) or pair not in needed]
    assert not stale, f"remove these pairs from ALLOWED (not one layer, or no such import left): {stale}"


def test_imports_point_down_and_never_through_the_root():
    wrong = _layer_faults(PACKAGE, LAYERS, ALLOWED)
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text(
        "def f():\n    from cde_st.training import train\nfrom cde_st import ContextualSentenceTransformer\n"
    )
    assert sorted(_imports(bad)) == [(2, "training"), (3, "cde_st:ContextualSentenceTransformer")]


def test_the_checker_sees_an_import_between_parts_of_one_layer(tmp_path):
    package = tmp_path / "cde_st"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "core.py").write_text("x = 1\n")
    (package / "a.py").write_text("from cde_st.low.core import x\n\n\ndef f():\n    from cde_st import b\n")
    (package / "b.py").write_text("from cde_st.low import core\nfrom cde_st.a import x\n")
    layers = [{"low"}, {"a", "b"}]
    assert _layer_faults(package, layers, set()) == [
        "cde_st/a.py:5: a imports b, both in layer 1 (move the shared code down, or put one of them in a layer of "
        "its own)",
        "cde_st/b.py:2: b imports a, both in layer 1 (move the shared code down, or put one of them in a layer of "
        "its own)",
    ]
    assert _layer_faults(package, layers, {("a", "b"), ("b", "a")}) == []  # a declared pair passes
    assert _layer_faults(package, [{"low"}, {"b"}, {"a"}], set()) == ["cde_st/b.py:2: b (layer 1) imports a (layer 2)"]


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(package: Path) -> dict[str, dict[str, int]]:
    """Module -> {module of the package it imports: line of the first such import}, for every module under
    ``package``. ``from p.m import name`` points at ``p.m.name`` when that is a module, else at ``p.m``."""
    paths = {_module_name(path, package): path for path in sorted(package.rglob("*.py"))}
    graph = {}
    for module, path in paths.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in paths else node.module
                           for a in node.names]  # fmt: skip
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if target in paths and target != module:
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import cycles a depth-first walk of ``graph`` meets, each as ``[a, b, ..., a]`` (at least one per set
    of modules that import each other in a circle)."""
    state: dict[str, str] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                found.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_no_modules_import_each_other_in_a_circle():
    # A circle works only while some import in it stays inside a function or runs late; any reordering of imports
    # (or an import moved to the top) then fails at import time, and the modules cannot be read one at a time.
    graph = _import_graph(PACKAGE)
    # Each step as module:line of its import of the next.
    described = [
        " -> ".join([f"{a}:{graph[a][b]}" for a, b in zip(cycle, cycle[1:])] + [cycle[-1]]) for cycle in _cycles(graph)
    ]
    assert not described, "modules of cde_st import each other in a circle:\n" + "\n".join(described)


def test_the_checker_sees_an_import_cycle(tmp_path):
    package = tmp_path / "cde_st"
    (package / "pkg").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "pkg" / "__init__.py").write_text("")
    (package / "a.py").write_text("import os\nfrom cde_st.pkg import mod\n")
    (package / "pkg" / "mod.py").write_text("def f():\n    import cde_st.a\n")
    (package / "b.py").write_text("from cde_st.a import thing\n")  # points into the circle, is not part of it
    graph = _import_graph(package)
    assert graph["cde_st.a"] == {"cde_st.pkg.mod": 2} and graph["cde_st.pkg.mod"] == {"cde_st.a": 2}
    assert _cycles(graph) == [["cde_st.a", "cde_st.pkg.mod", "cde_st.a"]]
