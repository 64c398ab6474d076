"""What a source encoder's folder does around its transformer (cde_st/modules/source_pipeline.py), and the errors
for a location that is not one."""

from __future__ import annotations

import pytest
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

from cde_st.modules.source_pipeline import SourcePipeline, check_encoder_location, read_source_pipeline


def test_a_plain_hf_folder_means_mean_pooling_and_no_normalisation(tiny_bert_dir):
    assert read_source_pipeline(tiny_bert_dir) == SourcePipeline(tiny_bert_dir)


def test_a_sentence_transformers_folder_tells_its_length_pooling_and_normalisation(tiny_bert_dir, tmp_path):
    transformer = Transformer(tiny_bert_dir, max_seq_length=48)
    pooling = Pooling(transformer.get_embedding_dimension(), "cls")
    SentenceTransformer(modules=[transformer, pooling, Normalize()]).save(str(tmp_path / "st"))
    pipeline = read_source_pipeline(str(tmp_path / "st"))
    assert (pipeline.max_seq_length, pipeline.pooling_mode, pipeline.normalize) == (48, "cls", True)
    assert pipeline.model_dir.startswith(str(tmp_path / "st"))


def test_the_offline_minilm(minilm):
    pipeline = read_source_pipeline(minilm)
    assert (pipeline.max_seq_length, pipeline.pooling_mode, pipeline.normalize) == (256, "mean", True)


def test_a_missing_folder_or_a_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_encoder_location(str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file, not a folder"):
        check_encoder_location(str(tmp_path / "file"))


def test_an_uncached_hub_id_offline_says_the_cache_is_all_there_is(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache"):
        check_encoder_location("nobody-here/no-such-encoder")


def test_a_sentence_transformers_folder_without_a_transformer(tmp_path):
    (tmp_path / "modules.json").write_text('[{"idx": 0, "name": "0", "path": "", "type": "x.Normalize"}]')
    with pytest.raises(ValueError, match="without a Transformer module"):
        read_source_pipeline(str(tmp_path))
