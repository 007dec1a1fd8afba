"""The embedded model (SmolLM2-135M) under JSON schemas of the structured workload: speculative constrained
decoding (drafter `auto`, grammar drafts) gives plain constrained decoding's tokens, and the answers validate."""

import json

import jsonschema
import pytest

from specdec.constraints import ConstraintSpec
from specdec.constraints.grammar import GrammarCompiler
from specdec.constraints.workload import load_tasks
from specdec.drafters import NoDrafter
from specdec.engine import Engine
from specdec.generation import GenerationConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runtime():
    from specdec.runtime import build_runtime

    return build_runtime("default", "auto", threads=1)


def test_speculative_constrained_equals_plain_constrained_and_validates(runtime):
    loaded = runtime.target
    plain = Engine(loaded.model, NoDrafter(loaded.model.device), runtime.engine.eos_token_ids, runtime.decode,
                   grammars=GrammarCompiler(loaded.tokenizer, loaded.model.vocab_size, grammar_drafts=False))
    for task in load_tasks()[::11]:  # three schemas
        ids = runtime.encode(task.prompt)
        config = GenerationConfig(max_new_tokens=80, k=4, constraint=ConstraintSpec.json_schema(task.schema))
        spec = runtime.engine.generate(ids, config)
        assert spec.token_ids == plain.generate(ids, config).token_ids
        assert spec.finish_reason == "stop"
        jsonschema.validate(json.loads(runtime.decode(spec.token_ids)), task.schema)
        assert spec.stats.grammar_accepted > 0 and spec.stats.rounds < len(spec.token_ids)
