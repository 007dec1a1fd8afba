"""The server's detokenizing a token, on this CPU: TextStream's windows against decoding the whole
answer at every step (what it did before), with the default model's tokenizer (SmolLM2).

    PYTHONPATH=src python benchmarks/detokenize.py [--tokens 256,1024]

An answer of random ordinary tokens is fed one token a step; printed: microseconds a token, the
median of five runs, for both ways side by side.
"""

import argparse
import random
import statistics
import time

from transformers import AutoTokenizer

from specdec.models.default import prepared_dir
from specdec.server.streams import TextStream


def us_a_token(step, ids: list[int]) -> float:
    start = time.perf_counter()
    for n in range(1, len(ids) + 1):
        step(ids[:n], n == len(ids))
    return (time.perf_counter() - start) / len(ids) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="detokenize.py")
    parser.add_argument("--tokens", default="256,1024")
    args = parser.parse_args()
    tok = AutoTokenizer.from_pretrained(prepared_dir())
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    rng = random.Random(0)
    for n in map(int, args.tokens.split(",")):
        ids = [rng.randrange(1000, 40000) for _ in range(n)]
        window, whole = [], []
        for _ in range(5):
            window.append(us_a_token(TextStream(decode, ()).update, ids))
            whole.append(us_a_token(lambda part, final: decode(part), ids))
        print(f"{n} tokens: TextStream {statistics.median(window):.0f} us a token, "
              f"the whole answer decoded each step {statistics.median(whole):.0f} us a token")


if __name__ == "__main__":
    main()
