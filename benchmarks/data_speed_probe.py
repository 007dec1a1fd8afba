"""Throughput of the draft-head data builder on a GPU, with random weights of SmolLM2-135M's shape
(no download needed): `python benchmarks/data_speed_probe.py`. Times train.data.decode_batch against
transformers generate() with the outputs the old builder asked for (every layer's hidden states and
the full logits), at the same batch and lengths."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from specdec.train.data import decode_batch  # noqa: E402


def main(batch: int = 512, prompt: int = 150, new: int = 96) -> None:
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                         max_position_embeddings=2048)
    model = LlamaForCausalLM(config).cuda().eval()
    ids = torch.randint(100, 49000, (batch, prompt), device="cuda")
    attention = torch.ones_like(ids)
    attention[: batch // 2, : prompt // 3] = 0  # half the rows left-padded
    for name, fn in [
        ("decode_batch", lambda: decode_batch(model, ids, attention, new, False, {0}, 32)),
        ("generate(hidden states, logits)", lambda: model.generate(
            input_ids=ids, attention_mask=attention, max_new_tokens=new, min_new_tokens=new, do_sample=False,
            pad_token_id=0, output_hidden_states=True, output_logits=True, return_dict_in_generate=True)),
    ]:
        with torch.inference_mode():
            fn()  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        print(f"{name:34s} batch {batch}, {new} new tokens: {seconds:6.2f} s, {batch * new / seconds:8.0f} tokens/s",
              flush=True)


if __name__ == "__main__":
    main()
