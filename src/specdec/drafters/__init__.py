"""Drafters: whatever proposes tokens for the target to verify.

The kinds a user can name, with their factories and help, are one table in registry.py
(`make_drafter(spec, target)` builds one).
"""

from __future__ import annotations

from specdec.drafters.base import Draft, Drafter
from specdec.drafters.lookup import LookupDrafter, lookup_draft
from specdec.drafters.model import ModelDrafter
from specdec.drafters.none import NoDrafter
from specdec.drafters.registry import DEFAULT_DRAFT, DRAFT_KINDS, DraftKind, draft_help, make_drafter
from specdec.drafters.tree_shape import TreeShape

__all__ = ["DEFAULT_DRAFT", "DRAFT_KINDS", "Draft", "DraftKind", "Drafter", "LookupDrafter", "ModelDrafter",
           "NoDrafter", "TreeShape", "draft_help", "lookup_draft", "make_drafter"]
