"""`specdec bench exactness`: passes on the real rule, fails loudly with each classic bug injected.

The target is a tiny model over a dozen words with peaked logits (a few likely tokens, so a few
hundred samples resolve them); the draft is the same model with logits three times sharper, so q is
far from p where p is uncertain, which is where the sampling bugs show. skip-rollback and
unmapped-draft-ids are caught by the deterministic checks (greedy identity, vocabulary guard).
"""

import pytest

from specdec.bench.exactness import homogeneity_test
from tests.helpers_tiny import run_bench, scoreboard_rows, tiny_model_dir

ARGS = ["--samples", "300", "--positions", "2", "-k", "2", "--top-k", "4", "--top-p", "0.95"]
WORDS = "the a cat dog sun sea tree house one two three four".split()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("exactness")
    target = tiny_model_dir(root / "target", seed=0, layers=1, scale=10.0, words=WORDS)
    draft = tiny_model_dir(root / "draft", seed=0, layers=1, scale=30.0, words=WORDS)
    return str(target), str(draft)


def test_homogeneity_test_pools_rare_tokens():
    same = [1] * 50 + [2] * 50 + [3, 4, 5]
    p_value, columns = homogeneity_test(same, list(reversed(same)), min_expected=5)
    assert p_value > 0.9 and columns == 2
    p_value, _ = homogeneity_test([1] * 90 + [2] * 10, [1] * 10 + [2] * 90, min_expected=5)
    assert p_value < 1e-6
    assert homogeneity_test([7] * 20, [7] * 20, 5) == (1.0, 1)


def test_exactness_passes_without_fault(pair, tmp_path):
    target, draft = pair
    code, data = run_bench(["exactness", "--target", target, "--draft", draft, *ARGS], tmp_path)
    assert code == 0 and data["verdict"] == "PASS"
    assert data["greedy"]["identical"] and data["vocabulary_guard"]
    assert len(data["settings"]) == 2 and all(len(tests) == 2 for tests in data["settings"].values())
    assert all(0.0 <= t["p_value"] <= 1.0 for tests in data["settings"].values() for t in tests)
    assert len(scoreboard_rows(tmp_path)) == 1


@pytest.mark.parametrize("fault", ["resample-from-p", "skip-rollback", "softmax-as-q", "unmapped-draft-ids"])
def test_exactness_fails_loudly_with_a_fault(pair, tmp_path, fault, capsys):
    target, draft = pair
    code, data = run_bench(["exactness", "--target", target, "--draft", draft, *ARGS,
                            "--inject-fault", fault], tmp_path)
    assert code == 1 and data["verdict"] == "FAIL" and data["fault"] == fault
    assert "FAIL" in capsys.readouterr().out
