"""Prometheus metrics, named as vLLM names its own under a `specdec:` prefix.

Tools that read vLLM's speculation counters (`vllm:spec_decode_num_drafts_total`, ...) read ours by
swapping the prefix. Each server owns its registry, so tests can start several apps in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specdec.generation import SpecStats
from specdec.guard import MODES, OPEN

PREFIX = "specdec:"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                   1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        r, m = self.registry, PREFIX
        labels = ["model_name"]
        self.running = Gauge(m + "num_requests_running", "Requests generating now.", labels, registry=r)
        self.waiting = Gauge(m + "num_requests_waiting", "Requests waiting for the engine.", labels, registry=r)
        self.seq_running = Gauge(m + "num_sequences_running", "Sequences in the engine's batch (a request "
                                 "with n > 1 brings n).", labels, registry=r)
        self.seq_waiting = Gauge(m + "num_sequences_waiting", "Sequences waiting for a slot.", labels, registry=r)
        self.batch_size = Gauge(m + "batch_size", "Sequences in the engine's latest step.", labels, registry=r)
        self.decided_batch = Gauge(m + "speculation_batch_size", "Sequences in the latest target pass, prefilling "
                                   "ones included (engine.last_decision).", labels, registry=r)
        self.decided_k = Gauge(m + "speculation_k", "Drafts each decoding sequence of the latest pass verified "
                               "(--speculation auto: chosen per step), by its place in the batch.",
                               labels + ["sequence"], registry=r)
        self.guard_open = Gauge(m + "speculation_guard_open", "--speculation auto: 1 where the throughput guard lets "
                                "the policy draft at this batch size, 0 where it holds it to plain steps.",
                                labels + ["batch"], registry=r)
        self.guard_score = Gauge(m + "speculation_guard_score", "--speculation auto: the median realized tokens/s "
                                 "over plain decoding's predicted tokens/s of the guard's recent windows, by "
                                 "batch size and mode (open: the policy drafts; closed: plain steps).",
                                 labels + ["batch", "mode"], registry=r)
        self.max_num_seqs = Gauge(m + "max_num_seqs", "Slots: the most sequences one step runs.", labels, registry=r)
        self.kv_cache_bytes = Gauge(m + "kv_cache_bytes", "Bytes of the target's preallocated slot KV cache "
                                    "(0: caches grow per sequence).", labels, registry=r)
        self.steps = Counter(m + "engine_steps", "Engine steps (one forward over the batch each).", labels, registry=r)
        self.step_sequences = Counter(m + "engine_step_sequences", "Sequences over all engine steps: divided by "
                                      "engine_steps, the mean batch size.", labels, registry=r)
        self.success = Counter(m + "request_success", "Finished requests by finish reason.",
                               labels + ["finished_reason"], registry=r)
        self.rejected = Counter(m + "request_rejected", "Requests answered with an error, by status.",
                                labels + ["status"], registry=r)
        self.abandoned = Counter(m + "request_abandoned", "Requests whose client left while they waited "
                                 "in the queue (never run).", labels, registry=r)
        self.prompt_tokens = Counter(m + "prompt_tokens", "Prompt tokens processed.", labels, registry=r)
        self.generation_tokens = Counter(m + "generation_tokens", "Tokens generated.", labels, registry=r)
        self.ttft = Histogram(m + "time_to_first_token_seconds", "Time to first token.", labels,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(m + "inter_token_latency_seconds", "Time between two emitted tokens.", labels,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(m + "e2e_request_latency_seconds", "Request latency, arrival to last token.",
                             labels, buckets=LATENCY_BUCKETS, registry=r)
        self.num_drafts = Counter(m + "spec_decode_num_drafts", "Rounds that drafted at least one token.",
                                  labels, registry=r)
        self.num_draft_tokens = Counter(m + "spec_decode_num_draft_tokens", "Draft tokens proposed.",
                                        labels, registry=r)
        self.num_accepted = Counter(m + "spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                                    labels, registry=r)
        self.accepted_per_pos = Counter(m + "spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each position of a round.",
                                        labels + ["position"], registry=r)
        self.model = model_name
        for counter in (self.prompt_tokens, self.generation_tokens, self.num_drafts, self.num_draft_tokens,
                        self.num_accepted, self.abandoned, self.steps, self.step_sequences):
            counter.labels(model_name)  # show 0 from the start, so that readers can take differences

    def set_queue(self, running: int, waiting: int, seq_running: int = 0, seq_waiting: int = 0) -> None:
        m = self.model
        self.running.labels(m).set(running)
        self.waiting.labels(m).set(waiting)
        self.seq_running.labels(m).set(seq_running)
        self.seq_waiting.labels(m).set(seq_waiting)

    def set_capacity(self, max_num_seqs: int, kv_cache_bytes: int) -> None:
        self.max_num_seqs.labels(self.model).set(max_num_seqs)
        self.kv_cache_bytes.labels(self.model).set(kv_cache_bytes)

    def step(self, sequences: int) -> None:
        """The engine is about to step `sequences` sequences."""
        if sequences:
            self.batch_size.labels(self.model).set(sequences)
            self.steps.labels(self.model).inc()
            self.step_sequences.labels(self.model).inc(sequences)

    def decided(self, decision) -> None:
        """The engine's latest speculation.StepDecision (None before its first pass)."""
        if decision is None:
            return
        self.decided_batch.labels(self.model).set(decision.batch_size)
        self.decided_k.clear()  # only this pass's sequences: the batch changes from step to step
        for place, k in enumerate(decision.ks):
            self.decided_k.labels(self.model, str(place)).set(k)

    def set_guard(self, summary) -> None:
        """The engine's ThroughputGuard.summary, per batch size (read as /metrics is scraped)."""
        for row in summary:
            batch = str(row["batch"])
            self.guard_open.labels(self.model, batch).set(1 if row["mode"] == OPEN else 0)
            for mode in MODES:
                if row[f"{mode}_score"] is not None:
                    self.guard_score.labels(self.model, batch, mode).set(row[f"{mode}_score"])

    def reject(self, status: int) -> None:
        self.rejected.labels(self.model, str(status)).inc()

    def abandon(self) -> None:
        self.abandoned.labels(self.model).inc()

    def finish(self, reason: str, prompt_tokens: int, stats: SpecStats, latency: float) -> None:
        """Count one finished (or aborted) request and its speculation."""
        m = self.model
        self.success.labels(m, reason).inc()
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(stats.generated)
        self.e2e.labels(m).observe(latency)
        # A round drafts at every position up to its length, so drafts = rounds that drafted position 0.
        self.num_drafts.labels(m).inc(stats.drafted_per_position[0] if stats.drafted_per_position else 0)
        self.num_draft_tokens.labels(m).inc(stats.drafted)
        self.num_accepted.labels(m).inc(stats.accepted)
        for pos, count in enumerate(stats.accepted_per_position):
            self.accepted_per_pos.labels(m, str(pos)).inc(count)

    def token_latency(self, first: bool, seconds: float) -> None:
        (self.ttft if first else self.itl).labels(self.model).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
