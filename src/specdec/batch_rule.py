"""The rejection rule over one step of the batched engine: queued on the device in one call, read
on the host in one copy.

Queueing and reading are apart so that the engine can queue the next step in between (pipelined
plain steps, batching.BatchConfig.pipeline): the read then waits for this step's values only.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Sequence

import torch

from specdec.constraints.masking import mask_logits
from specdec.drafters.base import Draft
from specdec.generation import EmittedToken, GenerationConfig
from specdec.models.slots import RaggedOutput
from specdec.sampling import SamplingParams, token_logprobs, warp_ragged
from specdec.transfers import HostRead, token_tensor
from specdec.tree_rule import tree_values, walk
from specdec.verify import Verdict, parse_ragged_round, ragged_outcome, ragged_round_values


@dataclass(frozen=True)
class TreeRound:
    """A tree verify of a step: its unit, its node parents, whether it is greedy, its values' length."""

    unit: int
    parents: tuple[int, ...]
    greedy: bool

    @property
    def size(self) -> int:
        return 3 * len(self.parents) + 1  # tree_rule.tree_values' layout


@dataclass(frozen=True)
class StepRule:
    """The rule's outcome for the verifies of one step, queued on the device and on its way to the host.

    verify: the step's units that verify a chain (the others were prefill chunks or trees), in batch order.
    offsets: [B_v + 1] host ints, their rows of logits (ragged_outcome's layout).
    next_token: [B_v] long on the device, each one's recovered or bonus token.
    trees: the step's tree verifies (tree_rule), their values after the chains' in the host read.
    """

    verify: tuple[int, ...]
    offsets: tuple[int, ...]
    next_token: torch.Tensor
    host: HostRead
    trees: tuple[TreeRound, ...] = ()

    def next_token_of(self, unit: int) -> torch.Tensor:
        """Unit `unit`'s next token [1], still on the device (the next step's pending token; a chain's)."""
        j = self.verify.index(unit)
        return self.next_token[j:j + 1]

    def read(self) -> dict[int, tuple[Verdict, list[int], torch.Tensor]]:
        """The host's one read of the step: for unit i, (verdict, kept drafts, next token [1] on the device)."""
        values = self.host.values()
        at = len(values) - sum(t.size for t in self.trees)
        out = {}
        if self.verify:
            rounds = parse_ragged_round(values[:at], self.offsets)
            out = {i: (verdict, kept, self.next_token[j:j + 1])
                   for j, (i, (verdict, kept)) in enumerate(zip(self.verify, rounds))}
        for tree in self.trees:
            verdict, kept = walk(values[at:at + tree.size], tree.parents, tree.greedy)
            out[tree.unit] = (verdict, kept, token_tensor([verdict.next_token], self.next_token.device))
            at += tree.size
        return out


def queue_rule(drafts: Sequence[Draft | None], params: Sequence[SamplingParams],
               generators: Sequence[torch.Generator], out: RaggedOutput,
               masks: Sequence[torch.Tensor | None] | None = None) -> StepRule | None:
    """The rule over every verify of a step in one call, each sequence with its own sampling and
    generator, and the copy of its outcome to the host started. drafts, params, generators: [B], one
    per unit of the step (drafts[i] None: a prefill chunk, which nothing judges). masks: [B] or None,
    a constrained verify's allowed tokens, int32 [K_i + 1, W] packed or bool [K_i + 1, V]
    (masking.mask_logits; its logits masked before the warps, so p is the masked, renormalised
    distribution: rule 8), else None. Chains go through verify.py's
    ragged rule, trees through tree_rule's. None when no unit verifies."""
    verify = [i for i, d in enumerate(drafts) if d is not None]
    if not verify:
        return None
    offsets = (0, *(out.offsets[i + 1] for i in verify))  # a prefill chunk brings no logits rows
    # The rule reads only the argmax of a greedy sequence's rows: an all-greedy step skips building
    # one-hot rows (at a 128k vocabulary, 64 sequences x 5 rows would be 160 MB of them).
    greedy = all(params[i].greedy for i in verify)
    logits = out.logits if masks is None else mask_logits(out.logits, offsets, [masks[i] for i in verify])
    p = logits if greedy else warp_ragged(logits, offsets, [params[i] for i in verify])  # [sum(K_i + 1), V]
    trees = [j for j, i in enumerate(verify) if not drafts[i].is_chain]
    chains = [j for j in range(len(verify)) if j not in trees]
    if trees and chains:  # the chains' rows alone, in ragged_outcome's layout
        rows = [r for j in chains for r in range(offsets[j], offsets[j + 1])]
        chain_p = p.index_select(0, torch.tensor(rows, dtype=torch.long).to(p.device))
        chain_offsets = tuple(itertools.accumulate((offsets[j + 1] - offsets[j] for j in chains), initial=0))
    else:
        chain_p, chain_offsets = p, offsets
    chain_units = [verify[j] for j in chains]
    next_token, values = _chain_values(chain_p, chain_offsets, chain_units, drafts, params, generators)
    rounds = []
    for j in trees:
        i, draft = verify[j], drafts[verify[j]]
        rounds.append(TreeRound(i, draft.node_parents, params[i].greedy))
        values.append(tree_values(p[offsets[j]:offsets[j + 1]], draft.tokens, draft.node_parents, draft.q,
                                  params[i].greedy, generators[i]))
    return StepRule(tuple(chain_units), chain_offsets if chains else (0,), next_token, HostRead(torch.cat(values)),
                    tuple(rounds))


def _chain_values(p: torch.Tensor, offsets: tuple[int, ...], verify: list[int], drafts, params,
                  generators) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """verify.py's ragged rule over the chain verifies `verify` (units), whose rows of p are `offsets`
    (ragged_outcome's layout): (next tokens [B_v] on the device, [the values the host reads]).
    No chains: (an empty tensor, [])."""
    if not verify:
        return p.new_zeros(0, dtype=torch.long), []
    verifying = [drafts[i] for i in verify]
    draft_tokens = torch.cat([d.tokens for d in verifying])  # [sum(K_i)]
    given = [d.q for d in verifying if d.q is not None]
    q = torch.cat(given) if given else None  # [rows of the sampled drafts, V]
    q_rows = (0 if d.q is None else len(d) for d in verifying)  # a one-hot draft brings no rows of q
    q_offsets = list(itertools.accumulate(q_rows, initial=0)) if given else None
    num_accepted, next_token = ragged_outcome(p, offsets, draft_tokens, q, q_offsets, [params[i] for i in verify],
                                              [generators[i] for i in verify])
    return next_token, [ragged_round_values(num_accepted, next_token, draft_tokens)]


def with_logprobs(tokens: list[EmittedToken], logits: torch.Tensor, config: GenerationConfig,
                  mask: torch.Tensor | None = None) -> list[EmittedToken]:
    """The round's emitted tokens with their log-probabilities under the target's p (sampling.token_logprobs):
    logits [K + 1, V] the verify's rows; emitted token j came from row j. mask: a constrained verify's
    allowed tokens, int32 [K + 1, W] packed or bool [K + 1, V] (p is then the masked distribution the rule
    used), else None."""
    if mask is not None:
        logits = mask_logits(logits, [0, logits.shape[0]], [mask])
    scores = token_logprobs(logits, config.sampling, [t.token_id for t in tokens], config.logprobs)
    return [dataclasses.replace(t, logprob=lp, top_logprobs=top) for t, (lp, top) in zip(tokens, scores)]
