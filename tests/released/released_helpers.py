"""What the released-model tests share: the reference fixture's folder (tiny random weights made with the public
reference code) and an edited copy of a release."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "cde_reference"


def copy_release(fixture_dir, tmp_path, version="v2", config=None, backbone=None, drop=()):
    """A copy of the fixture's ``version`` in ``tmp_path`` with ``config`` / ``backbone`` edits and ``drop``
    files removed."""
    folder = tmp_path / f"{version}-edited"
    shutil.copytree(fixture_dir / version, folder)
    for name, edits in (("config.json", config), ("backbone_config.json", backbone)):
        if edits:
            values = json.loads((folder / name).read_text(encoding="utf-8"))
            values.update(edits)
            (folder / name).write_text(json.dumps(values), encoding="utf-8")
    for name in drop:
        (folder / name).unlink()
    return folder
