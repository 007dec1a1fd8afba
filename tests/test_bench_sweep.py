"""`specdec bench sweep` at a tiny size: alpha, tau, c, measured and predicted speedup for each K."""

from tests.helpers_tiny import assert_png, run_bench, scoreboard_rows, tiny_model_dir


def test_sweep_reports_every_k_at_both_temperatures(tmp_path):
    target = tiny_model_dir(tmp_path / "target", seed=0, layers=1)
    code, data = run_bench(["sweep", "--target", str(target), "--draft", "self-int8", "--ks", "1-2",
                            "--max-new-tokens", "6", "--num-prompts", "1", "--c-trials", "2"], tmp_path / "out")
    assert code == 0
    assert data["draft"].startswith("self-int8")
    assert set(data["by_temperature"]) == {"0.0", "1.0"}
    for result in data["by_temperature"].values():
        assert result["c"] > 0
        assert [row["k"] for row in result["rows"]] == [1, 2]
        for row in result["rows"]:
            assert 0.0 <= row["alpha"] <= 1.0 and 0.0 <= row["accept_rate"] <= 1.0
            assert len(row["alpha_by_position"]) == row["k"]
            assert 1.0 <= row["tau"] <= row["k"] + 1
            assert row["speedup"] > 0 and row["predicted_speedup"] > 0
    assert data["best_k"]["0.0"]["measured"] in (1, 2)
    assert data["cost"]["draft_step_s"] > 0 and data["cost"]["target_step_s"] > 0
    assert_png(data["plot"])
    assert len(scoreboard_rows(tmp_path / "out")) == 1
