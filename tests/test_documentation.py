"""The pages stay pages: the README's status cells short. Read from the text; nothing is imported or run.

- **Status cells**: each "state" cell of the README's Status table holds at most :data:`MAX_STATUS_WORDS` words;
  details go to the page the row links.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_STATUS_WORDS = 60


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


def test_readme_status_cells_are_one_or_two_lines():
    violations = long_status_cells((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not violations, "\n".join(violations)


# The checks themselves, on small inputs: each must find what it is meant to find.
def test_the_checks_find_what_they_look_for():
    status = (
        "## Status\n\n| what | state | read |\n|---|---|---|\n| short | a b c | x |\n| long | {} | y |\n\n## Next\n"
    )
    assert long_status_cells(status.format(" ".join(["w"] * MAX_STATUS_WORDS))) == []
    assert long_status_cells(status.format(" ".join(["w"] * (MAX_STATUS_WORDS + 1))))[0].startswith("long: 61 words")
