"""`specdec bench structured` end to end on a tiny random Llama over the embedded model's tokenizer: five
modes, and every constrained mode gives plain constrained decoding's tokens."""

import pytest

from tests.helpers_tiny import default_tokenizer_random_llama, run_bench


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tokenizer, model = default_tokenizer_random_llama()
    path = tmp_path_factory.mktemp("tiny-49k")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_structured_bench_reports_every_mode_and_identity(model_dir, tmp_path):
    code, data = run_bench(["structured", "--target", model_dir, "--draft", "lookup", "--tasks", "2",
                            "--max-new-tokens", "12", "--mask-check"], tmp_path)
    assert code == 0
    modes = {row["mode"]: row for row in data["modes"]}
    assert list(modes) == ["plain", "spec", "plain constrained", "grammar drafts", "spec constrained",
                           "spec constrained, masks in line", "spec constrained, A/A copy"]
    for mode in list(modes)[2:]:
        assert modes[mode]["identical_to_plain_constrained"] == 1.0
        assert modes[mode]["mask_ms_per_step"] > 0
    assert modes["spec constrained"]["masks_beside_pass_ms_per_step"] > 0
    assert modes["spec constrained, masks in line"]["masks_beside_pass_ms_per_step"] == 0
    assert modes["grammar drafts"]["tau"] > 1.0  # the schema's keys come as free drafts
