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
from preloaded_python import run_python

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


def _cannot_run(document: str, block: Block) -> str | None:
    """Why ``block`` is not run here (its not-run marker, or a module it requires missing), or None."""
    if block.not_run:
        return f"{document} marks it not-run: {block.not_run}"
    missing = [module for module in block.requires if not _installed(module)]
    if not missing:
        return None
    extra = _EXTRA_OF.get(missing[0], "clients")
    return f"{missing[0]} is not installed (pip install -e '.[{extra}]')"


# The extra that installs a module a snippet requires, where it is not `clients`.
_EXTRA_OF = {"lancedb": "lancedb", "chromadb": "chroma", "onnxruntime": "onnx"}


def chain(document: str, blocks: list[Block], block: Block) -> list[Block]:
    """The blocks run together with ``block``: those it continues, itself, and the blocks after it that continue it
    and can run here. One process runs them all, once for all of them: the blocks of a chain ran again for each
    block continuing them when every block had its own process."""
    start = blocks.index(block)
    while blocks[start].continues and start > 0:
        start -= 1
    end = blocks.index(block) + 1
    while end < len(blocks) and blocks[end].continues and _cannot_run(document, blocks[end]) is None:
        end += 1
    return blocks[start:end]


_SNIPPET_LINE = re.compile(r'File ".*snippet\.py", line (\d+)')
_CHAIN_RUNS: dict[tuple[str, int, int], tuple[int, str, list[int]]] = {}  # one run of each chain per process


def _run_chain(document: str, blocks: list[Block], workdir: Path) -> tuple[int, str, list[int]]:
    """Run ``blocks`` in one fresh Python process in ``workdir``; (return code, stderr, each block's first line in
    the program)."""
    key = (document, blocks[0].line, blocks[-1].line)
    if key not in _CHAIN_RUNS:
        code, starts = "", []
        for block in blocks:
            starts.append(code.count("\n") + 1)
            code += block.code + "\n"
        work = workdir / "work"
        work.mkdir()
        if SHARED.is_dir():
            (workdir / "shared").symlink_to(SHARED)
        (work / "snippet.py").write_text(code, encoding="utf-8")
        env = dict(os.environ)
        env.update(
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            MPLBACKEND="Agg",
            MTEB_CACHE=str(workdir / "mteb_cache"),
            CDE_ST_CACHE=str(workdir / "cde_st_cache"),
        )
        out = run_python(["snippet.py"], cwd=work, env=env, timeout=600)
        _CHAIN_RUNS[key] = (out.returncode, out.stderr, starts)
    return _CHAIN_RUNS[key]


@pytest.mark.slow  # each chain of blocks starts a Python process that imports torch and usually loads MiniLM
@pytest.mark.parametrize(("document", "block"), BLOCKS, ids=[f"{name}:line{b.line}" for name, b in BLOCKS])
def test_readme_block_runs(document: str, block: Block, tmp_path_factory):
    blocks = DOCUMENT_BLOCKS[document]
    together = chain(document, blocks, block)
    if (reason := _cannot_run(document, block)) is not None:
        pytest.skip(reason)
    for earlier in together[: together.index(block)]:
        if (reason := _cannot_run(document, earlier)) is not None:
            pytest.skip(f"{reason}; needed by the block at line {earlier.line}, which this one continues")
    code = "".join(b.code for b in together)
    if "../shared" in code and not SHARED.is_dir():
        pytest.skip(f"shared data not found at {SHARED}")
    failure = _failure(document, together, block, _run_chain(document, together, tmp_path_factory.mktemp("readme")))
    assert failure is None, failure


def _failure(document: str, together: list[Block], block: Block, run: tuple[int, str, list[int]]) -> str | None:
    """What failed up to ``block`` in the run of its chain (the block named, with the traceback), or None."""
    returncode, stderr, starts = run
    if returncode == 0:
        return None
    lines = [int(n) for n in _SNIPPET_LINE.findall(stderr)]
    # The first frame in snippet.py is the module-level statement that failed; no frame: the process died.
    failed = sum(start <= lines[0] for start in starts) - 1 if lines else 0
    if together.index(block) < failed:
        return None  # it ran to its end; a block after it failed
    program = "".join(b.code for b in together[: together.index(block) + 1])
    line = together[failed].line
    return f"{document} block at line {line} failed (return code {returncode}):\n{program}\n{stderr[-4000:]}"


def test_a_chain_runs_once_and_names_the_block_that_failed(tmp_path):
    text = "```python\na = 1\n```\n<!-- continues -->\n```python\nb = a + 1\n```\n<!-- continues -->\n"
    text += "```python\nc = b\nprint(1 / 0)\n```\n<!-- continues -->\n<!-- requires: no_such_module_here -->\n"
    text += "```python\nd = c\n```\n"
    blocks = python_blocks(text)
    together = chain("doc.md", blocks, blocks[0])
    assert together == blocks[:3]  # the fourth cannot run here
    assert all(chain("doc.md", blocks, b) == together for b in together)
    run = _run_chain("doc.md", together, tmp_path)
    assert _run_chain("doc.md", together, tmp_path) is run  # once for the whole chain
    assert _failure("doc.md", together, blocks[0], run) is None
    assert _failure("doc.md", together, blocks[1], run) is None
    failure = _failure("doc.md", together, blocks[2], run)
    assert (
        failure is not None and failure.startswith("doc.md block at line 9 failed") and "ZeroDivisionError" in failure
    )


def test_a_missing_snippet_module_names_the_extra_that_installs_it(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "_installed", lambda module: False)
    for module, extra in [("chromadb", "chroma"), ("lancedb", "lancedb"), ("langchain_openai", "clients")]:
        block = Block(number=1, line=1, code="", requires=[module])
        assert _cannot_run("doc.md", block) == f"{module} is not installed (pip install -e '.[{extra}]')"
