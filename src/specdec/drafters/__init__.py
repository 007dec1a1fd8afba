"""Drafters by name: `none`, `lookup`, a model name or path, and whatever registers itself here.

Each kind is a factory in a table, so adding a drafter is one entry, not another `if` branch.
"""

from __future__ import annotations

from typing import Callable

from specdec.drafters.base import Draft, Drafter
from specdec.drafters.lookup import LookupDrafter, lookup_draft
from specdec.drafters.model import ModelDrafter
from specdec.drafters.none import NoDrafter
from specdec.errors import ModelLoadError, UnsupportedHereError
from specdec.models import loader
from specdec.models.loader import LoadedModel, load_model

# name -> factory(target, dtype) ; "prefix:" -> factory(target, argument, dtype)
NAMED: dict[str, Callable[..., Drafter]] = {
    "none": lambda target, dtype=None: NoDrafter(target.model.device),
    "lookup": lambda target, dtype=None: LookupDrafter(target.model.device),
}
PREFIXED: dict[str, Callable[..., Drafter]] = {
    # megakernel:MODEL: the model's single-token steps as one CUDA kernel (Hopper, bf16; models/megakernel.py)
    "megakernel": lambda target, arg, dtype=None: model_drafter(arg, target, dtype, megakernel=True),
}


def model_drafter(name: str, target: LoadedModel, dtype: str | None = None, megakernel: bool = False) -> Drafter:
    """A separate draft model; refused unless it shares the target's vocabulary."""
    try:
        draft = load_model(name, device=str(target.model.device), dtype=dtype, megakernel=megakernel)
    except UnsupportedHereError:
        raise  # a known model that cannot run as asked: saying it is unknown would mislead
    except ModelLoadError as exc:
        known = ", ".join(sorted(NAMED) + [p + ":..." for p in sorted(PREFIXED)])
        raise ModelLoadError(f"unknown draft {name!r}: it is none of {known}, and {exc}") from None
    loader.check_same_vocabulary(target, draft)  # through the module, so that tests can patch it
    return ModelDrafter(draft.model, target.model.vocab_size, name=draft.name)


def make_drafter(spec: str, target: LoadedModel, dtype: str | None = None) -> Drafter:
    """Build the drafter that `spec` names for this target."""
    if spec in NAMED:
        return NAMED[spec](target, dtype=dtype)
    prefix, sep, arg = spec.partition(":")
    if sep and prefix in PREFIXED:
        return PREFIXED[prefix](target, arg, dtype=dtype)
    return model_drafter(spec, target, dtype)


__all__ = ["Draft", "Drafter", "LookupDrafter", "ModelDrafter", "NoDrafter", "NAMED", "PREFIXED",
           "lookup_draft", "make_drafter"]
from specdec.drafters import quantized as _quantized  # noqa: E402,F401  (registers self-int8, self-int4, self-bf16)
from specdec.drafters import oracle as _oracle  # noqa: E402,F401  (registers oracle:ALPHA[:DRAFT])
from specdec.drafters import combined as _combined  # noqa: E402,F401  (registers head:PATH, lookup+head:PATH, auto)
