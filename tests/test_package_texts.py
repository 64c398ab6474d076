"""What the installed package says to a pip user: no path of this repository's checkout (``../shared``), which a
pip user does not have, in any file the package ships (code, help texts, docstrings, presets)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cde_st"


def test_package_files_do_not_name_the_repository_data_folder():
    shipped = [p for p in PACKAGE.rglob("*") if p.suffix in {".py", ".yaml", ".yml", ".json", ".md", ".txt"}]
    assert len(shipped) > 50  # the package itself, not an empty glob
    named = [
        f"{p.relative_to(PACKAGE)}:{n}"
        for p in shipped
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "../shared" in line or "shared/data" in line
    ]
    assert not named, f"the package names this repository's ../shared folder: {named}"


def test_command_help_texts_give_placeholders(capsys):
    import pytest

    from cde_st.cli import eval_main, train_main

    for main in (train_main, eval_main):
        with pytest.raises(SystemExit):
            main(["--help"])
        text = capsys.readouterr().out
        assert "shared" not in text and ("path/to/" in text or "<data-dir>" in text), text
