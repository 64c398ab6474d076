"""cde_st.training.tiny: the tiny encoder of --preset tiny and of the tests is built offline from nothing downloaded."""

from __future__ import annotations

import numpy as np
import pytest

from cde_st.training import TrainConfig, train
from cde_st.training.tiny import build_tiny_encoder, build_tiny_tokenizer, tiny_vocab


def test_tiny_tokenizer_reads_its_own_words_whole_and_anything_else_as_characters(tmp_path):
    tokenizer = build_tiny_tokenizer(tmp_path)
    assert len(tokenizer) == len(tiny_vocab()) == len(set(tiny_vocab()))
    assert tokenizer.tokenize("search_query: Question 12 about rain") == [
        "search", "_", "query", ":", "question", "12", "about", "rain",
    ]  # fmt: skip
    assert tokenizer.tokenize("Zebra!") == ["z", "##e", "##b", "##r", "##a", "!"]
    assert tokenizer.unk_token not in tokenizer.tokenize("any ASCII text, 42 ~ {x}")


def test_tiny_encoder_is_deterministic_per_seed(tmp_path):
    def weights(path):
        return (tmp_path / path / "model.safetensors").read_bytes()

    build_tiny_encoder(tmp_path / "a", seed=0)
    build_tiny_encoder(tmp_path / "b", seed=0)
    build_tiny_encoder(tmp_path / "c", seed=1)
    assert weights("a") == weights("b") != weights("c")
    assert (tmp_path / "a" / "vocab.txt").read_text().split("\n")[:3] == ["[PAD]", "[UNK]", "[CLS]"]


@pytest.mark.slow
def test_tiny_preset_trains_without_minilm(tmp_path, monkeypatch):
    """`--preset tiny` after a plain `pip install` (no offline MiniLM extra, no hub): nothing asks for MiniLM."""
    import cde_st.defaults
    import cde_st.training.run

    def no_minilm(*args, **kwargs):
        raise AssertionError("the tiny preset asked for all-MiniLM-L6-v2")

    for module in (cde_st.defaults, cde_st.training.run):
        monkeypatch.setattr(module, "default_surrogate_model_path", no_minilm)
        monkeypatch.setattr(module, "load_default_surrogate", no_minilm)
    train(TrainConfig.from_preset("tiny", output_dir=str(tmp_path / "run"), max_steps=2))
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()


def _pairs_file(path, n, domains=("forum", "faq")):
    import json

    rows = [
        {"query": f"question {i} about topic {i % 9}", "document": f"an answer {i} on topic {i % 9}", "domain": d}
        for i in range(n)
        for d in [domains[i % len(domains)]]
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_tiny_preset_embeds_only_the_pairs_its_steps_train_on(tmp_path, monkeypatch):
    """4 steps of 8 pairs over a 600-pair file: the clustering surrogate embeds the 46 sampled pairs (32 trained on,
    plus up to 7 per domain for each domain's short last batch), not all 600."""
    import cde_st.batching.dataset_clustering as dataset_clustering

    embedded = []
    real_embed_pairs = dataset_clustering.embed_pairs

    def counting_embed_pairs(model, queries, documents, **kwargs):
        embedded.append(len(queries))
        return real_embed_pairs(model, queries, documents, **kwargs)

    monkeypatch.setattr(dataset_clustering, "embed_pairs", counting_embed_pairs)
    data = _pairs_file(tmp_path / "pairs.jsonl", 600)
    cfg = TrainConfig.from_preset(
        "tiny", output_dir=str(tmp_path / "run"), train_data=[str(data)], filter_false_negatives=False
    )
    cfg.save_steps = 100  # no checkpoint: this test is about what gets embedded
    train(cfg)
    assert embedded == [4 * 8 + 2 * 7]
    import json

    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert (summary["steps"], summary["pairs"]) == (4, 46)
    about = (tmp_path / "run" / "final" / "README.md").read_text().split("<!-- cde_st:about begin -->")[1]
    assert (
        "trained with sentence-transformers' trainer and `FilteredInfoNCELoss` on 46 training pairs for 4 steps"
        in about
    )


def test_the_sample_of_a_max_steps_run_holds_full_batches_for_every_step():
    from datasets import Dataset

    from cde_st.batching import ClusteredBatchSampler
    from cde_st.training.pairs import pairs_for_max_steps

    # 8 domains of unequal sizes, as the shared pairs: the worst case leaves batch_size - 1 pairs short per domain.
    sizes = [300, 200, 120, 90, 60, 40, 25, 11]
    domains = [f"d{k}" for k, n in enumerate(sizes) for _ in range(n)]
    pairs = Dataset.from_dict(
        {"query": [f"q{i}" for i in range(len(domains))], "document": [f"d{i}" for i in range(len(domains))],
         "domain": domains}
    )  # fmt: skip
    for steps, batch, processes in [(4, 8, 1), (3, 16, 2), (10, 8, 1)]:
        sample = pairs_for_max_steps(pairs, steps, batch, processes, seed=1)
        assert len(sample) == steps * batch * processes + 8 * (batch - 1)
        rng = np.random.default_rng(0)
        sampler = ClusteredBatchSampler(
            sample.remove_columns("domain"), batch_size=batch, drop_last=False, domains=list(sample["domain"]),
            embeddings=(rng.normal(size=(len(sample), 4)), rng.normal(size=(len(sample), 4))), cache=False,
            num_replicas=1, show_progress_bar=False,
        )  # fmt: skip
        first = sampler.epoch_batches(0)[: steps * processes]
        assert all(len(b) == batch for b in first)
    assert pairs_for_max_steps(pairs, -1, 8) is pairs
    assert pairs_for_max_steps(pairs, 200, 8) is pairs  # the run needs them all
