"""The multi-candidate rule over draft trees: the tokens it emits follow the target exactly.

A Markov chain over six tokens stands in for the target (row t of P: p after token t) and another for
the draft (Q). Each trial drafts a tree after token 0, settles it with tree_rule and keeps the first
two emitted tokens (drawing the second from P when the round emitted one): their joint distribution
must be P[0, a] * P[a, b], whatever the tree. The injected faults of specdec.faults must fail it.
"""

import pytest
import torch
from scipy.stats import chisquare

from specdec.faults import inject
from specdec.sampling import sample_distinct
from specdec.tree_rule import TreeVerdict, settle_tree, walk
from specdec.trees import children_of

V = 6
ROOT = 0
TRIALS = 12_000


def chains(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, Q): target and draft transition matrices [V, V], far apart so that drafts are often rejected."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)
    return p, q


def top_tree(q: torch.Tensor, widths=(3, 2)) -> tuple[list[int], list[int]]:
    """(tokens, parents): the draft's top-widths[0] after ROOT, each with its top-widths[1]; q None."""
    first = q[ROOT].topk(widths[0]).indices.tolist()
    tokens, parents = list(first), [-1] * len(first)
    for i, t in enumerate(first):
        kids = q[t].topk(widths[1]).indices.tolist()
        tokens += kids
        parents += [i] * len(kids)
    return tokens, parents


def sampled_tree(q: torch.Tensor, g: torch.Generator, widths=(3, 2), distinct: bool = False):
    """(tokens, parents, q rows): widths[0] draws after ROOT from Q[ROOT], each with widths[1] draws from
    Q[its token], with replacement, or without (distinct, as the head draws: sampling.sample_distinct);
    each node's q row is the distribution it was drawn from."""
    def draw(row: torch.Tensor, n: int) -> tuple[list[int], list[torch.Tensor]]:
        if not distinct:
            return torch.multinomial(row, n, replacement=True, generator=g).tolist(), [row] * n
        picks, live, conditionals = sample_distinct(row[None], n, g)
        return picks[live].tolist(), list(conditionals[live])

    first, rows = draw(q[ROOT], widths[0])
    tokens, parents = list(first), [-1] * len(first)
    for i, t in enumerate(first):
        kids, kid_rows = draw(q[t], widths[1])
        tokens += kids
        parents += [i] * len(kids)
        rows += kid_rows
    return tokens, parents, torch.stack(rows)


def first_two(p: torch.Tensor, tokens: list[int], parents: list[int], q_rows, g: torch.Generator) -> tuple[int, int]:
    """Settle one tree after ROOT; the first two tokens of the text that follows."""
    rows = torch.stack([p[ROOT]] + [p[t] for t in tokens])  # [n + 1, V]: row j + 1 is p after node j
    verdict, kept = settle_tree(rows, torch.tensor(tokens), parents, q_rows, greedy=False, generator=g)
    out = kept + [verdict.next_token]
    if len(out) < 2:
        out.append(int(torch.multinomial(p[out[0]], 1, generator=g)))
    return out[0], out[1]


def joint_pvalue(p: torch.Tensor, pairs: list[tuple[int, int]]) -> float:
    counts = torch.zeros(V, V)
    for a, b in pairs:
        counts[a, b] += 1
    expected = (p[ROOT][:, None] * p).reshape(-1) * len(pairs)
    return chisquare(counts.reshape(-1).numpy(), expected.numpy()).pvalue


def deterministic_pairs(seed: int) -> tuple[torch.Tensor, list]:
    p, q = chains(seed)
    tokens, parents = top_tree(q)
    g = torch.Generator().manual_seed(seed)
    return p, [first_two(p, tokens, parents, None, g) for _ in range(TRIALS)]


def sampled_pairs(seed: int, distinct: bool = False) -> tuple[torch.Tensor, list]:
    p, q = chains(seed)
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(TRIALS):
        tokens, parents, rows = sampled_tree(q, g, distinct=distinct)
        pairs.append(first_two(p, tokens, parents, rows, g))
    return p, pairs


@pytest.mark.parametrize("seed", [0, 1])
def test_deterministic_siblings_follow_p(seed):
    assert joint_pvalue(*deterministic_pairs(seed)) > 1e-3


@pytest.mark.parametrize("distinct", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_sampled_siblings_follow_p(seed, distinct):
    assert joint_pvalue(*sampled_pairs(seed, distinct)) > 1e-3


@pytest.mark.parametrize("fault", ["tree-no-sibling-residual", "tree-recover-from-p"])
def test_faults_of_deterministic_siblings_are_caught(fault):
    with inject(fault):
        assert joint_pvalue(*deterministic_pairs(0)) < 1e-4


@pytest.mark.parametrize("fault", ["tree-no-sibling-residual", "tree-recover-from-p", "tree-parent-q"])
def test_faults_of_sampled_siblings_are_caught(fault):
    with inject(fault):
        assert joint_pvalue(*sampled_pairs(0)) < 1e-4


@pytest.mark.parametrize("fault", ["tree-no-sibling-residual", "tree-siblings-unconditioned-q"])
def test_faults_of_siblings_drawn_without_replacement_are_caught(fault):
    with inject(fault):
        assert joint_pvalue(*sampled_pairs(0, distinct=True)) < 1e-4


def test_greedy_follows_the_targets_argmax_down_the_tree():
    p, q = chains(3)
    tokens, parents = top_tree(q, widths=(V, V))  # every token at both depths: the argmax path is in it
    rows = torch.stack([p[ROOT]] + [p[t] for t in tokens])
    verdict, kept = settle_tree(rows, torch.tensor(tokens), parents, None, greedy=True)
    first = int(p[ROOT].argmax())
    second = int(p[first].argmax())
    assert kept == [first, second]
    assert verdict.leaf and verdict.next_token == int(p[second].argmax())


def test_greedy_stops_where_no_child_is_the_argmax():
    p = torch.eye(V)[[2, 5, 3, 1]]  # argmax after the root 2, after node 1 (token 2) 3
    tokens, parents = [1, 2, 4], [-1, -1, 1]  # the root's children 1, 2; node 2 (token 4) under node 1
    verdict, kept = settle_tree(p, torch.tensor(tokens), parents, None, greedy=True)
    assert kept == [2] and verdict.path == (1,)
    assert verdict.next_token == 3 and not verdict.leaf
    assert verdict.judged == 3  # both root children, then node 2


def test_walk_reads_kept_flags_and_row_draws():
    parents = [-1, -1, 0, 0]
    # kept: node 0 no, node 1 yes, nodes 2-3 never reached; draws per row (5 rows); tokens.
    values = [0, 1, 1, 1] + [10, 11, 12, 13, 14] + [7, 8, 9, 6]
    verdict, kept = walk(values, parents, greedy=False)
    assert verdict == TreeVerdict(num_accepted=1, next_token=12, num_drafted=4, path=(1,), nodes=(7, 8, 9, 6),
                                   parents=(-1, -1, 0, 0), leaf=True, judged=2, depth=2)
    assert kept == [8] and verdict.rows == [0, 2]


def test_children_of_lists_each_rows_children_in_node_order():
    assert children_of([-1, -1, 0, 1, 0]) == [[0, 1], [2, 4], [3], [], [], []]


def test_a_seed_reproduces_a_round():
    p, q = chains(5)
    rows = torch.softmax(torch.randn(4, V, generator=torch.Generator().manual_seed(1)), -1)
    tokens, parents = torch.tensor([1, 2, 3]), [-1, -1, 0]
    runs = [settle_tree(rows, tokens, parents, None, False, torch.Generator().manual_seed(9)) for _ in range(2)]
    assert runs[0] == runs[1]
