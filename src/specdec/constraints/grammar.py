"""Compile ConstraintSpecs into llguidance grammars for one tokenizer, once per spec, and start matchers.

Why llguidance (docs/structured.md, benchmarks/grammar_libraries.py): both it and xgrammar roll back
N tokens exactly, and xgrammar's mask is cheaper (a median 4 us a step on the embedded model's 49152
tokens against 24 us), but xgrammar 0.2.9's JSON-schema grammar lets raw control characters into a
string bounded by maxLength (U+0002 is one token here), which JSON forbids: documents that
json.loads refuses. llguidance refuses them. Its 24 us a mask, K + 1 masks a round, stay under 5 %
of a target step on the CPU (about 40 ms) and on the GPU's 8B shape (about 4.6 ms) at K = 4.
JSON is compiled without free whitespace (compact separators): a model may otherwise pad a document
with whitespace forever, and compact JSON forces more of its tokens.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from specdec.constraints.spec import ConstraintSpec
from specdec.errors import InvalidRequestError

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
CACHE_SIZE = 256  # compiled grammars kept (least recently used go first)


class GrammarCompiler:
    """Grammars for one tokenizer. tokenizer: a fast Hugging Face tokenizer; vocab_size: the width of
    the target's logits (None: the tokenizer's size); tokens past the tokenizer's are never allowed
    (the masks are the tokenizer's width, padded when unpacked: llguidance told of a wider vocabulary
    took 140 ms a mask for 128256 logits over this 49152-token tokenizer, against tens of us).
    The llguidance tokenizer is built on the first compile (about 2 s for 49152 tokens), so a
    runtime that never constrains never pays for it. Thread-safe (a server compiles in its handlers)."""

    def __init__(self, tokenizer, vocab_size: int | None = None, grammar_drafts: bool = True,
                 overlap_masks: bool = True):
        """grammar_drafts: whether sequences draft the tokens their grammar dictates (False: plain
        constrained decoding, one token a step where nothing else drafts; a benchmark's baseline).
        overlap_masks: compute the verify's masks while the target's pass runs (constraints.overlap;
        False: before it, in the step's critical path; a benchmark's baseline)."""
        self._hf_tokenizer = tokenizer
        self.grammar_drafts = grammar_drafts
        self.overlap_masks = overlap_masks
        self.vocab_size = vocab_size or len(tokenizer)
        self._ll_tokenizer = None
        self._cache: OrderedDict[ConstraintSpec, str] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self):
        """The llguidance tokenizer (built once)."""
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                try:
                    self._ll_tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer)
                except ValueError as exc:
                    raise InvalidRequestError(f"structured output is not available for this model: llguidance "
                                              f"cannot read its tokenizer ({exc})") from None
            return self._ll_tokenizer

    @property
    def mask_width(self) -> int:
        """The tokens a mask covers: the tokenizer's (the bitmask holds ceil(mask_width / 32) words)."""
        return self.ll_tokenizer.vocab_size

    def compile(self, spec: ConstraintSpec) -> str:
        """The spec's grammar, checked against the tokenizer; InvalidRequestError saying what is wrong
        with a bad schema, regex or grammar."""
        with self._lock:
            if spec in self._cache:
                self._cache.move_to_end(spec)
                return self._cache[spec]
        grammar = _grammar_of(spec)
        import llguidance

        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
        if is_error:
            raise InvalidRequestError(f"the {spec.kind.replace('_', ' ')} cannot be used: {messages[0]}")
        with self._lock:
            self._cache[spec] = grammar
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar

    def matcher(self, spec: ConstraintSpec):
        """A fresh llguidance matcher for the spec (compiled grammar from the cache)."""
        import llguidance

        matcher = llguidance.LLMatcher(self.ll_tokenizer, self.compile(spec), log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"the {spec.kind.replace('_', ' ')} cannot be used: {matcher.get_error()}")
        return matcher


def _grammar_of(spec: ConstraintSpec) -> str:
    import llguidance

    if spec.kind in ("json_schema", "json_object"):
        schema = spec.schema
        _check_schema(schema)
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as exc:
            raise InvalidRequestError(f"the JSON schema cannot be used: {exc}") from None
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.text)
    from llguidance.gbnf_to_lark import any_to_lark

    try:  # GBNF (`root ::= ...`, as llama.cpp and vLLM's xgrammar backend take) or Lark (`start: ...`)
        return llguidance.LLMatcher.grammar_from_lark(any_to_lark(spec.text))
    except Exception as exc:  # the converter raises plain errors on text it cannot parse
        raise InvalidRequestError(f"the grammar cannot be used: {exc}") from None


def _check_schema(schema: dict) -> None:
    """InvalidRequestError for a schema that breaks the JSON Schema meta-schema (e.g. "type": "objekt")."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise InvalidRequestError(f"the JSON schema is invalid at {where}: {exc.message}") from None


def dumps_compact(value) -> str:
    """A JSON document as the compiled grammars write it (no whitespace)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
