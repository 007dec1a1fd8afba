"""Load a target and a drafter by name and wire them into an engine: what every surface needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specdec.drafters import DEFAULT_DRAFT, Drafter, make_drafter
from specdec.engine import Engine
from specdec.errors import InvalidRequestError
from specdec.models.cpu_threads import CpuThreads, use_threads
from specdec.models.loader import LoadedModel, load_model
from specdec.models.slots import slot_model_for

if TYPE_CHECKING:
    from specdec.engine.batched import BatchedEngine
    from specdec.drafters.registry import DraftMenu


slot_target = slot_model_for  # the server's name for it: the target as a SlotModel for the batched engine


@dataclass
class Runtime:
    target: LoadedModel
    drafter: Drafter
    engine: Engine
    threads: CpuThreads = field(default_factory=lambda: CpuThreads(0, "not chosen by build_runtime"))

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        """Prompt text to ids; `chat` wraps it as one user message in the model's chat template."""
        return encode_prompt(self.tokenizer, prompt, chat)

    def encode_messages(self, messages: list[dict]) -> list[int]:
        if not messages:
            raise InvalidRequestError("messages is empty: give at least one message")
        return _template_ids(self.tokenizer, messages)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def close(self) -> None:
        """Stop what the target runs beside this process (the other ranks of a tensor-parallel target)."""
        close = getattr(self.target.model, "close", None)
        if close is not None:
            close()

    def with_drafter(self, drafter: Drafter) -> "Runtime":
        """The same target behind another drafter (e.g. `none`, for the plain-decoding baseline)."""
        return Runtime(self.target, drafter, engine_for(self.target, drafter), self.threads)


def eos_ids(loaded: LoadedModel) -> set[int]:
    ids = set()
    for source in (loaded.tokenizer.eos_token_id,
                   getattr(getattr(loaded.model, "model", None), "generation_config", None)):
        value = getattr(source, "eos_token_id", source)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def engine_for(target: LoadedModel, drafter: Drafter) -> Engine:
    decode = lambda ids: target.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    return Engine(target.model, drafter, eos_token_ids=eos_ids(target), decode=decode, grammars=grammars_for(target))


def grammars_for(target: LoadedModel):
    """The target's grammar compiler (constraints/): cheap until its first constrained request."""
    from specdec.constraints.grammar import GrammarCompiler

    return GrammarCompiler(target.tokenizer, target.model.vocab_size)


def build_runtime(target: str = "default", draft: str = DEFAULT_DRAFT, device: str | None = None,
                  dtype: str | None = None, draft_dtype: str | None = None, backend: str = "auto",
                  threads: int | None = None, tensor_parallel: int = 1) -> Runtime:
    """threads: torch's CPU threads (None: cpu_threads.pick_threads' choice), set before anything loads.
    tensor_parallel: ranks the target is sharded over (this process is rank 0; close() the runtime)."""
    chosen = use_threads(threads)
    if tensor_parallel > 1:
        loaded = load_tensor_parallel(target, device, dtype, backend, tensor_parallel)
    else:
        loaded = load_model(target, device=device, dtype=dtype, backend=backend)
    try:
        drafter = make_drafter(draft, loaded, dtype=draft_dtype or dtype)
    except BaseException:
        Runtime(loaded, None, None).close()
        raise
    return Runtime(loaded, drafter, engine_for(loaded, drafter), chosen)


def load_tensor_parallel(target: str, device: str | None, dtype: str | None, backend: str,
                         world: int) -> LoadedModel:
    """The target sharded over `world` ranks (parallel/), with its tokenizer and end-of-sequence ids."""
    from specdec.models.loader import pick_device
    from specdec.parallel.launch import open_tensor_parallel
    from specdec.parallel.recipes import NamedTarget

    if backend == "hf":
        raise InvalidRequestError("--tensor-parallel-size runs the native backend; drop --backend hf")
    dev = pick_device(device)
    recipe = NamedTarget(target, dtype or ("bf16" if dev.type == "cuda" else "fp32"))
    on_host = recipe.load()
    sharded = open_tensor_parallel(recipe, world, dev.type, built=recipe.build(on_host))
    sharded.model = on_host.model.model  # what eos_ids reads (generation_config); stays on the host
    return LoadedModel(sharded, on_host.tokenizer, on_host.name)


def require_prompt(prompt: str) -> None:
    if not prompt or not prompt.strip():
        raise InvalidRequestError("the prompt is empty: give some text to continue")


def encode_prompt(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    require_prompt(prompt)
    if chat and getattr(tokenizer, "chat_template", None):
        return _template_ids(tokenizer, [{"role": "user", "content": prompt}])
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def _template_ids(tokenizer, messages: list[dict]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):  # newer transformers return a BatchEncoding
        out = out["input_ids"]
    return list(out)


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """The text up to the first stop string (which is not included), as OpenAI's `stop` behaves."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


@dataclass
class BatchedRuntime:
    """A target held as a slot model for up to max_num_seqs sequences, its batched engine, and the
    drafters by name (each sequence a fresh one: drafters.DraftMenu)."""

    target: LoadedModel
    engine: "BatchedEngine"
    drafters: "DraftMenu"
    kv_cache_bytes: int | None  # the slot cache's size when preallocated (NativeSlots), else None

    def kv_cache_line(self) -> str:
        slots = self.engine.target
        size = "grows per sequence" if self.kv_cache_bytes is None else f"{self.kv_cache_bytes / 2**30:.2f} GiB"
        return f"KV cache: {slots.max_slots} sequences x {slots.max_length} tokens, {size}"


def build_batched_runtime(target: str = "default", draft: str = DEFAULT_DRAFT, device: str | None = None,
                          dtype: str | None = None, draft_dtype: str | None = None, backend: str = "auto",
                          threads: int | None = None, max_num_seqs: int = 16, max_length: int | None = None,
                          prefill_chunk: int = 256, report=print) -> BatchedRuntime:
    """The flags of build_runtime plus --max-num-seqs (slots of the KV cache) and the longest sequence
    a slot holds (None: the model's); `draft` is what sequences submitted without one draft with.
    report: gets the KV cache's size once it is allocated."""
    from specdec.engine.batched import BatchConfig, BatchedEngine
    from specdec.drafters.registry import DraftMenu

    if max_num_seqs < 1:
        raise InvalidRequestError(f"--max-num-seqs must be at least 1, got {max_num_seqs}")
    use_threads(threads)
    loaded = load_model(target, device=device, dtype=dtype, backend=backend)
    slots = slot_model_for(loaded.model, max_num_seqs, max_length)
    menu = DraftMenu(loaded, max_num_seqs, dtype=draft_dtype or dtype, max_length=slots.max_length)
    decode = lambda ids: loaded.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    engine = BatchedEngine(slots, menu.factory(draft), eos_token_ids=eos_ids(loaded), decode=decode,
                           config=BatchConfig(prefill_chunk=prefill_chunk), grammars=grammars_for(loaded))
    runtime = BatchedRuntime(loaded, engine, menu, getattr(slots, "kv_cache_bytes", None))
    report(runtime.kv_cache_line())
    return runtime
