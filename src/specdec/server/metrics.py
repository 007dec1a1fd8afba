"""Prometheus metrics, named as vLLM names its own under a `specdec:` prefix.

Tools that read vLLM's speculation counters (`vllm:spec_decode_num_drafts_total`, ...) read ours by
swapping the prefix. Each server owns its registry, so tests can start several apps in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specdec.generation import SpecStats

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
        self.decided_batch = Gauge(m + "speculation_batch_size", "Decoding sequences in the latest target pass "
                                   "(engine.last_step).", labels, registry=r)
        self.decided_k = Gauge(m + "speculation_k", "The draft budget of each decoding sequence of the latest pass "
                               "(--speculation auto: its load's cap), by its place in the batch.",
                               labels + ["sequence"], registry=r)
        self.auto_cap = Gauge(m + "speculation_auto_cap", "--speculation auto: the draft cap in force at each load "
                              "bucket (0: plain steps).", labels + ["load"], registry=r)
        self.auto_score = Gauge(m + "speculation_auto_score", "--speculation auto: the median tokens/s of the "
                                "latest windows at each load bucket and cap.", labels + ["load", "cap"], registry=r)
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

    def decided(self, trace) -> None:
        """The engine's latest controller.StepTrace (None before its first pass)."""
        if trace is None:
            return
        self.decided_batch.labels(self.model).set(len(trace.plan.budgets))
        self.decided_k.clear()  # only this pass's sequences: the batch changes from step to step
        for place, k in enumerate(trace.plan.budgets):
            self.decided_k.labels(self.model, str(place)).set(k)

    def set_controller(self, summary: dict) -> None:
        """The speculation controller's summary (auto's buckets; read as /metrics is scraped)."""
        for row in summary.get("buckets", ()):
            load = str(row["load"])
            self.auto_cap.labels(self.model, load).set(row["arm"])
            for cap, score in row["scores"].items():
                if score is not None:
                    self.auto_score.labels(self.model, load, cap).set(score)

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
