"""`specdec bench specbench` at a tiny size, with the transformers generate() baseline."""

import json

from specdec.bench.specbench import QUESTIONS, category_sizes, load_questions, weighted_to_file
from tests.helpers_tiny import assert_png, run_bench, scoreboard_rows, tiny_model_dir


def test_shipped_questions_are_spec_bench():
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
    assert len(rows) == 480 and len({r["category"] for r in rows}) == 13
    assert (QUESTIONS.parent / "LICENSE").exists()


def test_per_category_takes_the_first_n_of_each():
    chosen = load_questions(str(QUESTIONS), 2, "rag,summarization")
    assert [q["category"] for q in chosen].count("rag") == 2 and len(chosen) == 4


def test_rates_are_weighted_by_each_categorys_size_in_the_file():
    sizes = category_sizes(str(QUESTIONS))
    assert sizes["rag"] == 80 and sizes["writing"] == 10 and sum(sizes.values()) == 480
    rows = [{"category": "writing", "tau": 3.0, "alpha_judged": 0.9, "alpha_by_position": [0.9, 0.8]},
            {"category": "rag", "tau": 1.5, "alpha_judged": 0.45, "alpha_by_position": [0.45]}]
    w = weighted_to_file(rows, sizes)
    assert w["questions_per_category"] == {"writing": 10, "rag": 80}
    assert abs(w["tau"] - (10 * 3.0 + 80 * 1.5) / 90) < 1e-12
    assert abs(w["alpha_judged"] - 0.5) < 1e-12 and abs(w["alpha_by_position"][0] - 0.5) < 1e-12
    assert w["alpha_by_position"][1] == 0.8  # only writing reached a second draft


def test_specbench_reports_categories_overall_and_hf_baseline(tmp_path):
    target = tiny_model_dir(tmp_path / "target", seed=0, layers=1)
    code, data = run_bench(["specbench", "--target", str(target), "--categories", "summarization,writing",
                            "--max-new-tokens", "6", "--hf-baseline"], tmp_path / "out")
    assert code == 0
    assert [row["category"] for row in data["categories"]] == ["writing", "summarization"]
    for row in data["categories"] + [data["overall"]]:
        assert row["tau"] >= 1.0 and row["speedup"] > 0
        assert row["hf_tokens_per_second"] > 0 and row["plain_vs_hf"] > 0
    assert data["overall"]["questions"] == 2
    assert data["weighted_to_question_file"]["questions_per_category"] == {"writing": 10, "summarization": 80}
    assert_png(data["plot"])
    assert len(scoreboard_rows(tmp_path / "out")) == 1


def test_unknown_category_is_one_line_error(tmp_path, capsys):
    code, _ = run_bench(["specbench", "--categories", "poetry"], tmp_path / "out")
    assert code == 2 and "unknown categories" in capsys.readouterr().err


def test_specbench_samples_at_a_temperature_and_reports_acceptance_by_position(tmp_path):
    target = tiny_model_dir(tmp_path / "target", seed=0, layers=1)
    code, data = run_bench(["specbench", "--target", str(target), "--draft", "self-int8", "--categories", "writing",
                            "--max-new-tokens", "8", "-k", "3", "--temperature", "1", "--seed", "5"], tmp_path / "out")
    assert code == 0
    assert data["temperature"] == 1.0 and data["seed"] == 5
    overall = data["overall"]
    assert len(overall["alpha_by_position"]) == 3
    assert all(0.0 <= a <= 1.0 for a in overall["alpha_by_position"]) and 0.0 <= overall["alpha_judged"] <= 1.0


def test_specbench_refuses_a_sampled_hf_baseline(tmp_path, capsys):
    code, _ = run_bench(["specbench", "--temperature", "1", "--hf-baseline"], tmp_path / "out")
    assert code == 2 and "greedy" in capsys.readouterr().err
