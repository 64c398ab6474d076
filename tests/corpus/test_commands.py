"""cde-st-embed and cde-st-search report an error as the other commands do: one line ``error: ...`` on stderr and
exit status 2 (the traceback with --debug); counts below one are refused while the arguments are read."""

from __future__ import annotations

import pytest

from cde_st.corpus.commands import embed_main, search_main
from cde_st.corpus.index import search_index


@pytest.fixture
def model_dir(tiny_plain, tmp_path) -> str:
    tiny_plain.save(str(tmp_path / "model"))
    return str(tmp_path / "model")


def _error_line(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err  # after the model's loading bars, if any
    assert stop.value.code == 2 and err.splitlines()[-1].startswith("error: ") and "Traceback" not in err, err
    return err.splitlines()[-1]


def test_errors_are_one_line_and_status_2_with_the_traceback_on_debug(model_dir, corpus_file, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    embed = [model_dir, corpus_file, "--out", str(mine), "--quiet"]
    assert "mine is not empty and is not a cde-st-embed folder" in _error_line(embed_main, embed, capsys)
    missing = [model_dir, str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o"), "--quiet"]
    assert "missing.jsonl: no such file or folder" in _error_line(embed_main, missing, capsys)
    assert "mine has no manifest.json" in _error_line(search_main, [str(mine), "rain"], capsys)
    assert "nothing: no such folder" in _error_line(search_main, [str(tmp_path / "nothing"), "rain"], capsys)
    with pytest.raises(FileExistsError, match="is not empty"):
        embed_main([*embed, "--debug"])
    assert (mine / "notes.txt").read_text() == "the user's" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(
    "main, argv, message",
    [
        (search_main, ["DIR", "rain", "-k", "0"], "argument -k: expected an integer >= 1, got '0'"),
        (search_main, ["DIR", "rain", "--nprobe", "-1"], "argument --nprobe: expected an integer >= 1, got '-1'"),
        (search_main, ["DIR", "rain", "-k", "ten"], "argument -k: expected an integer >= 1, got 'ten'"),
        (
            embed_main,
            ["M", "c.jsonl", "--out", "o", "--context-size", "0"],
            "argument --context-size: expected an integer >= 1",
        ),
        (
            embed_main,
            ["M", "c.jsonl", "--out", "o", "--shard-size", "0"],
            "argument --shard-size: expected an integer >= 1",
        ),
    ],
)
def test_counts_below_one_are_refused_when_the_arguments_are_read(main, argv, message, capsys):
    assert message in _error_line(main, argv, capsys)


def test_search_index_refuses_counts_below_one(tmp_path):
    with pytest.raises(ValueError, match=r"k \(-k\) must be at least 1, got 0"):
        search_index(tmp_path, None, ["rain"], k=0)
    with pytest.raises(ValueError, match=r"nprobe \(--nprobe\) must be at least 1, got -1"):
        search_index(tmp_path, None, ["rain"], nprobe=-1)


def test_a_damaged_served_context_is_one_line_with_the_servers_message(make_tiny_cde, corpus_file, tmp_path, capsys):
    """``--context`` given a cde-st-serve context file reads it with the server's reader: the server's message."""
    import torch

    from cde_st.context_errors import ContextDamaged
    from cde_st.context_files import StoredContext, read, write
    from cde_st.fingerprints import model_fingerprint

    model = make_tiny_cde(context_size=4)
    model.save(str(tmp_path / "model"))
    vectors = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    path = write(tmp_path, StoredContext("docs", "f", 4, 0, vectors, model_identity=model_fingerprint(model)))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # a flipped bit in the last vector
    path.write_bytes(bytes(data))
    with pytest.raises(ContextDamaged) as by_server:
        read(path, "docs")
    embed = [str(tmp_path / "model"), corpus_file, "--out", str(tmp_path / "out"), "--context", str(path), "--quiet"]
    assert str(by_server.value) in _error_line(embed_main, embed, capsys)
