"""The released models' reference fixture (``../shared/fixtures/cde_reference``); its tests skip with a reason
where it is absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from released_helpers import FIXTURE


@pytest.fixture(scope="module")
def fixture_dir() -> Path:
    if not (FIXTURE / "v2" / "model.safetensors").is_file():
        pytest.skip(f"CDE reference fixture not found at {FIXTURE}")
    return FIXTURE


@pytest.fixture(scope="module")
def inputs(fixture_dir) -> dict:
    return json.loads((fixture_dir / "inputs.json").read_text(encoding="utf-8"))
