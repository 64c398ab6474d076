"""CI: fail when a test was skipped for a reason outside the allowlist of optional skips below.

Why: the suite skips whole groups of tests when something it needs is missing (the offline MiniLM package,
``../shared``, the released-model fixture, model2vec, beir, ...). A CI run on a machine without them would
skip most of the suite and still pass. This check reads the JUnit XML report pytest wrote (``.ci/run`` asks
for it through ``PYTEST_ADDOPTS``, so the README's test command stays as written), prints every skipped test
with its reason and whether it is allowed, and exits non-zero when any skip is not allowed.

Allowed skips are those a CI run may rightly have: optional clients that ``.[dev]`` does not install, README
blocks marked not-run because they need the Hugging Face hub, and tests of what happens *without* something
(an uncached hub model, a CUDA-less torch) on a machine that has it. An expected failure (xfail) is listed but
is not a skip.

Usage: ``python .ci/check_skips.py REPORT.xml`` (exit 0: no skip outside the allowlist; 1: some, or the
report is missing, unreadable or holds no test).
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Allowed:
    """A skip CI accepts: the test's name (without parameters) and the skip reason both match."""

    test: str  # regex, full match on the test function's name
    reason: str  # regex, matched at the start of the skip reason
    why: str


ALLOWLIST: tuple[Allowed, ...] = (
    Allowed(
        test=r"test_langchain|test_llamaindex|test_readme_block_runs",
        reason=r"(langchain_huggingface|langchain_openai|llama_index\.embeddings\.huggingface) is not installed\b",
        why="LangChain / LlamaIndex client (also LangChain's OpenAI client of docs/serving.md): optional (.[clients]), not in .[dev]",
    ),
    Allowed(
        test=r"test_readme_block_runs",
        reason=r"(README|[\w./-]+\.md) marks it not-run: needs the Hugging Face hub\b",
        why="README/docs block marked not-run: it needs the Hugging Face hub (CI runs offline)",
    ),
    Allowed(
        test=r"test_eval_of_an_uncached_hub_model_offline_is_one_line_naming_it"
        r"|test_train_paper_preset_offline_is_one_line_naming_the_base_model",
        reason=r"\S+ is in the local cache here$",
        why="tests the error for an uncached hub model; this machine has it cached",
    ),
    Allowed(
        test=r"test_eval_device_cuda_without_cuda_names_the_option",
        reason=r"this torch sees a CUDA device$",
        why="tests the error for --device cuda without CUDA; this machine has CUDA",
    ),
)


@dataclass(frozen=True)
class Skip:
    """One skipped test of the report."""

    test_id: str
    name: str
    reason: str

    def allowed_by(self) -> Allowed | None:
        """The allowlist entry that accepts this skip, or ``None``."""
        base = self.name.split("[", 1)[0]
        for entry in ALLOWLIST:
            if re.fullmatch(entry.test, base) and re.match(entry.reason, self.reason):
                return entry
        return None


def read_report(path: Path) -> tuple[int, list[Skip], list[str]]:
    """The number of test cases, the skips and the ids of the expected failures in a JUnit XML report."""
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    skips: list[Skip] = []
    xfails: list[str] = []
    for case in cases:
        classname, name = case.get("classname", ""), case.get("name", "")
        test_id = f"{classname}::{name}" if classname else name
        for skipped in case.findall("skipped"):
            if skipped.get("type") == "pytest.xfail":
                xfails.append(test_id)
                continue
            reason = skipped.get("message") or (skipped.text or "").split(": ", 1)[-1]
            skips.append(Skip(test_id, name, reason.strip()))
    return len(cases), skips, xfails


def main(argv: list[str]) -> int:
    """Print the skips of the report given in ``argv`` and return the exit status (see the module docstring)."""
    if len(argv) != 1:
        print("usage: python .ci/check_skips.py REPORT.xml", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        total, skips, xfails = read_report(path)
    except (OSError, ET.ParseError) as exc:
        print(f"CI: cannot read the pytest report {path} ({exc}); failing", file=sys.stderr)
        return 1
    if total == 0:
        print(f"CI: the pytest report {path} holds no test; failing", file=sys.stderr)
        return 1

    refused = [skip for skip in skips if skip.allowed_by() is None]
    print(f"CI: {total} tests in the report, {len(skips)} skipped ({len(refused)} not allowed), {len(xfails)} xfailed")
    for skip in skips:
        entry = skip.allowed_by()
        verdict = f"allowed: {entry.why}" if entry else "NOT ALLOWED"
        print(f"  SKIPPED {skip.test_id}\n      reason: {skip.reason}\n      {verdict}")
    for test_id in xfails:
        print(f"  XFAIL   {test_id}")
    if refused:
        print(
            f"CI: failing: {len(refused)} test(s) skipped for a reason outside the allowlist of .ci/check_skips.py "
            "(install what they need, or provide the data or fixtures they name).",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
