"""Tiny random Llama models for tests: a target/draft pair sharing a small vocabulary."""

import os

# The fused CUDA kernels (specdec.models.triton_ops) run on the CPU through Triton's interpreter,
# which is chosen when Triton is first imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from specdec.models.hf import HFCausalLM  # noqa: E402

VOCAB = 64

# Tests run thousands of tiny ops, where handing work to a second thread costs more than it saves
# (and on a busy machine, far more). Tests of the real default model raise it again. The
# environment variable is what build_runtime's thread choice (cpu_threads.use_threads) honours.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


def tiny_llama(seed: int, layers: int = 2, hidden: int = 32, vocab: int = VOCAB, scale: float = 1.0) -> HFCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper logits than the default init, so that tokens differ in probability
        model.lm_head.weight.mul_(scale)
    return HFCausalLM(model.float(), f"tiny-llama-{seed}")


@pytest.fixture(scope="session")
def tiny_target() -> HFCausalLM:
    return tiny_llama(0, layers=2, scale=8.0)


@pytest.fixture(scope="session")
def tiny_draft() -> HFCausalLM:
    return tiny_llama(1, layers=1, scale=8.0)


class HostReads(TorchDispatchMode):
    """Counts reads of a tensor's value on the host: every op that hands a scalar to C++ or Python
    (item(), int(), bool(), indexing with a 0-d tensor...) dispatches _local_scalar_dense, or under
    inference_mode item itself."""

    SCALAR_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.reads += func in self.SCALAR_READS
        return func(*args, **(kwargs or {}))


@pytest.fixture
def count_reads(monkeypatch):
    """Counts every read of a tensor's value on the host while the test runs (tolist() reads a CPU
    tensor's memory without dispatching an op, so it is counted apart)."""
    counts = {"tolist": 0}
    original = torch.Tensor.tolist

    def counted(self):
        counts["tolist"] += 1
        return original(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    with HostReads() as mode:
        yield lambda: counts["tolist"] + mode.reads
