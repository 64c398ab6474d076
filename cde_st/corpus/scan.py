"""The job's first pass over the corpus: every record checked, ids checked for repeats, records counted, and (for a
contextual model without a given context) the context sampled, all in one streaming read.

Checking everything before embedding anything means a bad record deep in a large corpus fails the job in minutes,
not after hours of embedding, and the count gives the progress bar its total.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from cde_st.context import BottomKSample
from cde_st.corpus.duplicate_ids import DuplicateIds
from cde_st.corpus.readers import CorpusBatch, CorpusReader

__all__ = ["IDS_TABLE", "SCAN_BATCH", "ScanResult", "scan_corpus"]

#: Records per batch of the scan (memory per batch only).
SCAN_BATCH = 4096
#: The table of ids seen (in the job's folder), removed after the scan.
IDS_TABLE = ".ids.sqlite"


@dataclass
class ScanResult:
    """What the scan found.

    Attributes:
        records: positions in the stream (valid or not): the shards are cut by position.
        valid: records that will be embedded.
        skipped: reason -> count of the records left out (``skip_invalid`` only).
        duplicate_positions: positions of records left out because their id came earlier (``skip_invalid`` only;
            the embedding pass leaves them out too, as it reads records one at a time).
        sample: the context sample (None when none was asked for).
    """

    records: int
    valid: int
    skipped: dict[str, int] = field(default_factory=dict)
    duplicate_positions: list[int] = field(default_factory=list)
    sample: list[str] | None = None

    def to_dict(self) -> dict:
        """The manifest's record of the scan (without the sample, which lives on as vectors)."""
        return {
            "records": self.records,
            "valid": self.valid,
            "skipped": dict(self.skipped),
            "duplicate_positions": self.duplicate_positions,
        }


def scan_corpus(
    reader: CorpusReader,
    work_dir: str | Path,
    sample: BottomKSample | None = None,
    show_progress_bar: bool = True,
    on_batch: Callable[[CorpusBatch, set[int]], None] | None = None,
) -> ScanResult:
    """Read the whole corpus once: check each record (errors name the file and line), find repeated ids (a SQLite
    table in ``work_dir``, removed afterwards: memory stays bounded), count, and offer each text to ``sample``.

    A repeated id raises :class:`~cde_st.data.DataError` naming both places, or with ``reader.skip_invalid`` the
    later record is left out and counted. ``on_batch(batch, repeated)`` sees each batch with the indexes of its
    records left out as repeats (an update compares the records with the folder's as it scans).
    """
    reader.skipped = Counter()
    duplicates: list[int] = []
    valid = 0
    bar = tqdm(desc="Scanning corpus", unit=" records", disable=not show_progress_bar)
    with DuplicateIds(Path(work_dir) / IDS_TABLE) as seen:
        for batch in reader.batches(SCAN_BATCH):
            repeated = dict(seen.add_batch(batch.ids, batch.wheres))
            for i, first in repeated.items():
                reader.reject(f"duplicate id {batch.ids[i]!r} (first at {first})", batch.wheres[i], "duplicate id")
                duplicates.append(batch.positions[i])
            if sample is not None:  # at their stream positions: the order of a sample kept in corpus order
                kept = [i for i in range(len(batch)) if i not in repeated]
                sample.offer_many([batch.texts[i] for i in kept], [batch.positions[i] for i in kept])
            if on_batch is not None:
                on_batch(batch, set(repeated))
            valid += len(batch) - len(repeated)
            bar.update(len(batch))
    bar.close()
    return ScanResult(
        records=reader.records_seen,
        valid=valid,
        skipped=dict(reader.skipped),
        duplicate_positions=duplicates,
        sample=None if sample is None else sample.texts(),
    )
