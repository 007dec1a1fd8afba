"""Throughput of the draft-head data builder on a GPU, with random weights of SmolLM2-135M's shape
(no download needed): `python benchmarks/data_speed_probe.py`. Times train.data.decode_batch with its
decode step replayed as a CUDA graph, the same loop run eagerly, and transformers generate() with the
outputs the first builder asked for (every layer's hidden states and the full logits), at the same
batch and lengths, in fp32 as the data is made; checks that the graph and the eager loop agree."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from specdec.train.data import decode_batch  # noqa: E402

LAYERS = (2, 15, 27)


def timed(fn):
    with torch.inference_mode():
        fn()  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main(shapes=((512, 150, 96), (256, 1200, 64))) -> None:
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                         max_position_embeddings=2048)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).cuda().eval()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    for batch, prompt, new in shapes:
        ids = torch.randint(100, 49000, (batch, prompt), device="cuda")
        attention = torch.ones_like(ids)
        attention[: batch // 2, : prompt // 3] = 0  # half the rows left-padded
        runs = {
            "decode_batch, CUDA graph": lambda: decode_batch(model, ids, attention, new, False, {0}, 32, layers=LAYERS,
                                                             graph=True),
            "decode_batch, eager": lambda: decode_batch(model, ids, attention, new, False, {0}, 32, layers=LAYERS,
                                                        graph=False),
        }
        if batch <= 512 and prompt <= 200:
            runs["generate(hidden states, logits)"] = lambda: model.generate(
                input_ids=ids, attention_mask=attention, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                pad_token_id=0, output_hidden_states=True, output_logits=True, return_dict_in_generate=True)
        outs = {}
        for name, fn in runs.items():
            outs[name], seconds = timed(fn)
            print(f"{name:34s} batch {batch}, prompt {prompt}, {new} new: {seconds:6.2f} s, "
                  f"{batch * new / seconds:8.0f} tokens/s, {seconds / new * 1000:6.1f} ms a step", flush=True)
        g, e = outs["decode_batch, CUDA graph"], outs["decode_batch, eager"]
        print(f"  graph vs eager: answers equal {torch.equal(g[0], e[0])}, features equal {torch.equal(g[1], e[1])}, "
              f"max feature diff {(g[1].float() - e[1].float()).abs().max().item():.3g}; "
              f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
        del outs, g, e
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
