"""The pages stay pages: the README's status cells short, each benchmark's RESULTS file a page of current numbers,
docs/architecture.md naming every module of the package, and every link between the pages arriving. Read from the
text; nothing is imported or run.

- **Status cells**: each "state" cell of the README's Status table holds at most :data:`MAX_STATUS_WORDS` words;
  details go to the page the row links.
- **RESULTS files**: each ``benchmarks/**/RESULTS_*.md`` holds at most :data:`MAX_RESULTS_LINES` lines; superseded
  numbers and dated history go to ``docs/experiment_log.md``.
- **Architecture**: every module under ``cde_st/`` is named in ``docs/architecture.md`` by its path
  (``cde_st/serving/app.py``, or ``serving/app.py`` below the package) or its dotted name
  (``cde_st.serving.app``); a package's ``__init__.py`` by the package's path (``cde_st/serving/``).
- **Links**: every relative link in the README and the Markdown pages under ``docs/``, ``benchmarks/`` and
  ``examples/`` names a file that exists and, with ``#anchor``, a heading of that page (GitHub's anchor rule), so
  moving a section to the experiment log cannot leave a link behind.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_STATUS_WORDS = 60
MAX_RESULTS_LINES = 250


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    """The body rows (cells stripped) of the first table under ``## heading`` in ``markdown``."""
    lines = ("\n" + markdown).split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0].splitlines()
    table = [line for line in lines if line.startswith("|")]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table[2:]]


def long_status_cells(markdown: str) -> list[str]:
    """``what: N words`` for each Status row whose state cell is over the limit."""
    return [
        f"{row[0]}: {n} words (at most {MAX_STATUS_WORDS}; move the details to the page it links)"
        for row in table_rows(markdown, "Status")
        if (n := len(row[1].split())) > MAX_STATUS_WORDS
    ]


def long_results_files(root: Path) -> list[str]:
    """``path: N lines`` for each ``benchmarks/**/RESULTS_*.md`` under ``root`` over the limit."""
    found = []
    for path in sorted((root / "benchmarks").rglob("RESULTS_*.md")):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_RESULTS_LINES:
            found.append(
                f"{path.relative_to(root).as_posix()}: {n} lines (at most {MAX_RESULTS_LINES}): keep the current "
                "numbers, move superseded ones and dated history to docs/experiment_log.md"
            )
    return found


def names_of(module: Path, package_root: Path) -> list[str]:
    """The names that count as naming ``module`` (a ``.py`` file below ``package_root``, the ``cde_st`` folder)."""
    relative = module.relative_to(package_root.parent)  # cde_st/serving/app.py
    if module.name == "__init__.py":
        folder = relative.parent.as_posix()
        return [f"{folder}/", f"{folder}/__init__.py", ".".join(relative.parent.parts)]
    names = [relative.as_posix(), ".".join(relative.with_suffix("").parts)]
    if len(relative.parts) > 2:  # below a subpackage: serving/app.py is unambiguous
        names.append(relative.relative_to(relative.parts[0]).as_posix())
    return names


def unnamed_modules(package_root: Path, page: str) -> list[str]:
    """What to add to the page for each module of ``package_root`` it does not name."""
    missing = []
    for module in sorted(package_root.rglob("*.py")):
        names = names_of(module, package_root)
        if not any(re.search(rf"(?<![\w/.]){re.escape(name)}(?![\w/]|\.\w)", page) for name in names):
            missing.append(
                f"{names[0]} is not named in docs/architecture.md: add a row `| `{names[0]}` | what it holds |` to "
                "the table of its package"
            )
    return missing


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown`` (lower case, punctuation but ``-`` and ``_`` dropped,
    spaces to ``-``, ``-1``, ``-2``... on repeats); headings inside code fences do not count."""
    anchors, seen, fenced = set(), {}, False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.*)", line)):
            anchor = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            seen[anchor] = seen.get(anchor, -1) + 1
            anchors.add(f"{anchor}-{seen[anchor]}" if seen[anchor] else anchor)
    return anchors


def broken_links(page: Path, root: Path) -> list[str]:
    """``page: target (why)`` for each relative link of ``page`` whose file or heading is missing."""
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        where = f"{page.relative_to(root).as_posix()}: {target}"
        if not linked.exists():
            found.append(f"{where} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text(encoding="utf-8")):
            found.append(f"{where} (no heading with that anchor in {linked.name})")
    return found


def linked_pages(root: Path) -> list[Path]:
    return [
        root / "README.md",
        *sorted(p for d in ("docs", "benchmarks", "examples") for p in (root / d).rglob("*.md")),
    ]


def test_readme_status_cells_are_one_or_two_lines():
    violations = long_status_cells((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not violations, "\n".join(violations)


def test_every_benchmark_results_file_is_a_page():
    violations = long_results_files(ROOT)
    assert not violations, "\n".join(violations)


def test_architecture_names_every_module():
    violations = unnamed_modules(ROOT / "cde_st", (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert not violations, f"{len(violations)} module(s) not named:\n" + "\n".join(violations)


def test_every_link_between_the_pages_arrives():
    violations = [v for page in linked_pages(ROOT) for v in broken_links(page, ROOT)]
    assert not violations, "\n".join(violations)


# The checks themselves, on small inputs: each must find what it is meant to find.
def test_the_checks_find_what_they_look_for(tmp_path):
    status = (
        "## Status\n\n| what | state | read |\n|---|---|---|\n| short | a b c | x |\n| long | {} | y |\n\n## Next\n"
    )
    assert long_status_cells(status.format(" ".join(["w"] * MAX_STATUS_WORDS))) == []
    assert long_status_cells(status.format(" ".join(["w"] * (MAX_STATUS_WORDS + 1))))[0].startswith("long: 61 words")
    results = tmp_path / "benchmarks" / "speed" / "RESULTS_x.md"
    results.parent.mkdir(parents=True)
    results.write_text("line\n" * MAX_RESULTS_LINES)
    assert long_results_files(tmp_path) == []
    results.write_text("line\n" * (MAX_RESULTS_LINES + 1))
    assert long_results_files(tmp_path)[0].startswith("benchmarks/speed/RESULTS_x.md: 251 lines")
    package = tmp_path / "cde_st"
    (package / "serving").mkdir(parents=True)
    for name in ("__init__.py", "model.py", "serving/__init__.py", "serving/app.py", "serving/engine.py"):
        (package / name).write_text("")
    page = "`cde_st/model.py`, `cde_st/serving/` holds `serving/app.py`, `cde_st.serving.engine_x` (cde_st.serving.a)"
    assert unnamed_modules(package, page) == [
        "cde_st/ is not named in docs/architecture.md: add a row `| `cde_st/` | what it holds |` to the table of "
        "its package",
        "cde_st/serving/engine.py is not named in docs/architecture.md: add a row `| `cde_st/serving/engine.py` | "
        "what it holds |` to the table of its package",
    ]
    assert unnamed_modules(package, page + " `cde_st/` and `cde_st.serving.engine`") == []
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "log.md").write_text(
        "# Log\n\n## 2026-11-29: Serving, `--workers 2`\n\n## Setup\n\n## Setup\n"
    )
    assert heading_anchors((tmp_path / "docs" / "log.md").read_text()) == {
        "log",
        "2026-11-29-serving---workers-2",
        "setup",
        "setup-1",
    }
    page = tmp_path / "README.md"
    page.write_text(
        "[a](docs/log.md#setup-1) [b](docs/log.md#gone) [c](docs/none.md) [d](https://x.org/#y) [e](#here)\n# Here\n"
    )
    assert broken_links(page, tmp_path) == [
        "README.md: docs/log.md#gone (no heading with that anchor in log.md)",
        "README.md: docs/none.md (no such file)",
    ]
