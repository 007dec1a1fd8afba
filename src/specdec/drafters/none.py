"""No draft at all: every round is one plain target step. The baseline every speedup is measured against."""

from __future__ import annotations

import torch

from specdec.drafters.base import Draft, Drafter, empty_draft
from specdec.sampling import SamplingParams


class NoDrafter(Drafter):
    name = "none"
    drafts_nothing = True

    def __init__(self, device: torch.device):
        self.device = device

    def fork(self) -> "NoDrafter":
        return NoDrafter(self.device)

    def propose(self, context: list[int], k: int, params: SamplingParams, generator) -> Draft:
        return empty_draft(self.device)
