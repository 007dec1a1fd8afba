"""`specdec bench verify-cost` on a tiny random model: JSON fields, plot, scoreboard row."""

from tests.helpers_tiny import assert_png, run_bench, scoreboard_rows, tiny_model_dir


def test_verify_cost_reports_each_n_with_ratio_to_one(tmp_path):
    target = tiny_model_dir(tmp_path / "target", seed=0, layers=1)
    code, data = run_bench(["verify-cost", "--target", str(target), "--prompt-tokens", "16", "--n", "1,2,4",
                            "--trials", "2"], tmp_path / "out")
    assert code == 0
    assert [row["n"] for row in data["rows"]] == [1, 2, 4]
    assert data["rows"][0]["ratio"] == 1.0
    assert all(row["median_s"] > 0 and len(row["trials_s"]) == 2 for row in data["rows"])
    assert data["prompt_tokens"] == 16
    assert_png(data["plot"])
    assert len(scoreboard_rows(tmp_path / "out")) == 1


def test_no_scoreboard_skips_the_row(tmp_path):
    target = tiny_model_dir(tmp_path / "target", seed=0, layers=1)
    code, data = run_bench(["verify-cost", "--target", str(target), "--prompt-tokens", "8", "--n", "1,2",
                            "--trials", "1", "--no-scoreboard"], tmp_path / "out")
    assert code == 0 and data["rows"]
    assert scoreboard_rows(tmp_path / "out") == []


def test_alternating_timing_gives_every_model_every_trial(tiny_target, tiny_draft):
    from specdec.bench.verify_cost import median_cells, time_alternating

    times = time_alternating({"a": tiny_target, "b": tiny_draft}, [1, 2, 3, 4], [1, 3], trials=3)
    assert {name: {n: len(ts) for n, ts in by_n.items()} for name, by_n in times.items()} == \
        {"a": {1: 3, 3: 3}, "b": {1: 3, 3: 3}}
    assert tiny_target.cache_len == 0 and tiny_draft.cache_len == 0  # each left empty after its trial
    cells = median_cells(times, 1, 1)
    assert len(cells) == 2 and all(c.endswith("( 1.00x)") for c in cells)
