"""specdec: exact speculative decoding for causal language models.

The core (sampling, the rejection rule, the speedup formulas) imports only torch; the rest is
loaded on first use so that `import specdec` stays quick.
"""

from specdec.sampling import SamplingParams, sample, warp_logits
from specdec.speedup import best_k, expected_speedup, expected_tokens_per_round
from specdec.verify import Verdict, accept_or_fix, residual, verify_greedy, verify_sampled

_LAZY = {
    "lookup_draft": "specdec.drafters.lookup",
    "Engine": "specdec.engine",
    "BatchedEngine": "specdec.engine",
    "BatchConfig": "specdec.engine",
    "GenerationConfig": "specdec.generation",
    "SpecStats": "specdec.generation",
    "Origin": "specdec.generation",
    "load_model": "specdec.models.loader",
    "build_runtime": "specdec.runtime",
    "make_drafter": "specdec.drafters",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")


__all__ = ["SamplingParams", "Verdict", "accept_or_fix", "best_k", "expected_speedup",
           "expected_tokens_per_round", "residual", "sample", "verify_greedy", "verify_sampled",
           "warp_logits", *_LAZY]
