"""What the grammar could draft beyond llguidance's fast-forward tokens, on the structured workload.

    PYTHONPATH=src python benchmarks/structured_forced.py

At every prefix of each task's valid document (tokenized as the embedded model's tokenizer writes it),
after consuming the fast-forward tokens: whether the next position allows a single token (then a mask
there would draft one more token; SequenceConstraint no longer computes it), and whether the forced
text is longer than the fast-forward tokens' (then _forced_guess drafts the rest).
"""

from __future__ import annotations

import torch


def main() -> None:
    import llguidance.torch
    from transformers import AutoTokenizer

    from specdec.constraints import ConstraintSpec, masking
    from specdec.constraints.grammar import GrammarCompiler, dumps_compact
    from specdec.constraints.workload import load_tasks
    from specdec.models import default

    tokenizer = AutoTokenizer.from_pretrained(str(default.prepared_dir()))
    grammars = GrammarCompiler(tokenizer)
    words = (grammars.mask_width + 31) // 32
    states = single = held_back = 0
    for task in load_tasks():
        spec = ConstraintSpec.json_schema(task.schema)
        document = tokenizer.encode(dumps_compact(task.example), add_special_tokens=False)
        for start in range(len(document)):
            matcher = grammars.matcher(spec)
            if start and not matcher.consume_tokens(document[:start]):
                raise SystemExit(f"{task.id}: the grammar refused its own example at token {start}")
            forced, fast_forward = matcher.compute_ff_bytes(), matcher.compute_ff_tokens()
            held_back += len(forced) > len(grammars.ll_tokenizer.decode_bytes(fast_forward))
            matcher.consume_tokens(fast_forward)
            if matcher.is_stopped():
                continue
            bits = torch.zeros(1, words, dtype=torch.int32)
            llguidance.torch.fill_next_token_bitmask(matcher, bits, 0)
            states += 1
            single += masking.only_token(bits[0]) is not None
    print(f"{states} states after the fast-forward tokens: {single} allow a single token; "
          f"forced text held back by the fast-forward tokens at {held_back} prefixes")


if __name__ == "__main__":
    main()
