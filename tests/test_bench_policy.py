"""`specdec bench policy`: runs each policy in order then reversed, the faster of the two counts;
the engine run it times emits what plain decoding emits."""

from specdec.bench.policy import best_of_two, run_engine
from specdec.models.slots import LoopSlots
from specdec.engine.controller import Auto, FixedK


def test_best_of_two_runs_in_order_then_reversed_and_keeps_the_faster():
    calls, rates = [], {"plain": iter([3.0, 5.0]), "auto": iter([4.0, 2.0])}

    def run_one(name):
        calls.append(name)
        return {"tokens_per_second": next(rates[name])}

    runs = best_of_two(run_one, ["plain", "auto"])
    assert calls == ["plain", "auto", "auto", "plain"]
    assert runs["plain"]["tokens_per_second"] == 5.0 and runs["auto"]["tokens_per_second"] == 4.0


class _Loaded:  # the parts of a LoadedModel run_engine reads
    def __init__(self, model):
        self.model = model


def test_run_engine_emits_the_same_tokens_plain_fixed_and_auto(tiny_target):
    slots, prompts = LoopSlots(tiny_target.with_own_cache, 2), [[5, 6, 5, 6, 5], [9, 8, 9, 8]]
    outs = [run_engine(_Loaded(tiny_target), slots, policy, prompts, "lookup", 12)["outputs"]
            for policy in (FixedK(0), FixedK(3), Auto(3))]
    assert outs[0] == outs[1] == outs[2] and all(len(o) == 12 for o in outs[0])
