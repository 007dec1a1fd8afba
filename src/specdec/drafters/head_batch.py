"""The draft head drafting for many sequences at once (HeadDrafter.propose_batch).

Each draft step runs the head's matrices (fc, q/k/v, o, MLP, the drafted rows of the LM head) once
over one row per sequence still drafting (the catch-up over the newly kept text: all of their new
pairs), and attention once per sequence over its own cache with the very call a sequence alone makes.
Every sequence chooses with its own sampling parameters and generator, in the order alone, so its
tokens and q are the ones it drafts alone; only the matrices' last bits may follow the row count (a
CPU reads another layout for one row than for several), never another sequence's values.

A lone HeadDrafter.propose is a batch of one through the same code.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from specdec.drafters.base import Draft, empty_draft
from specdec.models.llama_net import rope_tables
from specdec.drafters.head_tree import grow_head_trees
from specdec.drafters.tree_shape import GrownTree
from specdec.errors import InvalidRequestError
from specdec.models.cpu_matrix import linear
from specdec.sampling import SamplingParams, sample, warp_logits
from specdec.transfers import pick, token_tensor


@torch.inference_mode()
def draft_heads(drafters, contexts, ks, params, generators) -> list[Draft]:
    """drafters[i] (HeadDrafters) drafts up to ks[i] tokens after contexts[i]; those sharing one
    head draft together, the others in groups of their own head. A drafter with a tree shape drafts
    a tree of at most ks[i] nodes (head_trees): greedy, its nodes chosen by rank (q None); sampling,
    drawn (q each node's distribution)."""
    out = [empty_draft(d.device) for d in drafters]
    for members in _by_head(drafters, contexts, ks, trees=False):
        drafts = _draft_group([drafters[i] for i in members], [contexts[i] for i in members],
                              [ks[i] for i in members], [params[i] for i in members],
                              [generators[i] for i in members])
        for i, draft in zip(members, drafts):
            out[i] = draft
    growing = [i for i, d in enumerate(drafters) if d.tree is not None]
    trees = head_trees([drafters[i] for i in growing], [contexts[i] for i in growing], [ks[i] for i in growing],
                       [params[i] for i in growing], [generators[i] for i in growing])
    for i, tree in zip(growing, trees):
        if tree.tokens:
            out[i] = Draft(token_tensor(list(tree.tokens), drafters[i].device), tree.q, tree.parents)
    return out


@torch.inference_mode()
def head_trees(drafters, contexts, ks, params, generators) -> list[GrownTree]:
    """drafters[i] (HeadDrafters with a tree shape) grows an EAGLE-2 tree of at most ks[i] nodes
    after contexts[i] (head_tree.py; empty where it cannot draft), with its scores (and q when
    sampling, drawn with generators[i]); those sharing one head grow together, one head pass a depth."""
    out = [GrownTree((), (), ()) for _ in drafters]
    for members in _by_head(drafters, contexts, ks, trees=True):
        group = [drafters[i] for i in members]
        _catch_up(group, [contexts[i] for i in members])
        grown = grow_head_trees(group, [ks[i] for i in members], [params[i] for i in members],
                                [generators[i] for i in members])
        for i, tree in zip(members, grown):
            out[i] = tree
    return out


def _by_head(drafters, contexts, ks, trees: bool) -> list[list[int]]:
    """Indices of the drafters ready to draft, chains or trees as asked, grouped by their head."""
    groups: dict[int, list[int]] = {}
    for i, (drafter, context, k) in enumerate(zip(drafters, contexts, ks)):
        if (drafter.tree is not None) == trees and drafter.ready_for(context, k):
            groups.setdefault(id(drafter.head), []).append(i)
    return list(groups.values())


def _draft_group(drafters, contexts, ks, params, generators) -> list[Draft]:
    _catch_up(drafters, contexts)
    h = {j: d._last_true for j, d in enumerate(drafters)}  # each sequence's predicted next feature [D]
    tokens: list[list[torch.Tensor]] = [[] for _ in drafters]
    qs: list[list[torch.Tensor]] = [[] for _ in drafters]
    reach = [1.0] * len(drafters)  # each head's estimate that all its drafts so far are kept
    active = list(range(len(drafters)))
    for i in range(max(ks)):
        chosen = _choose(drafters[0], [h[j] for j in active], [drafters[j].min_confidence for j in active],
                         [params[j] for j in active], [generators[j] for j in active])
        going = []
        for j, (token, q, confidence) in zip(active, chosen):
            tokens[j].append(token)
            if q is not None:
                qs[j].append(q)
            reach[j] *= confidence
            # Whether to draft the next position is decided before drawing it, from the tokens drawn
            # so far: a rule that looked at the new token itself would skew sampled output.
            if i + 1 < ks[j] and reach[j] >= drafters[j].min_confidence:
                going.append(j)
        if not going:
            break
        stepped = run_pairs([drafters[j] for j in going], [h[j][None] for j in going],
                            [tokens[j][-1].reshape(1) for j in going], [drafters[j]._num_feats + i for j in going])
        h.update(zip(going, stepped))
        active = going
    return [Draft(torch.stack(t), torch.stack(q) if q else None) for t, q in zip(tokens, qs)]


def _catch_up(drafters, contexts) -> None:
    """Run the true (feature, token) pairs each head has not cached yet, all in one pass."""
    behind = [(d, c) for d, c in zip(drafters, contexts) if d._true_pairs < d._num_feats]
    if not behind:
        return
    feats, tokens, starts = [], [], []
    for d, context in behind:
        n = d._num_feats
        d._feats = [torch.cat(d._feats)]
        feats.append(d._feats[0][d._true_pairs:n])  # [m, F]
        tokens.append(token_tensor(context[d._true_pairs + 1:n + 1], d.device))
        starts.append(d._true_pairs)
    late = [d for d, _ in behind]
    for d, last in zip(late, run_pairs(late, feats, tokens, starts)):
        d._last_true, d._true_pairs = last, d._num_feats  # [D] predicted f_n


def run_pairs(drafters, feats: list[torch.Tensor], tokens: list[torch.Tensor], starts: list[int]) -> torch.Tensor:
    """Pairs (feats[i] [m_i, F or D], tokens[i] [m_i]) of drafter i at its positions starts[i]..+m_i-1
    through the head layer, each into its own cache -> every drafter's last predicted feature [B, D]."""
    first = drafters[0]
    head, c, parts = first.head, first.c, first.parts
    counts = [int(t.shape[0]) for t in tokens]
    rows = list(accumulate(counts, initial=0))
    flat = torch.cat(tokens)
    x, a = head.layer_inputs(torch.cat(feats)[None], first.embed[flat][None].float())  # [1, T, D], [1, T, D or 2D]
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, counts)]).to(first.device)
    cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
    q, k, v = head.layer.project(a, cos, sin)  # [1, H or Hkv, T, hd]
    attended = []
    for d, start, row, n in zip(drafters, starts, rows, counts):
        end = start + n
        if end > d._k.shape[2]:
            raise InvalidRequestError(f"the draft head's cache holds {d._k.shape[2]} positions and the text "
                                      "is longer: use a shorter prompt or max_new_tokens, or another draft")
        d._k[:, :, start:end], d._v[:, :, start:end] = k[:, :, row:row + n], v[:, :, row:row + n]
        mask = None
        if n > 1:  # causal among the new pairs; everything cached before them is visible
            mask = torch.ones(n, end, dtype=torch.bool, device=d.device).tril(start)
        attended.append(head.layer.attend(q[:, :, row:row + n], d._k[:, :, :end], d._v[:, :, :end], mask))
    out = head.layer.after_attention(x, torch.cat(attended, dim=2))  # [1, T, D]
    last = [row - 1 for row in rows[1:]]
    return head.carry(out[0, last], parts)


def _choose(drafter, hs: list[torch.Tensor], min_confidence: list[float], params: list[SamplingParams],
            generators) -> list[tuple[torch.Tensor, torch.Tensor | None, float]]:
    """One token for each predicted feature hs[j] [D]: (token, q [V] or None when greedy, the head's
    probability of that token, computed only when min_confidence asks for it: a host read)."""
    logits = linear(drafter.head.readout(torch.stack(hs)), drafter.lm_sub)  # [b, N]
    vocab_ids, out = drafter.head.vocab_ids, []
    for j, (sp, generator) in enumerate(zip(params, generators)):
        row = logits[j]
        if sp.greedy:
            best = row.argmax()
            confidence = float(torch.softmax(row, -1)[best]) if min_confidence[j] > 0.0 else 1.0
            out.append((pick(vocab_ids, best), None, confidence))
            continue
        # Warping the N sub-vocabulary logits equals warping all V with -inf outside them (cheaper).
        q_sub = warp_logits(row, sp)  # [N]
        q = drafter.target_q(q_sub)  # [V]: the q drawn from
        index = sample(q_sub, generator)
        confidence = float(q_sub[index]) if min_confidence[j] > 0.0 else 1.0
        out.append((pick(vocab_ids, index), q, confidence))
    return out
