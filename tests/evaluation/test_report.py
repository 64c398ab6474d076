"""Summary tables: per-type averages and the context-size sweep."""

from __future__ import annotations

from cde_st.evaluation import report


def _score(task, task_type, value, size=0):
    return report.TaskScore(task, task_type, "m", "test", value, "corpus", size, 0)


def test_type_averages_and_sweep_outputs(tmp_path):
    scores = [
        _score("a", "Classification", 60.0),
        _score("b", "Classification", 70.0),
        _score("c", "Retrieval", 40.0),
        _score("d", "STS", 80.0),
    ]
    row = report.type_averages(scores)
    assert row["Class."] == 65.0 and row["Retrieval"] == 40.0 and row["STS"] == 80.0
    assert row["Clust."] is None and row["Avg"] == 62.5
    sweep = [_score("c", "Retrieval", v, j) for j, v in [(0, 40.0), (16, 42.0), (64, 45.0)]]
    table = report.sweep_markdown(sweep, "sweep")
    assert "| c | 40.00 | 42.00 | 45.00 |" in table
    png = report.plot_sweep(sweep, tmp_path / "sweep.png", "sweep")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
