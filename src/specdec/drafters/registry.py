"""Every kind of draft a user can name (--draft, a request's `draft`), in one table.

A kind is either a name (`lookup`), a prefix with an argument (`head:PATH`), or, last, any model
name or path. Each row holds its factory and the one line of help that `specdec ... --help` shows;
adding a drafter is one row here, not another `if` branch, and nothing registers itself on import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from specdec.drafters import combined, oracle, oracle_tree, quantized
from specdec.drafters.base import Drafter
from specdec.drafters.lookup import LookupDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.none import NoDrafter
from specdec.drafters.tree_shape import TreeShape, is_tree_shape, parse_tree_shape
from specdec.errors import DraftSpecError, ModelLoadError, UnsupportedHereError

DEFAULT_DRAFT = "auto"  # what `specdec generate` and `specdec serve` draft with unless told otherwise

# factory(target: LoadedModel, argument: the text after "prefix:" ("" for a name), dtype: the draft's or None)
Factory = Callable[..., Drafter]


@dataclass(frozen=True)
class DraftKind:
    syntax: str  # as a user writes it: `lookup`, `head:PATH[:MIN_CONF]`, `MODEL`
    build: Factory
    help: str  # one line

    @property
    def prefix(self) -> str | None:
        """The text before ':' for a kind that takes an argument (None for a plain name or MODEL)."""
        head, sep, _ = self.syntax.partition(":")
        return head if sep else None


def model_drafter(target, name: str, dtype: str | None = None, megakernel: bool = False,
                  intersect: bool = False) -> Drafter:
    """A separate draft model, of any tokenizer: one of the target's drafts its ids (ModelDrafter);
    another's drafts text re-encoded into target ids (TextDrafter), or with intersect, tokens both
    vocabularies share (IntersectionDrafter). docs/drafts.md."""
    from specdec.drafters import cross_tokenizer
    from specdec.drafters.shared_tokens import SharedTokens
    from specdec.models import loader

    try:
        draft = loader.load_model(name, device=str(target.model.device), dtype=dtype, megakernel=megakernel)
    except UnsupportedHereError:
        raise  # a known model that cannot run as asked: saying it is unknown would mislead
    except ModelLoadError as exc:
        known = ", ".join(kind.syntax for kind in DRAFT_KINDS[:-1])
        raise ModelLoadError(f"unknown draft {name!r}: it is none of {known}, and {exc}") from None
    if loader.same_vocabulary(target, draft):  # through the module, so that a fault can patch it
        return ModelDrafter(draft.model, target.model.vocab_size, name=draft.name)
    tokenizers = (draft.model, draft.tokenizer, target.tokenizer)
    if not intersect:
        return cross_tokenizer.TextDrafter(*tokenizers, name=draft.name)
    shared = SharedTokens.between(draft.tokenizer, target.tokenizer, draft.model.vocab_size,
                                  target.model.vocab_size, target.model.device)
    if shared.size == 0:
        raise DraftSpecError(f"the draft {name!r} shares no token with the target's vocabulary: "
                             f"draft with {name} (re-encoded text) instead of intersect:{name}")
    return cross_tokenizer.IntersectionDrafter(*tokenizers, name=f"intersect:{draft.name}", shared=shared)


def tree_drafter(target, arg: str, dtype: str | None = None) -> Drafter:
    """`tree:[SHAPE:]SPEC`: the draft SPEC names, drafting trees of SHAPE (DEPTHxBRANCH[xWIDTH],
    default TreeShape()) instead of chains, k nodes a round. The one place a draft becomes a tree draft."""
    first, sep, rest = arg.partition(":")
    shape_text, inner = (first, rest) if sep and is_tree_shape(first) else ("", arg)
    if not inner or is_tree_shape(inner):
        raise DraftSpecError(f"`tree:{arg}` names no draft: write tree:[DEPTHxBRANCH[xWIDTH]:]SPEC, e.g. tree:auto "
                             "or tree:6x4:lookup")
    kind, inner_arg = find_kind(inner)
    return kind.build(target, inner_arg, dtype=dtype).with_tree(parse_tree_shape(shape_text))


def _self(precision: str, kernel: str = "auto") -> Factory:
    return lambda target, arg, dtype=None: quantized.self_drafter(target, precision, kernel)


DRAFT_KINDS: tuple[DraftKind, ...] = (
    DraftKind("auto", lambda target, arg, dtype=None: combined.auto_drafter(target),
              "lookup+head with the shipped head made for this target (its file records which), else lookup"),
    DraftKind("lookup", lambda target, arg, dtype=None: LookupDrafter(target.model.device),
              "prompt lookup: copy what followed the last matching n-gram of the text"),
    DraftKind("none", lambda target, arg, dtype=None: NoDrafter(target.model.device),
              "no draft: plain decoding through the same loop"),
    DraftKind("head:PATH[:MIN_CONF]", lambda target, arg, dtype=None: combined.head_drafter(target, arg),
              "a draft head alone: a specdec head file or an EAGLE-3 directory (MIN_CONF: end a round when the head's confidence drops below it)"),
    DraftKind("eagle3:PATH[:MIN_CONF]", lambda target, arg, dtype=None: combined.eagle3_drafter(target, arg),
              "an EAGLE-3 head (SpecForge/SGLang/vLLM checkpoint directory or hub id) alone"),
    DraftKind("lookup+head:PATH[:MIN_CONF]", lambda target, arg, dtype=None: combined.lookup_head_drafter(target, arg),
              "lookup after a match of 2+ tokens, else the head, as many tokens as the head's policy says"),
    DraftKind("tree:[SHAPE:]SPEC", tree_drafter,
              "SPEC (lookup, a head, lookup+head, auto or a model) drafting trees of SHAPE DEPTHxBRANCH[xWIDTH] "
              f"(default {TreeShape()}) instead of chains"),
    DraftKind("self-int8", _self("int8"), "an int8 copy of the target (weights per output channel)"),
    DraftKind("self-int4", _self("int4"), "an int4 copy of the target (weights per group of 32)"),
    DraftKind("self-bf16", _self("bf16"), "a bf16 copy of the target"),
    DraftKind("self-int8-dequant", _self("int8", "dequant"), "self-int8 computed by dequantizing on the fly"),
    DraftKind("self-int4-dequant", _self("int4", "dequant"), "self-int4 computed by dequantizing on the fly"),
    DraftKind("self-int8-dynamic", _self("int8", "dynamic"), "int8 weights and activations (FBGEMM, CPU only)"),
    DraftKind("oracle:ALPHA[:DRAFT]", lambda target, arg, dtype=None: oracle.oracle_drafter(target, arg, dtype),
              "engine benchmarks: the target's own continuation, kept with probability ALPHA, at DRAFT's cost"),
    DraftKind("oracle-tree:P0,P1,...[:DRAFT]", lambda target, arg, dtype=None: oracle_tree.oracle_tree_drafter(
        target, arg, dtype), "engine benchmarks: trees with the target's own continuation at sibling rank i with "
              "probability Pi (best_tree's shape), at DRAFT's cost"),
    DraftKind("megakernel:MODEL", lambda target, arg, dtype=None: model_drafter(target, arg, dtype, megakernel=True),
              "MODEL's single-token steps as one CUDA kernel (Hopper GPUs, bf16)"),
    DraftKind("intersect:MODEL", lambda target, arg, dtype=None: model_drafter(target, arg, dtype, intersect=True),
              "a model of another tokenizer drafting only the tokens both vocabularies share (a real q)"),
    DraftKind("MODEL", lambda target, arg, dtype=None: model_drafter(target, arg, dtype),
              "any model name or path; another tokenizer's drafts are re-encoded into the target's"),
)
_NAMED = {kind.syntax: kind for kind in DRAFT_KINDS if kind.prefix is None and kind.syntax != "MODEL"}
_PREFIXED = {kind.prefix: kind for kind in DRAFT_KINDS if kind.prefix is not None}


def find_kind(spec: str) -> tuple[DraftKind, str]:
    """The kind that `spec` names, and its argument ("" for a plain name; the spec itself for MODEL)."""
    if spec in _NAMED:
        return _NAMED[spec], ""
    prefix, sep, arg = spec.partition(":")
    if sep and prefix in _PREFIXED:
        return _PREFIXED[prefix], arg
    return DRAFT_KINDS[-1], spec


def make_drafter(spec: str, target, dtype: str | None = None, max_slots: int | None = None,
                 max_length: int | None = None) -> Drafter:
    """Build the drafter that `spec` names for this target (a LoadedModel). max_slots: as the
    prototype of a batch of up to that many sequences of up to max_length positions
    (Drafter.for_batch; fork() one for each)."""
    kind, arg = find_kind(spec)
    drafter = kind.build(target, arg, dtype=dtype)
    return drafter if max_slots is None else drafter.for_batch(max_slots, max_length)


class DraftMenu:
    """Fresh drafters by name for the sequences of one batched engine, so that sequences of one
    batch can draft with different kinds: each kind is built once (its weights loaded once, as a
    prototype for up to max_slots sequences) and every sequence gets a fork of it, sharing those
    weights but no per-sequence state. max_length: the positions a target's slot holds, which a
    draft model's slots need no more of (at 8B/1B, 32 slots of the 1B's 4096 positions held 3 GiB
    more than the target's 1024 need)."""

    def __init__(self, target, max_slots: int, dtype: str | None = None, max_length: int | None = None):
        self.target, self.max_slots, self.dtype, self.max_length = target, max_slots, dtype, max_length
        self._prototypes: dict[str, Drafter] = {}

    def adopt(self, spec: str, drafter: Drafter) -> None:
        """Serve `spec` with forks of a drafter already built, so its weights are not loaded again; its
        batch prototype prepares now what its first drafts would prepare mid-run (CUDA graphs)."""
        prototype = drafter.for_batch(self.max_slots, self.max_length)
        prototype.warm_up()
        self._add(spec, prototype)

    def fresh(self, spec: str) -> Drafter:
        """A new drafter of kind `spec` for one sequence (DraftSpecError for a kind that cannot fork)."""
        if spec not in self._prototypes:
            self._add(spec, make_drafter(spec, self.target, self.dtype, self.max_slots, self.max_length))
        return self._prototypes[spec].fork()

    def _add(self, spec: str, prototype: Drafter) -> None:
        prototype.fork()  # a kind that cannot draft for several sequences says so now, not mid-batch
        self._prototypes[spec] = prototype

    def factory(self, spec: str) -> Callable[[], Drafter]:
        """() -> a fresh drafter of kind `spec` (BatchedEngine's drafter_factory); built and checked now."""
        self.fresh(spec)
        return lambda: self.fresh(spec)


def draft_help() -> str:
    """The --draft help text, one clause a kind."""
    return "; ".join(f"`{kind.syntax}`: {kind.help}" for kind in DRAFT_KINDS)
