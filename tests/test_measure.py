"""train.measure's summary: the same tau, alpha and speedup arithmetic as the bench commands (RunTotals)."""

from types import SimpleNamespace

import pytest

from specdec.bench.common import RunTotals
from specdec.train.measure import summarise


def totals(generated, rounds, drafted, accepted, seconds) -> RunTotals:
    t = RunTotals()
    t.add(SimpleNamespace(generated=generated, rounds=rounds, drafted=drafted, accepted=accepted,
                          decode_time=seconds, prefill_time=0.0, draft_time=0.0,
                          accepted_per_position=[], drafted_per_position=[]))
    return t


def test_summary_per_category_and_overall():
    data = {"none": {"qa": totals(10, 10, 0, 0, 1.0), "rag": totals(10, 10, 0, 0, 2.0)},
            "lookup": {"qa": totals(10, 5, 10, 5, 0.5), "rag": totals(10, 4, 12, 6, 1.0)}}
    out = summarise(data)
    assert out["lookup"]["qa"] == pytest.approx({"tau": 2.0, "alpha": 0.5, "tokens_per_second": 20.0, "speedup": 2.0})
    assert out["lookup"]["all"]["tau"] == pytest.approx(20 / 9)
    assert out["lookup"]["all"]["alpha"] == pytest.approx(11 / 22)
    assert out["lookup"]["all"]["speedup"] == pytest.approx((3.0 / 20) / (1.5 / 20))
    assert out["none"]["all"]["speedup"] == pytest.approx(1.0)


def test_a_draft_can_name_its_own_k():
    from specdec.engine import GenerationConfig
    from specdec.train.measure import split_k

    config = GenerationConfig(max_new_tokens=8, k=4)
    assert split_k("head:x.safetensors", config) == ("head:x.safetensors", config)
    spec, at_two = split_k("lookup+head:x.safetensors:0.2@2", config)
    assert spec == "lookup+head:x.safetensors:0.2" and at_two.k == 2 and at_two.max_new_tokens == 8
    for bad in ("head:x@0", "head:x@two"):
        with pytest.raises(ValueError, match="after @"):
            split_k(bad, config)
