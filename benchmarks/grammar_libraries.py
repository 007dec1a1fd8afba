"""Pick the grammar library: mask cost per step and rollback exactness of llguidance and xgrammar on
the embedded model's tokenizer (SmolLM2-135M-Instruct, 49152 tokens).

    PYTHONPATH=src python benchmarks/grammar_libraries.py [--repeats 3] [--json results/grammar-libraries.json]

For each library and each of the workload's schemas (src/specdec/data/structured/, or a built-in one):
compile once (timed), then walk the tokens of a valid document, timing the mask at every step (the
mask as a bitmask on the host, what the engine computes per verified position). Rollback: at every
step, advance N = 1..4 tokens along the document, roll back N, and compare the mask bit for bit with
the mask before; a library is exact where every comparison matches. Validity: whether the JSON schema
grammar lets a raw control character (U+0002, one token of this vocabulary) into a string, which
JSON forbids (json.loads refuses such a document).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}}, "active": {"type": "boolean"}},
    "required": ["name", "age", "email", "tags", "active"], "additionalProperties": False}
DOCUMENT = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "engines"],
            "active": True}


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab: int):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self._lib, self._torch = llguidance, llguidance.torch
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)

    def compile(self, schema: dict):
        grammar = self._lib.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        return grammar

    def matcher(self, compiled):
        return self._lib.LLMatcher(self.tok, compiled, log_level=0)

    def mask(self, m) -> torch.Tensor:
        self._torch.fill_next_token_bitmask(m, self.bitmask, 0)
        return self.bitmask[0].clone()

    def accept(self, m, token: int) -> bool:
        return m.consume_token(token)

    def rollback(self, m, n: int) -> None:
        m.rollback(n)


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab: int):
        import xgrammar

        self._lib = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        self.compiler = xgrammar.GrammarCompiler(info)
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab)

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

    def matcher(self, compiled):
        return self._lib.GrammarMatcher(compiled, max_rollback_tokens=16)

    def mask(self, m) -> torch.Tensor:
        m.fill_next_token_bitmask(self.bitmask)
        return self.bitmask[0].clone()

    def accept(self, m, token: int) -> bool:
        return m.accept_token(token)

    def rollback(self, m, n: int) -> None:
        m.rollback(n)


def measure(lib, schema: dict, document: dict, tokenizer, repeats: int) -> dict:
    """Compile seconds, per-step mask microseconds (median, p90, max), rollback mismatches."""
    start = time.perf_counter()
    compiled = lib.compile(schema)
    matcher = lib.matcher(compiled)
    compile_s = time.perf_counter() - start
    tokens = tokenizer.encode(json.dumps(document, separators=(",", ":")), add_special_tokens=False)
    times, mismatches, checks = [], 0, 0
    for _ in range(repeats):
        m = lib.matcher(compiled)
        for i, token in enumerate(tokens):
            t0 = time.perf_counter()
            before = lib.mask(m)
            times.append(time.perf_counter() - t0)
            for n in range(1, 5):
                ahead = tokens[i:i + n]
                if len(ahead) < n:
                    break
                if not all(lib.accept(m, t) for t in ahead):
                    raise RuntimeError(f"{lib.name} refused the valid document at token {i}")
                lib.rollback(m, n)
                checks += 1
                mismatches += int(not torch.equal(before, lib.mask(m)))
            if not lib.accept(m, token):
                raise RuntimeError(f"{lib.name} refused the valid document at token {i}")
    us = sorted(t * 1e6 for t in times)
    return {"library": lib.name, "tokens": len(tokens), "compile_s": compile_s, "mask_us_median": statistics.median(us),
            "mask_us_p90": us[int(0.9 * (len(us) - 1))], "mask_us_max": us[-1], "rollback_checks": checks,
            "rollback_mismatches": mismatches, "matcher": type(matcher).__name__}


def accepts_control_character(lib, tokenizer) -> bool:
    """Whether the library's grammar for {"s": string} or {"s": string of at most 4 characters} takes
    a raw U+0002 inside the string."""
    admits = False
    for string in ({"type": "string"}, {"type": "string", "maxLength": 4}):
        schema = {"type": "object", "properties": {"s": string}, "required": ["s"], "additionalProperties": False}
        m = lib.matcher(lib.compile(schema))
        if not all(lib.accept(m, t) for t in tokenizer.encode('{"s":"', add_special_tokens=False)):
            raise RuntimeError(f"{lib.name} refused the opening of a valid document")
        admits |= all(lib.accept(m, t) for t in tokenizer.encode("\x02", add_special_tokens=False))
    return admits


def workload() -> list[tuple[dict, dict]]:
    """(schema, a valid document) pairs: the structured workload's when present, else the built-in one."""
    try:
        from specdec.constraints.workload import load_tasks
        return [(t.schema, t.example) for t in load_tasks()]
    except ImportError:
        return [(SCHEMA, DOCUMENT)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="save the rows here")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from specdec.models import default as default_model

    tokenizer = AutoTokenizer.from_pretrained(str(default_model.prepared_dir()))
    vocab = len(tokenizer)
    rows = []
    for cls in (LLGuidance, XGrammar):
        t0 = time.perf_counter()
        lib = cls(tokenizer, vocab)
        setup = time.perf_counter() - t0
        results = [measure(lib, s, d, tokenizer, args.repeats) for s, d in workload()]
        med = statistics.median(r["mask_us_median"] for r in results)
        row = {"library": lib.name, "tokenizer_setup_s": setup, "vocab": vocab, "schemas": len(results),
               "mask_us_median_of_medians": med, "mask_us_worst_p90": max(r["mask_us_p90"] for r in results),
               "mask_us_max": max(r["mask_us_max"] for r in results),
               "compile_s_median": statistics.median(r["compile_s"] for r in results),
               "rollback_checks": sum(r["rollback_checks"] for r in results),
               "rollback_mismatches": sum(r["rollback_mismatches"] for r in results),
               "string_admits_control_character": accepts_control_character(lib, tokenizer)}
        rows.append(row)
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
