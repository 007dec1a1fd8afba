"""A trace of the auto policy's inputs and plans, step by step, from every process that imports specdec
(servers started by benchmarks/serving.sh included): put this folder first on PYTHONPATH and name an
output folder in PLAN_TRACE_OUT, and each process appends one JSON line a plan to trace-<pid>.jsonl there:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl   # on the GPU machine
    PYTHONPATH=benchmarks/plan_trace:/tmp/site PLAN_TRACE_OUT=$OUT bash benchmarks/serving.sh ...

A plan line: the step, the guard's load and mode, the decoding sequences, the drafts planned (ks: in
all, nk: sequences drafting), the draft cost at that load (fixed and a pass, ms; a token caught up on,
us), the step calibration's factor, the catch-up entries (ms in all), the sequences behind and their
unseen tokens, the median acceptance estimate, and the predicted and plain tokens per second. A line
with "rec": a timed drafting step (ms, passes, tokens caught up on). A diagnostic, not the product:
it wraps private methods of BatchedEngine and follows them as they change.
"""
import atexit
import json
import os
import time


def _plan_line(engine, decoding, plan) -> dict:
    cost, calibration = engine._draft_cost, engine._calibration
    alphas = sorted(engine._acceptance.estimates([(s.drafter.name, s.evidence.accepted, s.evidence.judged)
                                                  for s in decoding]))
    return {"t": round(time.time(), 4), "step": engine._steps, "load": engine._load, "n": len(decoding),
            "mode": engine._drafting(), "ks": sum(plan.ks), "nk": sum(1 for k in plan.ks if k),
            "fixed": round(cost.fixed * 1e3, 3), "pp": round(cost.per_pass * 1e3, 3),
            "pu": round(cost.per_unseen_token * 1e6, 2), "factor": round(calibration.factor, 3),
            "entry": round(sum(engine._entry_costs(decoding)) * 1e3, 3),
            "behind": sum(1 for s in decoding if engine._behind(s)),
            "unseen": sum(engine._unseen(s) for s in decoding if engine._behind(s)),
            "alpha": round(alphas[len(alphas) // 2], 3) if alphas else None,
            "pred": round(plan.predicted_tokens_per_second), "plain": round(plan.plain_tokens_per_second)}


def _install(folder: str) -> None:
    from specdec import batching

    trace = open(os.path.join(folder, f"trace-{os.getpid()}.jsonl"), "a", buffering=1 << 16)
    atexit.register(trace.flush)
    engine_class = batching.BatchedEngine
    auto_plan, record_drafting = engine_class._auto_plan, engine_class._record_drafting

    def traced_plan(self, decoding):
        plan = auto_plan(self, decoding)
        trace.write(json.dumps(_plan_line(self, decoding, plan)) + "\n")
        return plan

    def traced_record(self, seconds):
        trace.write(json.dumps({"rec": round(seconds * 1e3, 3), "passes": self._draft_passes,
                                "caught": self._caught_up_on, "load": self._load}) + "\n")
        return record_drafting(self, seconds)

    engine_class._auto_plan, engine_class._record_drafting = traced_plan, traced_record


if os.environ.get("PLAN_TRACE_OUT"):
    try:
        _install(os.environ["PLAN_TRACE_OUT"])
    except ImportError:  # a process without specdec on its path (pip, a shell tool)
        pass
