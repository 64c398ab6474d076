"""cde-st-embed --update / --recontextualize / --drift from the command line, and cde-st-search after them."""

from __future__ import annotations

import hashlib
import json

import pytest
from corpus_helpers import DOCS, write_jsonl

from cde_st.corpus import read_manifest
from cde_st.corpus.commands import embed_run, search_run

NEW = [{"_id": f"n{i}", "text": f"a new document {i} about wind"} for i in range(6)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, make_tiny_cde_module) -> str:
    path = tmp_path_factory.mktemp("model") / "cde"
    make_tiny_cde_module(context_size=8).save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def make_tiny_cde_module(tmp_path_factory):
    import torch

    from cde_st import ContextualSentenceTransformer
    from cde_st.training.tiny import build_tiny_encoder

    encoder = str(build_tiny_encoder(tmp_path_factory.mktemp("tiny_bert")))

    def make(context_size: int = 8):
        torch.manual_seed(0)
        return ContextualSentenceTransformer.from_encoder(
            encoder, context_size=context_size, max_seq_length=64, output_head="mlp", first_stage_residual=False,
            context_attention="joint",
        ).eval()  # fmt: skip

    return make


def _snapshot(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_update_then_search_and_drift_from_the_command_line(model_dir, tmp_path, capsys):
    out, v1 = tmp_path / "out", write_jsonl(tmp_path / "v1.jsonl", DOCS)
    assert embed_run([model_dir, v1, "--out", str(out), "--shard-size", "25", "--quiet"]) == 0
    v2 = write_jsonl(tmp_path / "v2.jsonl", [*DOCS[2:], *NEW])
    capsys.readouterr()
    assert embed_run([model_dir, v2, "--out", str(out), "--quiet", "--drift"]) == 0
    printed = capsys.readouterr().out
    assert "Drift 0.0%" in printed and "v2.jsonl changed since" in printed and "--update" in printed
    assert embed_run([model_dir, v2, "--out", str(out), "--update", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "to version 1: 6 added, 0 changed, 2 deleted, 58 unchanged; 64 documents" in printed
    assert "Drift " in printed and "changed since" not in printed
    assert search_run([str(out), "a new document about wind", "-k", "64", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out.splitlines()[-1])["hits"]
    assert {h["id"] for h in hits} == {d["_id"] for d in [*DOCS[2:], *NEW]}
    assert embed_run([model_dir, v2, "--out", str(out), "--drift", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[-1])
    manifest = read_manifest(out)
    assert record["generation"] == 1 and record["corpus_changed"] is False
    assert record["drift"]["drift_percent"] == manifest["history"][-1]["drift_percent"]
    assert record["drift"]["rows"] == 64 and 0 <= record["drift"]["below"] <= 64
    # Without --update, a folder of another corpus is still refused, now pointing at --update.
    assert embed_run([model_dir, v1, "--out", str(out), "--shard-size", "25", "--quiet"]) == 2
    assert "Pass --update to bring the folder up to date" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--update", "--context", "model"], "--context cannot be given with --update: an update embeds with the "),
        (["--update", "--context-size", "4"], "--context-size cannot be given with --update"),
        (["--update", "--seed", "1"], "--seed cannot be given with --update"),
        (["--recontextualize", "--context", "model"], "--context cannot be given with --recontextualize"),
        (["--update", "--dtype", "int8"], "stores dtype 'float32'; this run asks for 'int8'"),
    ],
)
def test_options_an_update_cannot_take_are_refused_in_one_line(model_dir, tmp_path, capsys, extra, message):
    out, v1 = tmp_path / "out", write_jsonl(tmp_path / "v1.jsonl", DOCS)
    assert embed_run([model_dir, v1, "--out", str(out), "--quiet", "--index", "none"]) == 0
    before = _snapshot(out)
    v2 = write_jsonl(tmp_path / "v2.jsonl", [*DOCS, *NEW])
    capsys.readouterr()
    assert embed_run([model_dir, v2, "--out", str(out), "--quiet", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1] and "Traceback" not in "\n".join(err)
    assert _snapshot(out) == before


def test_an_update_naming_a_repeated_id_or_an_unknown_folder_fails_in_one_line(model_dir, tmp_path, capsys):
    out, v1 = tmp_path / "out", write_jsonl(tmp_path / "v1.jsonl", DOCS)
    assert embed_run([model_dir, v1, "--out", str(out), "--quiet", "--index", "none"]) == 0
    before = _snapshot(out)
    repeated = write_jsonl(tmp_path / "r.jsonl", [*DOCS[:3], DOCS[1]])
    capsys.readouterr()
    assert embed_run([model_dir, repeated, "--out", str(out), "--update", "--quiet"]) == 2
    assert "r.jsonl:4: duplicate id 'd1' (first at" in capsys.readouterr().err
    assert _snapshot(out) == before
    assert embed_run([model_dir, v1, "--out", str(tmp_path / "none"), "--update", "--quiet"]) == 2
    assert "no cde-st-embed folder to update" in capsys.readouterr().err
    assert embed_run([model_dir, v1, "--out", str(tmp_path / "none"), "--drift"]) == 2
    assert "no cde-st-embed folder (no manifest.json)" in capsys.readouterr().err


def test_an_update_loads_the_model_as_the_folder_records_it(model_dir, tmp_path, capsys):
    out, v1 = tmp_path / "out", write_jsonl(tmp_path / "v1.jsonl", DOCS)
    assert embed_run([model_dir, v1, "--out", str(out), "--quiet", "--max-seq-length", "16", "--index", "none"]) == 0
    v2 = write_jsonl(tmp_path / "v2.jsonl", [*DOCS, *NEW])
    assert embed_run([model_dir, v2, "--out", str(out), "--update", "--quiet"]) == 0, capsys.readouterr().err
    manifest = read_manifest(out)
    assert manifest["max_seq_length"] == 16 and manifest["counts"]["embedded"] == 66
    assert embed_run([model_dir, v2, "--out", str(out), "--update", "--quiet", "--max-seq-length", "32"]) == 2
    assert "model fingerprint" in capsys.readouterr().err
