"""Errors that mean the user asked for something we cannot do; surfaces print them without a traceback."""


class SpecdecError(Exception):
    """Base class: the message says what was wrong and what to do."""


class ModelLoadError(SpecdecError):
    """A model name or path could not be resolved or read."""


class UnsupportedHereError(ModelLoadError):
    """The model loads, but cannot run the way asked on this machine (e.g. the megakernel off a Hopper GPU)."""


class InvalidRequestError(SpecdecError, ValueError):
    """A request or flag with values out of range (empty prompt, K < 1, top_p 0, ...)."""


class DraftSpecError(InvalidRequestError):
    """A draft spec (--draft, a request's `draft`) with a malformed argument (MIN_CONF, ALPHA, ...)."""
