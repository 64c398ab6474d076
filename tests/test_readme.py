"""Every ```python block of README.md and of docs/*.md runs as written, offline, each in a fresh Python process; CI
runs the README's test command.

Markers, HTML comments on the lines just before a block (invisible on GitHub):
- ``<!-- not-run: reason -->``: the block is not run (the test skips it with that reason); kept to a counted few.
- ``<!-- requires: module -->``: skipped when that module (an optional extra) is not installed.
- ``<!-- continues -->``: runs after the previous block, in the same process (it uses that block's names).

A block continues only blocks of its own file. Each block runs in ``tmp/work`` with ``tmp/shared`` linked to the
checkout's ``../shared``, so the documents' ``../shared/data`` paths resolve and what a block writes (``my-cde``,
``runs/``) stays in the temp folder.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The documents whose python blocks must run: the README and every page under docs/.
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
SHARED = ROOT.parent / "shared"
# Blocks the documents may leave unrun, all files together (each with its reason in the marker): the released
# models, which need the Hugging Face hub (docs/released_models.md). Raise this only with a reason a reader would
# accept.
MAX_NOT_RUN = 1
MARKER = re.compile(r"^<!--\s*(not-run|requires|continues)\s*:?\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclass
class Block:
    number: int  # 1-based among the python blocks of its file
    line: int  # line of the opening fence
    code: str
    not_run: str | None = None
    requires: list[str] = field(default_factory=list)
    continues: bool = False


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text with the markers on the lines just before each."""
    blocks: list[Block] = []
    markers: list[tuple[str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        marker = MARKER.match(stripped)
        fence = FENCE.match(lines[i])
        if marker:
            markers.append((marker.group(1), marker.group(2)))
        elif fence:
            indent, lang = fence.groups()
            body, j = [], i + 1
            while j < len(lines) and lines[j].strip() != "```":
                body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
                j += 1
            if lang == "python":
                block = Block(len(blocks) + 1, i + 1, "\n".join(body) + "\n")
                for kind, value in markers:
                    if kind == "not-run":
                        if not value:
                            raise ValueError(f"line {i}: <!-- not-run: --> needs a reason")
                        block.not_run = value
                    elif kind == "requires":
                        block.requires.append(value)
                    else:
                        block.continues = True
                blocks.append(block)
            elif markers:
                raise ValueError(f"line {i + 1}: markers {markers} stand before a ```{lang} block")
            markers, i = [], j
        elif stripped and markers:
            raise ValueError(f"line {i + 1}: markers {markers} are not followed by a ```python block")
        i += 1
    return blocks


def program(blocks: list[Block], block: Block) -> str:
    """The code to run for ``block``: the blocks it continues, then itself."""
    chain = [block]
    while chain[0].continues:
        if chain[0].number == 1:
            raise ValueError(f"block at line {chain[0].line} continues, but no python block comes before it")
        chain.insert(0, blocks[chain[0].number - 2])
    return "\n".join(b.code for b in chain)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package of a dotted name is missing
        return False


def _name(document: Path) -> str:
    return document.relative_to(ROOT).as_posix()


# {document name: its python blocks}; BLOCKS: (document name, block) over all documents, for parametrisation
DOCUMENT_BLOCKS = {_name(doc): python_blocks(doc.read_text(encoding="utf-8")) for doc in DOCUMENTS}
BLOCKS = [(name, block) for name, blocks in DOCUMENT_BLOCKS.items() for block in blocks]


def test_markers_are_parsed():
    text = (
        "intro\n```python\na = 1\n```\n<!-- continues -->\n<!-- requires: some.module -->\n```python\nb = a\n```\n"
        "<!-- not-run: needs the hub -->\n  ```python\n  c = 3\n  ```\n```bash\nls\n```\n"
    )
    first, second, third = python_blocks(text)
    assert (first.code, first.continues, first.not_run) == ("a = 1\n", False, None)
    assert (second.continues, second.requires) == (True, ["some.module"])
    assert program([first, second, third], second) == "a = 1\n\nb = a\n"
    assert (third.not_run, third.code) == ("needs the hub", "c = 3\n")
    with pytest.raises(ValueError, match="needs a reason"):
        python_blocks("<!-- not-run: -->\n```python\nx\n```\n")
    with pytest.raises(ValueError, match="not followed by"):
        python_blocks("<!-- continues -->\ntext\n```python\nx\n```\n")


def test_every_block_is_run_or_marked_with_a_reason():
    assert DOCUMENT_BLOCKS["README.md"], "README.md has no ```python block"
    not_run = [f"{name} line {b.line}: {b.not_run}" for name, b in BLOCKS if b.not_run]
    print(f"README.md and docs/: {len(BLOCKS)} python blocks, {len(not_run)} not run: {not_run}")
    assert len(not_run) <= MAX_NOT_RUN, f"blocks not run: {not_run}; make them run offline"
    for name, block in BLOCKS:
        if block.continues:
            program(DOCUMENT_BLOCKS[name], block)  # raises when there is nothing to continue in that file


def test_ci_runs_the_readme_test_command_in_a_fresh_venv():
    commands = [line for line in README.read_text(encoding="utf-8").splitlines() if "python -m pytest" in line]
    assert commands, "README.md shows no test command (python -m pytest)"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[0].strip() in ci.splitlines(), f".ci/run must run the README's test command: {commands[0]}"
    script = [line.strip() for line in ci.splitlines()]
    venv = script.index('python -m venv "$VENV"')
    assert script.index('rm -rf "$VENV"') < venv < script.index('source "$VENV/bin/activate"')
    assert script.index('source "$VENV/bin/activate"') < script.index(commands[0].strip())
    ignored = subprocess.run(["git", "check-ignore", "-q", ".ci/venv/"], cwd=ROOT, check=False)
    assert ignored.returncode == 0, ".ci/venv/ must be git-ignored"


@pytest.mark.slow  # each block starts a Python process that imports torch and usually loads MiniLM
@pytest.mark.parametrize(("document", "block"), BLOCKS, ids=[f"{name}:line{b.line}" for name, b in BLOCKS])
def test_readme_block_runs(document: str, block: Block, tmp_path):
    if block.not_run:
        pytest.skip(f"{document} marks it not-run: {block.not_run}")
    for module in block.requires:
        if not _installed(module):
            pytest.skip(f"{module} is not installed (pip install -e '.[clients]')")
    code = program(DOCUMENT_BLOCKS[document], block)
    if "../shared" in code and not SHARED.is_dir():
        pytest.skip(f"shared data not found at {SHARED}")
    work = tmp_path / "work"
    work.mkdir()
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)
    (work / "snippet.py").write_text(code, encoding="utf-8")
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        MPLBACKEND="Agg",
        MTEB_CACHE=str(tmp_path / "mteb_cache"),
        CDE_ST_CACHE=str(tmp_path / "cde_st_cache"),
    )
    out = subprocess.run([sys.executable, "snippet.py"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{document} block at line {block.line} failed:\n{code}\n{out.stderr[-4000:]}"
