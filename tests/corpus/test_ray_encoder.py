"""The Ray Data path on a local Ray with 2 CPUs: the same shards as one process, with the job's one context."""

from __future__ import annotations

import numpy as np
import pytest
from corpus_helpers import all_rows

from cde_st.corpus import embed_corpus

ray = pytest.importorskip("ray", reason='Ray is the distributed extra: pip install -e ".[distributed]"')


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_actors_embed_what_one_process_embeds(local_ray, tiny_cde, corpus_file, tmp_path):
    local = embed_corpus(tiny_cde, corpus_file, tmp_path / "local", shard_size=25, show_progress_bar=False)
    distributed = embed_corpus(
        tiny_cde, corpus_file, tmp_path / "ray", shard_size=25, batch_size=4, ray_workers=2, show_progress_bar=False
    )
    assert distributed["context"]["fingerprint"] == local["context"]["fingerprint"]
    assert [e["rows"] for e in distributed["shards"]] == [e["rows"] for e in local["shards"]]
    ids, embeddings = all_rows(tmp_path / "ray")
    local_ids, local_embeddings = all_rows(tmp_path / "local")
    assert ids == local_ids
    np.testing.assert_allclose(embeddings, local_embeddings, atol=1e-6)
