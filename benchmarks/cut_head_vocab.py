"""Give a trained draft head a different sub-vocabulary: `python benchmarks/cut_head_vocab.py IN REF OUT`.

The head predicts a feature; its logits are that feature times the rows of the target's LM head for
the ids in its sub-vocabulary, so the ids can be changed after training (only drafts change, never
the output: exactness does not depend on which tokens a draft may propose). OUT is IN's weights with
REF's ids. The shipped SmolLM2 head was trained with 16,384 ids and cut to the 8,192 of the head
shipped before it (commit 607b096), because on the 2-core CPU each draft step reads those rows:
8,192 rows cost about 1.7 ms less per step than 16,384.
"""

import dataclasses
import json
import sys

from safetensors import safe_open

from specdec.drafters.head import DraftHead


def main(src: str, ref: str, out: str) -> None:
    head, ids = DraftHead.load(src), DraftHead.load(ref).vocab_ids
    cut = DraftHead(dataclasses.replace(head.config, draft_vocab=int(ids.shape[0])), ids)
    cut.load_state_dict({**head.state_dict(), "vocab_ids": ids})
    with safe_open(src, framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get("meta", "{}"))
    meta["vocabulary_cut"] = f"trained with {head.config.draft_vocab} ids; drafts from the {ids.shape[0]} ids of {ref}"
    cut.save(out, meta=meta)
    print(f"{out}: {head.config.draft_vocab} -> {ids.shape[0]} ids ({len(set(ids.tolist()) & set(head.vocab_ids.tolist()))} shared)")


if __name__ == "__main__":
    main(*sys.argv[1:4])
