"""`specdec bench lookup` at a tiny size: one row per category plus overall."""

from specdec.bench.lookup import CATEGORIES
from tests.helpers_tiny import assert_png, run_bench, scoreboard_rows, tiny_model_dir


def test_lookup_reports_every_category(tmp_path):
    target = tiny_model_dir(tmp_path / "target", seed=0, layers=1)
    code, data = run_bench(["lookup", "--target", str(target), "--max-new-tokens", "6", "--per-category", "1"],
                           tmp_path / "out")
    assert code == 0
    assert [row["category"] for row in data["categories"]] == list(CATEGORIES)
    for row in data["categories"] + [data["overall"]]:
        assert row["tau"] >= 1.0 and 0.0 <= row["alpha"] <= 1.0
        assert row["speedup"] > 0 and row["tokens_per_second"] > 0
    assert data["k"] == 5 and data["draft"] == "lookup"
    assert_png(data["plot"])
    assert len(scoreboard_rows(tmp_path / "out")) == 1
