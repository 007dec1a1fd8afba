"""Every request field the server knows, in one place: what it refuses, and what it takes and ignores.

The fields it honours are the request models' own (protocol.py). A field here is REFUSED (400
`unsupported_parameter`, naming it) unless it is left out, null, or set to one of its neutral values,
the ones that change nothing: it would change what is sampled, and speculation here is exact for the
model's own distribution, so a "yes" that does nothing would be a lie. IGNORED fields cannot change
the output and are accepted as they come. Fields in no list are ignored too, as OpenAI-compatible
servers do with fields they do not know.
"""

from __future__ import annotations

from typing import Any

# Both endpoints: sampling warps and penalties (OpenAI's, vLLM's, llama.cpp's, Ollama's, HF's).
SAMPLING: dict[str, tuple] = {
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "repetition_penalty": (1, 1.0),
    "repeat_penalty": (1, 1.0), "length_penalty": (1, 1.0), "logit_bias": ({},), "min_tokens": (0,),
    "use_beam_search": (False,), "best_of": (1,), "stop_token_ids": ([],), "bad_words": ([],),
    "allowed_token_ids": (), "logits_processors": (), "prompt_logprobs": (), "typical_p": (1, 1.0),
    "mirostat": (0,), "mirostat_tau": (), "mirostat_eta": (), "tfs_z": (1, 1.0), "top_a": (0, 0.0),
    "dry_multiplier": (0, 0.0), "xtc_probability": (0, 0.0), "dynatemp_range": (0, 0.0),
    "epsilon_cutoff": (0, 0.0), "eta_cutoff": (0, 0.0), "penalty_alpha": (0, 0.0),
    "no_repeat_ngram_size": (0,), "truncate_prompt_tokens": (), "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,), "echo": (False,),
    "reasoning_effort": (), "verbosity": (), "web_search_options": (), "audio": (), "modalities": (["text"],),
}

CHAT_ONLY: dict[str, tuple] = {  # the chat template and tools
    "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "add_generation_prompt": (True,), "continue_final_message": (False,), "chat_template": (),
    "chat_template_kwargs": ({},), "documents": (),
}

COMPLETIONS_ONLY: dict[str, tuple] = {
    "suffix": ("",),
    "top_logprobs": (),  # completions take the alternatives' count in `logprobs`
}

REFUSED_CHAT = {**SAMPLING, **CHAT_ONLY}
REFUSED_COMPLETIONS = {**SAMPLING, **COMPLETIONS_ONLY}

# Taken and ignored: they cannot change the output.
IGNORED = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
           "parallel_tool_calls", "prediction", "cache_prompt", "request_id", "priority")


def refused_field(body: dict[str, Any], chat: bool) -> tuple[str, object] | None:
    """(the first field of `body` set to a value this server does not honour, a neutral value to
    send instead or None when only leaving it out is neutral), or None when there is none."""
    refused = REFUSED_CHAT if chat else REFUSED_COMPLETIONS
    for name, value in body.items():
        neutral = refused.get(name)
        if neutral is None or value is None:
            continue
        if not any(type(value) is type(n) and value == n for n in neutral):
            return name, neutral[0] if neutral else None
    return None
