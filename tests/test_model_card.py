"""The README.md a contextual model writes on save(): context description, loading route, a snippet that runs."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from cde_st import ContextualSentenceTransformer
from cde_st.model_card import ABOUT_BEGIN, ABOUT_END, SECTION_BEGIN, SECTION_END
from cde_st.prompts import DOCUMENT_PROMPT

CORPUS = [f"document {i} about {topic}" for i, topic in enumerate(["cats", "rain", "planets", "tea"] * 3)]


def _section(folder) -> str:
    card = (folder / "README.md").read_text(encoding="utf8")
    assert card.count(SECTION_BEGIN) == 1 and card.count(SECTION_END) == 1
    return card[card.index(SECTION_BEGIN) : card.index(SECTION_END)]


def _snippet(section: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, blocks
    return blocks[0]


def _floats(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+\.\d+", text)]


def _run(snippet: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "README.md snippet", "exec"), {"__name__": "__main__"})
    return out.getvalue()


@pytest.mark.parametrize("with_context", [True, False], ids=["context", "no-context"])
def test_model_card_snippet_runs_as_written(make_tiny_cde, tmp_path, with_context):
    model = make_tiny_cde(context_size=4)
    if with_context:
        info = model.set_context(CORPUS, seed=3)
    folder = tmp_path / "my-cde"
    model.save(str(folder))
    section = _section(folder)

    # (1) the context: what it is and how it was set, or that none is set
    if with_context:
        for fact in (
            info.fingerprint,
            "seed 3",
            f"corpus of {len(CORPUS)} texts",
            repr(DOCUMENT_PROMPT),
            "4 documents",
        ):
            assert fact in section, fact
    else:
        assert "No corpus context is saved" in section and "model.set_context(documents, seed=0)" in section
    # (2) the loading route, and why not trust_remote_code
    assert "ContextualSentenceTransformer(path_or_id)" in section
    assert "trust_remote_code=True" in section and "runs code from the folder" in section

    # (3) the snippet runs as written (it names the saved folder) and prints what the card says it prints
    snippet = _snippet(section)
    assert f"ContextualSentenceTransformer({str(folder)!r})" in snippet
    assert "trust_remote_code=True" not in snippet
    printed = _run(snippet)
    expected = "\n".join(line[2:] for line in snippet.splitlines() if line.startswith("# tensor"))
    assert expected, snippet
    assert _floats(printed.split("tensor", 1)[1]) == pytest.approx(_floats(expected), abs=2e-4)
    if with_context:
        assert f"{info.size} {info.fingerprint}" in printed


def test_model_card_refreshed_when_a_loaded_model_is_saved_again(make_tiny_cde, tmp_path):
    # sentence-transformers reuses the README of a loaded folder on save(): the cde_st section must still describe
    # the context and folder of *this* save.
    model = make_tiny_cde(context_size=4)
    old = model.set_context(CORPUS, seed=0)
    model.save(str(tmp_path / "first"))

    loaded = ContextualSentenceTransformer(str(tmp_path / "first"))
    new = loaded.set_context(CORPUS[:6], seed=1)
    assert new.fingerprint != old.fingerprint
    loaded.save(str(tmp_path / "second"))
    section = _section(tmp_path / "second")
    assert new.fingerprint in section and old.fingerprint not in section
    assert "corpus of 6 texts" in section
    assert f"ContextualSentenceTransformer({str(tmp_path / 'second')!r})" in section
    _run(_snippet(section))

    loaded.clear_context()
    loaded.save(str(tmp_path / "third"))
    assert "No corpus context is saved" in _section(tmp_path / "third")


@pytest.mark.slow
@pytest.mark.parametrize("context_size", [64, 512])
def test_model_card_snippet_ranks_mars_first_for_an_untrained_minilm_model(minilm, tmp_path, context_size):
    """the card of an untrained model built from all-MiniLM-L6-v2 printed 0.985 / 0.987 / 0.987 for
    Venus, Mars and Saturn at J = 512 (joint attention); the model now starts as MiniLM and ranks Mars first."""
    model = ContextualSentenceTransformer.from_encoder(minilm, context_size=context_size)
    model.save(str(tmp_path / "m"))
    snippet = _snippet(_section(tmp_path / "m"))
    assert "Venus" in snippet and "Mars" in snippet and "Saturn" in snippet
    printed = "\n".join(line[2:] for line in snippet.splitlines() if line.startswith("# tensor"))
    venus, mars, saturn = _floats(printed)
    assert mars > max(venus, saturn) + 0.05


def _about(card: str) -> str:
    assert card.count(ABOUT_BEGIN) == 1 and card.count(ABOUT_END) == 1, card[:2000]
    return card.split(ABOUT_BEGIN)[1].split(ABOUT_END)[0]


@pytest.mark.parametrize("gated", [True, False])
def test_model_card_opens_with_what_the_model_is_how_it_was_made_and_how_to_load_it(make_tiny_cde, tmp_path, gated):
    """Not sentence-transformers' "This is a sentence-transformers model trained.": a contextual model, untrained,
    loaded with ContextualSentenceTransformer (never trust_remote_code)."""
    options = {"context_attention": "cached", "context_gate": True, "output_head": "none"} if gated else {}
    model = make_tiny_cde(context_size=4, **options)
    model.save(str(tmp_path / "m"))
    card = (tmp_path / "m" / "README.md").read_text()
    assert "model trained." not in card
    about = _about(card)
    assert card.index(ABOUT_BEGIN) < card.index("## Model Details")  # the card's first paragraph
    assert "contextual document embedding" in about and "embeds 4 documents" in about
    assert "has not been trained" in about
    assert ("gives that encoder's own embeddings" in about) is gated
    assert "`ContextualSentenceTransformer(path_or_id)`" in about and "trust_remote_code=True`; that is not" in about
    # Saved again after loading: the card is reused and still opens with the same paragraph.
    ContextualSentenceTransformer(str(tmp_path / "m")).save(str(tmp_path / "again"))
    assert _about((tmp_path / "again" / "README.md").read_text()) == about


def test_loading_a_saved_folder_does_not_warn_about_its_document_default_prompt(make_tiny_cde, tmp_path, caplog):
    """The folder saves default_prompt_name="document" on purpose (encode() embeds like encode_document); the
    sentence-transformers warning about it would greet every load and evaluation."""
    import logging

    make_tiny_cde(context_size=4).save(str(tmp_path / "m"))
    logging.Logger.warning_once.cache_clear()  # transformers warns once per process: make this load the first
    with caplog.at_level(logging.INFO):
        model = ContextualSentenceTransformer(str(tmp_path / "m"))
    assert model.default_prompt_name == "document"
    assert not [r for r in caplog.records if "Default prompt name" in r.getMessage()]
