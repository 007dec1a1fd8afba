"""Prompt lookup: the match it finds, and how much of it the drafter proposes."""

import torch

from specdec.drafters.base import Draft, Drafter
from specdec.drafters.combined import LookupThenHead
from specdec.drafters.lookup import LookupDrafter, draft_length, lookup_draft, lookup_match
from specdec.sampling import SamplingParams

GREEDY = SamplingParams()


def test_match_reports_its_length_and_prefers_the_longest_tail():
    seq = [9, 1, 2, 3, 4, 5, 7, 3, 1, 2, 3]  # tail [1, 2, 3] appeared at 1; tail [3] alone more recently at 7
    assert lookup_match(seq, 4) == (3, [4, 5, 7, 3])
    assert lookup_match([5, 6, 7, 5], 3) == (1, [6, 7, 5])
    assert lookup_match([1, 2, 3], 3) == (0, [])
    assert lookup_draft(seq, 2) == [4, 5]


def test_a_short_match_drafts_only_as_many_tokens_as_it_matched():
    assert [draft_length(n, 6, 3) for n in (0, 1, 2, 3)] == [0, 1, 2, 6]
    assert draft_length(3, 2, 3) == 2  # never more than k
    one_gram = [5, 6, 7, 8, 9, 5]  # only the last token [5] recurs
    adaptive = LookupDrafter(torch.device("cpu"))
    fixed = LookupDrafter(torch.device("cpu"), adaptive=False)
    assert adaptive.propose(one_gram, 4, GREEDY, None).tokens.tolist() == [6]
    assert fixed.propose(one_gram, 4, GREEDY, None).tokens.tolist() == [6, 7, 8, 9]
    three_gram = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    assert adaptive.propose(three_gram, 4, GREEDY, None).tokens.tolist() == [4, 5, 6, 7]


class _FixedHead(Drafter):
    """Stands in for the draft head: always drafts [99] * k."""

    def propose(self, context, k, params, generator):
        return Draft(torch.tensor([99] * k))


def test_combined_drafter_uses_lookup_only_after_a_match_of_two_tokens():
    combined = LookupThenHead(LookupDrafter(torch.device("cpu")), _FixedHead(), name="lookup+stub")
    assert combined.propose([5, 6, 7, 8, 9, 5], 3, GREEDY, None).tokens.tolist() == [99, 99, 99]  # 1-token match
    assert combined.propose([1, 2, 3], 3, GREEDY, None).tokens.tolist() == [99, 99, 99]  # no match
    assert combined.propose([4, 5, 6, 7, 8, 4, 5], 3, GREEDY, None).tokens.tolist() == [6, 7]  # 2-token match
    assert combined.propose([4, 5, 6, 7, 8, 9, 4, 5, 6], 3, GREEDY, None).tokens.tolist() == [7, 8, 9]


def test_combined_drafter_caps_the_heads_draft_but_not_lookups():
    combined = LookupThenHead(LookupDrafter(torch.device("cpu")), _FixedHead(), name="lookup+stub", head_max=2)
    assert combined.propose([1, 2, 3], 5, GREEDY, None).tokens.tolist() == [99, 99]
    assert combined.propose([1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3], 5, GREEDY, None).tokens.tolist() == [4, 5, 6, 7, 8]
