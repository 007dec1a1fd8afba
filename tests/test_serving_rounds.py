"""benchmarks/serving.py --rounds: the median round in the tables, each round's ratio to plain in the summary."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "serving.py"


@pytest.fixture(scope="module")
def serving():
    spec = importlib.util.spec_from_file_location("serving_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being made
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def level_run(label: str, concurrency: int, throughput: float) -> dict:
    """What bench_level returns for one server at one level."""
    return {"label": label, "model": "m", "runs": [{"concurrency": concurrency, "output_throughput": throughput}]}


def test_rounds_merge_to_the_median_run_and_pair_ratios_by_round(serving):
    def rounds(label, level, throughputs, skip=()):
        return [{**level_run(label, level, tp), "round": r} for r, tp in enumerate(throughputs, 1) if r not in skip]

    measured = {"plain": {"flags": ["plain"], "levels": {1: rounds("plain", 1, (100.0, 110.0, 90.0)),
                                                          16: rounds("plain", 16, (1000.0, 1200.0, 1100.0), skip=(2,))}},
                "auto": {"flags": ["auto"], "levels": {1: rounds("auto", 1, (130.0, 120.0, 140.0)),
                                                        16: rounds("auto", 16, (900.0, 1260.0, 1100.0))}}}
    entries = serving.merge_rounds(measured)
    plain = {r["concurrency"]: r for r in entries["plain"]["runs"]}
    assert plain[1]["output_throughput"] == 100.0 and plain[1]["rounds"] == [[1, 100.0], [2, 110.0], [3, 90.0]]
    assert plain[16]["output_throughput"] == 1000.0 and entries["auto"]["flags"] == ["auto"]
    result = {"servers": list(entries.values())}
    lines = serving.round_ratio_lines(result)
    assert lines == ["auto / plain at concurrency 1, by round: 1.30 1.09 1.56 (median 1.30)",
                     "auto / plain at concurrency 16, by round: 0.90 1.00 (median 0.95)"]  # plain missed round 2


def test_a_single_round_has_no_round_lines(serving):
    result = {"servers": [{"label": "plain", "runs": [{"concurrency": 1, "output_throughput": 5.0}]},
                          {"label": "auto", "runs": [{"concurrency": 1, "output_throughput": 6.0}]}]}
    assert serving.round_ratio_lines(result) == []


def test_an_auto_servers_bandit_is_noted_at_its_levels_load_bucket(serving):
    controller = {"arms": [0, 2, 4], "buckets": [
        {"load": 1, "arm": 4, "leader": 4, "windows": 9, "scores": {"0": 170.4, "2": 250.0, "4": 262.6}},
        {"load": 16, "arm": 0, "leader": 2, "windows": 3, "scores": {"0": 2300.0, "2": 2400.2, "4": None}}]}
    run = {"concurrency": 16, "output_throughput": 900.0, "controller": controller}
    assert serving.auto_note(run, 16) == "; auto at 16: cap 0 (leader 2; tok/s by cap 0: 2300, 2: 2400)"
    assert serving.auto_note(run, 13) == serving.auto_note(run, 16)  # the same bucket
    assert serving.auto_note(run, 1) == "; auto at 1: cap 4 (leader 4; tok/s by cap 0: 170, 2: 250, 4: 263)"
    assert serving.auto_note(run, 4) == ""  # no window scored at 4 in flight
    assert serving.auto_note({"output_throughput": 1.0, "controller": None}, 1) == ""


def test_servers_start_in_the_order_named_and_plain_b_only_when_named(serving):
    plan = serving.GPU
    assert [s.label for s in serving.choose_servers(plan, None)] == ["plain", "auto", "one-at-a-time", "k4"]
    chosen = serving.choose_servers(plan, "auto,plain,plain-b")
    assert [s.label for s in chosen] == ["auto", "plain", "plain-b"]
    assert chosen[2].all_flags == chosen[1].all_flags  # the A/A control: plain again
    with pytest.raises(SystemExit, match="unknown server fast"):
        serving.choose_servers(plan, "plain,fast")


def test_a_plan_at_some_of_its_levels_keeps_their_n(serving):
    plan = serving.GPU.only((16, 32))
    assert plan.levels == (16, 32) and [plan.n_at(v) for v in plan.levels] == [32, 64]
    assert [s.levels for s in plan.servers() if s.label == "one-at-a-time"] == [(16,)]
    with pytest.raises(SystemExit, match="no level"):
        serving.GPU.only((7,))


def test_a_servers_gpu_memory_is_read_from_nvidia_smi_s_listing(serving):
    listing = "4242, 33012\n977, 22980\n4242, 512\nNo running processes found\n"
    assert serving.gpu_mib_of(listing, 4242) == 33524  # summed over the GPUs it holds
    assert serving.gpu_mib_of(listing, 977) == 22980
    assert serving.gpu_mib_of(listing, 1) is None
    assert serving.gpu_mib_of("", 4242) is None
