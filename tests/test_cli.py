"""The CLI: JSON output, --compare, calc, and bad input answered with one clear line and exit 2."""

import json
import subprocess
import sys

import pytest

from specdec.cli import main
from tests.helpers_tiny import WORDS, tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-models")
    return {
        "target": str(tiny_model_dir(root / "target", seed=0)),
        "draft": str(tiny_model_dir(root / "draft", seed=1, layers=1)),
        "other": str(tiny_model_dir(root / "other", seed=2, words=list(reversed(WORDS)))),
    }


def run_json(capsys, *args):
    assert main(["generate", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_has_text_ids_and_stats(capsys, tiny_dirs):
    out = run_json(capsys, "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "-k", "3",
                   "--max-new-tokens", "12", "--ignore-eos", "write a short story about the sea")
    stats = out["stats"]
    assert len(out["token_ids"]) == 12 and isinstance(out["text"], str)
    for field in ("rounds", "drafted", "accepted", "acceptance_rate", "tokens_per_round", "tokens_per_second"):
        assert field in stats
    assert 0.0 <= stats["acceptance_rate"] <= 1.0 and stats["tokens_per_round"] >= 1.0


@pytest.mark.parametrize("draft", ["lookup", "draft", "none"])
def test_compare_reports_identical_greedy_tokens(capsys, tiny_dirs, draft):
    out = run_json(capsys, "--target", tiny_dirs["target"], "--draft", tiny_dirs.get(draft, draft),
                   "--max-new-tokens", "16", "--ignore-eos", "--compare", "the cat and the dog and the cat")
    assert out["compare"]["identical"] is True
    assert out["compare"]["plain_token_ids"] == out["token_ids"]


def test_same_seed_same_sampled_tokens(capsys, tiny_dirs):
    args = ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--temperature", "1",
            "--seed", "7", "--max-new-tokens", "12", "--ignore-eos", "the sun"]
    assert run_json(capsys, *args)["token_ids"] == run_json(capsys, *args)["token_ids"]


def test_streamed_output_and_stats_table(capsys, tiny_dirs):
    assert main(["generate", "--target", tiny_dirs["target"], "--max-new-tokens", "8", "--ignore-eos",
                 "--raw", "the moon"]) == 0
    out = capsys.readouterr().out
    assert "tokens per round" in out and "acceptance rate" in out


def test_the_thread_count_is_shown_and_can_be_set(capsys, tiny_dirs):
    args = ["--target", tiny_dirs["target"], "--max-new-tokens", "4", "--ignore-eos", "--raw", "the moon"]
    assert main(["generate", "--threads", "1", *args]) == 0
    assert "1 CPU thread (--threads)" in " ".join(capsys.readouterr().out.split())  # the table's title, maybe wrapped
    assert run_json(capsys, "--threads", "1", *args)["threads"] == 1


def test_calc_marks_best_k(capsys):
    assert main(["calc", "--alpha", "0.8", "--k", "4", "--c", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "<- best" in out and "expected speedup" in out


@pytest.mark.parametrize("args, message", [
    (["generate", "   "], "prompt is empty"),
    (["generate", "--target", "/no/such/model", "hi"], "model path not found"),
    (["generate", "--target", "not-a-model.gguf", "hi"], "GGUF file not found"),
    (["calc", "--alpha", "1.5", "--c", "0.1"], "alpha must be in [0, 1]"),
    (["generate", "--top-p", "0", "hi"], "top_p must be in (0, 1]"),
    (["generate", "--temperature", "-1", "hi"], "temperature must be >= 0"),
])
def test_bad_input_is_one_clear_line(capsys, args, message):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_an_internal_value_error_keeps_its_traceback(monkeypatch):
    """Only specdec's own input errors (SpecdecError) become one line: a bug elsewhere is not hidden."""
    from specdec.commands import calc

    def broken(args):
        raise ValueError("an internal bug")

    monkeypatch.setattr(calc, "run", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["calc", "--alpha", "0.5", "--c", "0.1"])


def test_a_specdec_error_from_a_command_is_one_line(capsys, monkeypatch):
    from specdec.commands import calc
    from specdec.errors import DraftSpecError

    def refused(args):
        raise DraftSpecError("the head's MIN_CONF must be in [0, 1)")

    monkeypatch.setattr(calc, "run", refused)
    assert main(["calc", "--alpha", "0.5", "--c", "0.1"]) == 2
    assert capsys.readouterr().err == "specdec: error: the head's MIN_CONF must be in [0, 1)\n"


def test_a_draft_of_another_tokenizer_drafts_exactly(capsys, tiny_dirs):
    """`other` orders the words differently: its ids are mapped through text (docs/drafts.md)."""
    out = run_json(capsys, "--target", tiny_dirs["target"], "--draft", tiny_dirs["other"], "-k", "3",
                   "--max-new-tokens", "16", "--ignore-eos", "--compare", "the cat and the dog and the cat")
    assert out["compare"]["identical"] is True and out["stats"]["drafted"] > 0


def test_unmapped_draft_ids_fault_takes_the_foreign_draft_for_the_targets(tiny_dirs):
    """The classic bug 'a draft of another tokenizer, its ids unmapped' is what the fault injects."""
    from specdec import faults
    from specdec.drafters import make_drafter
    from specdec.drafters.cross_tokenizer import TextDrafter
    from specdec.drafters.model import ModelDrafter
    from specdec.models.loader import load_model

    target = load_model(tiny_dirs["target"])
    assert isinstance(make_drafter(tiny_dirs["other"], target), TextDrafter)
    assert isinstance(make_drafter(tiny_dirs["draft"], target), ModelDrafter)
    with faults.inject("unmapped-draft-ids"):
        assert isinstance(make_drafter(tiny_dirs["other"], target), ModelDrafter)


def test_unknown_draft_name(capsys, tiny_dirs):
    assert main(["generate", "--target", tiny_dirs["target"], "--draft", "./no-such-draft", "hi"]) == 2
    assert "unknown draft" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["-k", "0"], ["--max-new-tokens", "0"], ["-k", "two"]])
def test_out_of_range_flags_exit_2_without_traceback(flag):
    proc = subprocess.run([sys.executable, "-m", "specdec.cli", "generate", *flag, "hi"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "-" in proc.stderr


def test_megakernel_draft_off_a_hopper_gpu_is_one_clear_line(capsys, tiny_dirs):
    """`--draft megakernel:MODEL` needs specdec's native model on a Hopper GPU; on this CPU it says so."""
    assert main(["generate", "--target", tiny_dirs["target"], "--draft", f"megakernel:{tiny_dirs['draft']}", "hi"]) == 2
    err = capsys.readouterr().err
    assert "megakernel" in err and "drop megakernel:" in err and "Traceback" not in err
    assert "unknown draft" not in err  # the model is known; it is the machine that cannot run it so


def test_the_cli_builds_its_parser_without_the_server_libraries():
    # register() must stay cheap: a GPU host without FastAPI/uvicorn still runs `specdec bench gpu`.
    import subprocess
    import sys

    code = ("import sys\nfor m in ('uvicorn', 'pydantic', 'fastapi', 'h11', 'starlette'): sys.modules[m] = None\n"
            "from specdec.cli import build_parser\nbuild_parser().parse_args(['bench', 'gpu', '--smoke'])")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
