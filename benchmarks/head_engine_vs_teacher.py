"""Does the head keep in the engine what it agrees with teacher-forced? `python benchmarks/head_engine_vs_teacher.py HEAD`

For the first `--per-category` Spec-Bench questions of each category: the target's plain greedy
answer, the target's features of prompt + answer (`forward_with_hidden` with the head's layers),
the head's teacher-forced greedy agreement per draft step on them (`trainer.evaluate`, the
training-time measure), and the share of first drafts the engine keeps at K=1 on the same prompt.
At K=1 every draft reads true features only, so the two should match closely; a gap would mean
the drafter feeds the head something other than what it was trained on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from specdec.bench.specbench import QUESTIONS, load_questions  # noqa: E402
from specdec.drafters import make_drafter  # noqa: E402
from specdec.drafters.head import DraftHead, target_parts  # noqa: E402
from specdec.engine import GenerationConfig  # noqa: E402
from specdec.models.loader import load_model  # noqa: E402
from specdec.runtime import encode_prompt, engine_for  # noqa: E402
from specdec.train import trainer  # noqa: E402


def teacher_example(model, prompt: list[int], answer: list[int], layers: tuple[int, ...]) -> dict:
    """A training example (train.data's layout) of the target's own greedy answer; top-1 only."""
    ids = torch.tensor(prompt + answer)
    model.reset()
    logits, feats = model.forward_with_hidden(ids, layers)
    model.reset()
    n, start = len(ids), len(prompt)
    return {"ids": ids.int(), "features": feats[:n - 1].to(torch.bfloat16), "start": start,
            "layers": torch.tensor(layers, dtype=torch.int32),
            "top_ids": logits[start - 1:n - 1].argmax(-1, keepdim=True).int(),
            "top_p": torch.ones(n - start, 1, dtype=torch.float16)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("head")
    p.add_argument("--target", default="default")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=96)
    args = p.parse_args(argv)
    target = load_model(args.target)
    plain = engine_for(target, make_drafter("none", target))
    spec = engine_for(target, make_drafter(f"head:{args.head}", target))
    head, parts = DraftHead.load(args.head), target_parts(target.model)
    sub_index = trainer.sub_vocab_index(head.vocab_ids, head.config.vocab_size, "cpu")
    lm_sub = parts.lm_head[head.vocab_ids].float()
    config = trainer.TrainConfig(unroll=3, max_len=1 << 15, batch_size=1)
    one_token = GenerationConfig(max_new_tokens=args.max_new_tokens, k=1)
    weighted, kept, drafted, positions = [0.0] * 3, 0, 0, 0
    print(f"{'category':15s} {'teacher-forced (steps 1/2/3)':30s} engine K=1 kept")
    for row in load_questions(str(QUESTIONS), args.per_category, None):
        prompt = encode_prompt(target.tokenizer, row["turns"][0])
        answer = plain.generate(prompt, one_token).token_ids
        example = teacher_example(target.model, prompt, answer, head.config.feature_layers)
        agree = trainer.evaluate(head, parts, lm_sub, [example], sub_index, config)
        stats = spec.generate(prompt, one_token).stats
        weighted = [w + a * len(answer) for w, a in zip(weighted, agree)]
        positions += len(answer)
        kept, drafted = kept + stats.accepted, drafted + stats.drafted
        print(f"{row['category']:15s} {' / '.join(f'{a:.2f}' for a in agree):30s} {stats.acceptance_rate:.2f}",
              flush=True)
    overall = " / ".join(f"{w / positions:.2f}" for w in weighted)
    print(f"{'all':15s} {overall:30s} {kept / max(1, drafted):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
