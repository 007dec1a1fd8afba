"""`specdec generate` with --regex, --json-schema, --json-object and --grammar on a tiny random model
whose tokenizer is the toy byte-level one (tests/grammar_toy.py)."""

import json
import re

import pytest
import torch

from specdec.cli import main
from tests.grammar_toy import EOS, VOCAB, toy_tokenizer


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("toy-model")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=EOS, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path)
    toy_tokenizer().save_pretrained(path)
    return str(path)


def generate(capsys, toy_dir, *flags) -> dict:
    code = main(["generate", "--json", "--raw", "--threads", "1", "--target", toy_dir, "--draft", "lookup",
                 "--max-new-tokens", "24", *flags, "ab"])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_regex_output_matches_in_full(capsys, toy_dir):
    report = generate(capsys, toy_dir, "--regex", "(ab|ba)+c0")
    assert re.fullmatch("(ab|ba)+c0", report["text"]) or report["finish_reason"] == "length"
    assert report["constraint"] == {"kind": "regex"}


def test_json_schema_output_validates(capsys, toy_dir, tmp_path):
    schema = {"type": "object", "properties": {"a": {"enum": ["ab", "c"]}, "b": {"type": "integer", "maximum": 1}},
              "required": ["a", "b"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    report = generate(capsys, toy_dir, "--json-schema", str(path))
    assert report["finish_reason"] == "stop" and report["constraint"]["valid"], report


def test_grammar_file(capsys, toy_dir, tmp_path):
    path = tmp_path / "g.lark"
    path.write_text('start: "{" item ("," item)* "}"\nitem: "a" | "b" | "c"\n')
    report = generate(capsys, toy_dir, "--grammar", str(path))
    assert re.fullmatch(r"\{[abc](,[abc])*\}", report["text"]) or report["finish_reason"] == "length"


@pytest.mark.parametrize("flags, message", [
    (["--json-schema", "/no/such/schema.json"], "--json-schema: cannot read /no/such/schema.json"),
    (["--regex", "(ab"], "regex cannot be used"),
])
def test_bad_constraint_is_one_line_error(capsys, toy_dir, flags, message):
    code = main(["generate", "--raw", "--threads", "1", "--target", toy_dir, "--draft", "none", *flags, "ab"])
    assert code == 2
    assert message in capsys.readouterr().err
