"""Streamed answers of a tree drafter carry each round's draft tree (`specdec.tree`, docs/server.md).

A real `specdec serve` on the tiny pair (tests/server_tiny_model.py) drafting trees with the draft
model, every round a tree round (a fixed K of 6 nodes).
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server_tiny_model import SPECIALS, build_tokenizer, tree_server

PROMPT = "hello what is the draft token"


def stream_chunks(url: str, path: str, body: dict) -> list[dict]:
    """Every streamed choice (chat or completions) of one request, in order."""
    choices = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices += json.loads(line[6:])["choices"]
    return choices


def check_tree(tree: dict) -> None:
    """A well-formed tree: one text piece and one parent per node, parents before children, and a kept
    path that walks from the root down, one depth a step."""
    tokens, parents, path = tree["tokens"], tree["parents"], tree["path"]
    assert len(tokens) == len(parents) >= 1 and all(isinstance(t, str) for t in tokens)
    assert all(-1 <= parent < node for node, parent in enumerate(parents))
    assert len(set(path)) == len(path) and all(0 <= node < len(tokens) for node in path)
    assert [parents[node] for node in path] == ([-1] + path)[:len(path)]  # empty: no child was kept


def round_starts(choices: list[dict]) -> dict[int, tuple[int, int]]:
    """round -> (chunk index, token index in that chunk) of the round's first token."""
    starts: dict[int, tuple[int, int]] = {}
    for c, choice in enumerate(choices):
        for t, token in enumerate((choice.get("specdec") or {}).get("tokens", ())):
            starts.setdefault(token["round"], (c, t))
    return starts


def carried_trees(choices: list[dict]) -> dict[int, int]:
    """chunk -> the round of the tree it carries."""
    return {c: choice["specdec"]["tree"]["round"] for c, choice in enumerate(choices)
            if (choice.get("specdec") or {}).get("tree") is not None}


def check_kept_path(tree: dict, choice: dict, first: int) -> None:
    """The round's tokens from its first (`first` in this chunk) are the kept path's nodes, as
    `accepted`, then one recovered or bonus token (the tree's `next`); when the round starts the
    chunk, so does its text."""
    info = choice["specdec"]
    records = [t for t in info["tokens"][first:] if t["round"] == tree["round"]]
    kept = [tree["tokens"][node] for node in tree["path"]]
    piece = build_tokenizer().decode  # as the server decodes each node: alone, specials included
    assert [piece([t["id"]]) for t in records[:len(kept)]] == kept
    assert [t["origin"] for t in records[:len(kept)]] == ["accepted"] * len(kept)
    assert len(records) <= len(kept) + 1  # the answer's last round may end early (max_tokens)
    assert all(t["origin"] in ("recovered", "bonus") for t in records[len(kept):])
    after = [{"token": piece([t["id"]]), "origin": t["origin"]} for t in records[len(kept):]]
    assert tree["next"] == (after[0] if after else None)  # the token the round emitted after its path
    if first == 0:
        text = choice["delta"]["content"] if "delta" in choice else choice["text"]
        words = [word for word in kept if word not in SPECIALS]  # specials are not part of the text
        # The token after the path may join the last word without a space (`runs` then `.`).
        assert " ".join(text.split()).startswith(" ".join(words))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_each_tree_round_streams_its_tree_and_the_kept_path_is_the_rounds_text(path):
    server = tree_server()
    field = {"messages": [{"role": "user", "content": PROMPT}]} if "chat" in path else {"prompt": PROMPT}
    body = {"model": "tiny", **field, "max_tokens": 40, "temperature": 1, "seed": 3, "ignore_eos": True}
    choices = stream_chunks(server.url, path, body)
    starts, carried = round_starts(choices), carried_trees(choices)
    kept_a_draft = {t["round"] for choice in choices for t in (choice.get("specdec") or {}).get("tokens", ())
                    if t["origin"] == "accepted"}
    assert kept_a_draft
    # Every round that kept a draft was a tree round; a plain step (the answer's last token) is not.
    tree_rounds = kept_a_draft | set(carried.values())
    for c, round_index in carried.items():
        check_tree(choices[c]["specdec"]["tree"])
        assert starts[round_index][0] == c  # on the chunk that carries the round's first token
        newer = [r for r in tree_rounds if starts[r][0] == c and r > round_index]
        assert not newer  # text held back across rounds: the chunk carries its newest tree round's tree
        check_kept_path(choices[c]["specdec"]["tree"], choices[c], starts[round_index][1])
    for round_index in kept_a_draft:  # each one's tree went out, or a newer tree round's in its chunk
        chunk = starts[round_index][0]
        assert carried.get(chunk, -1) >= round_index
