"""The package's layers point one way: each part of ``cde_st`` imports only parts of its own or a lower layer, and
no part imports names from the package root (``cde_st/__init__.py`` is the public face, not a dependency).

Read from the source with ``ast`` (imports inside functions count too), so the test sees every arrow without
importing anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cde_st"

#: Lowest first. A part is a top-level module or subpackage of cde_st.
LAYERS = [
    {"coercion", "context", "prompts", "data", "defaults", "folders", "distributed", "text_bounds"},
    {"modules"},
    {"released"},
    {"model", "model_card", "hard_negatives", "command_line"},
    {"batching", "losses", "fast_encode", "export"},
    {"evaluation", "serving", "corpus"},
    {"training"},
    {"cli", "convert_command"},
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def _part(module: str) -> str:
    return module.split(".")[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported cde_st part or root name as "cde_st:NAME") for every import of cde_st in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("cde_st"):
            if node.module == "cde_st":
                found += [(node.lineno, a.name if a.name in RANK else f"cde_st:{a.name}") for a in node.names]
            else:
                found.append((node.lineno, _part(node.module)))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, _part(a.name)) for a in node.names if a.name.startswith("cde_st.")]
    return found


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts != ("__init__",):  # the root re-exports the public API
            yield path, parts[0]


def test_every_part_has_a_layer():
    unknown = {part for _, part in _modules()} - set(RANK) - {"__main__"}
    assert not unknown, f"give these parts of cde_st a layer in LAYERS: {sorted(unknown)}"


def test_imports_point_down_and_never_through_the_root():
    wrong = []
    for path, part in _modules():
        for line, target in _imports(path):
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if target.startswith("cde_st:"):
                wrong.append(f"{where} imports {target[7:]} from the package root (import it from its module)")
            elif target in RANK and RANK[target] > RANK.get(part, len(LAYERS)):
                wrong.append(f"{where}: {part} (layer {RANK[part]}) imports {target} (layer {RANK[target]})")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text(
        "def f():\n    from cde_st.training import train\nfrom cde_st import ContextualSentenceTransformer\n"
    )
    assert sorted(_imports(bad)) == [(2, "training"), (3, "cde_st:ContextualSentenceTransformer")]
