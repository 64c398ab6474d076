"""The stored-context file format (cde_st/context_files.py) has one reader: the server loads its contexts with
it and ``cde-st-embed --context`` reads an exported file through it, so a damaged file is refused by both with the
same message."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save

from cde_st.context_errors import ContextDamaged
from cde_st.context_files import METADATA_KEY, StoredContext, holds_context, read, write
from cde_st.corpus.corpus_context import read_context_file


def _vectors(rows: int = 4) -> torch.Tensor:
    return torch.randn(rows, 8, generator=torch.Generator().manual_seed(0))


def _context(vectors: torch.Tensor, size: int | None = None) -> StoredContext:
    return StoredContext("docs", "f", len(vectors) if size is None else size, 0, vectors, model_identity="0" * 16)


def _flipped_bit(folder):
    path = write(folder, _context(_vectors()))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # a flipped bit in the last vector
    path.write_bytes(bytes(data))
    return path


def _unreadable_metadata(folder):
    path = folder / "docs.safetensors"
    path.write_bytes(save({"vectors": _vectors()}, metadata={METADATA_KEY: "{not json"}))
    return path


def _no_vectors(folder):
    path = folder / "docs.safetensors"
    path.write_bytes(save({"other": _vectors()}, metadata={METADATA_KEY: json.dumps(_context(_vectors()).metadata())}))
    return path


def _non_finite(folder):
    vectors = _vectors()
    vectors[1, 2] = float("nan")
    return write(folder, _context(vectors))  # its checksum matches: the NaN was written, not flipped in later


def _wrong_size(folder):
    return write(folder, _context(_vectors(), size=5))


DAMAGES = {
    "flipped bit": (_flipped_bit, "its checksum does not match"),
    "unreadable metadata": (_unreadable_metadata, "not a readable context file"),
    "no vectors": (_no_vectors, "not a cde-st-serve context file"),
    "non-finite": (_non_finite, "NaN or infinite"),
    "wrong size": (_wrong_size, r"do not match size=5"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_file_is_refused_alike_by_the_server_and_the_embed_tool(damage, tmp_path):
    make, fault = DAMAGES[damage]
    path = make(tmp_path)
    with pytest.raises(ContextDamaged, match=fault) as by_server:
        read(path, "docs")
    with pytest.raises(ValueError) as by_embed_tool:
        read_context_file(path)
    assert str(by_embed_tool.value).startswith(f"{by_server.value} cde-st-serve refuses this file too")


def test_an_intact_file_reads_alike_even_renamed(tmp_path):
    vectors = _vectors()
    path = write(tmp_path, _context(vectors))
    assert torch.equal(read(path, "docs").vectors, vectors)
    copy = tmp_path / "copied.safetensors"
    shutil.copy(path, copy)
    read_back = read_context_file(copy)  # a copy may be renamed: the name it records is kept
    assert torch.equal(torch.from_numpy(read_back.vectors), vectors)
    assert read_back.details == {"served_name": "docs", "served_fingerprint": "f"}
    assert read(copy).name == "docs"


def test_only_files_written_as_contexts_are_read_as_contexts(tmp_path):
    path = write(tmp_path, _context(_vectors()))
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        assert holds_context(f.metadata())
    assert not holds_context({"cde_st_corpus": "{}"}) and not holds_context(None)
