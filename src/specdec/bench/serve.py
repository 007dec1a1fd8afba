"""`specdec bench serve`: load-test any OpenAI-compatible server, as `vllm bench serve` does.

For each concurrency level, N streamed requests run with at most C in flight. Per request we time
the first content chunk (TTFT), the gaps between content chunks (ITL), and the time per output
token after the first (TPOT); per level, request and token throughput. When the server exposes
speculation counters on /metrics (ours as `specdec:spec_decode_*`, vLLM's as `vllm:spec_decode_*`),
their change over the level gives alpha and the mean acceptance length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from specdec.bench.cli import add_output_flags
from specdec.commands import json_object
from specdec.errors import InvalidRequestError

SPEC_COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
PERCENTILES = (50, 90, 99)


def register(sub) -> None:
    p = sub.add_parser("serve", help="load-test an OpenAI-compatible server (TTFT, TPOT, ITL, throughput)",
                       description="Stream N requests per concurrency level to a running server and report "
                                   "latency percentiles and throughput, like `vllm bench serve`.")
    p.add_argument("--base-url", default=None, help="server root, e.g. http://127.0.0.1:8000 (one server)")
    p.add_argument("--server", action="append", default=[], metavar="LABEL=URL",
                   help="a server to compare, repeatable (e.g. plain=http://h:8000 k4=http://h:8001); each "
                        "level runs on each server in turn; speedups are against the one labelled `plain` "
                        "(else the first), and a plot of speedup against concurrency is saved")
    p.add_argument("--model", default=None, help="model id to send (default: the first of /v1/models)")
    p.add_argument("--prompts", default=None, help="JSONL (prompt/text/turns) or one prompt a line "
                                                   "(default: a few built-in chat prompts)")
    p.add_argument("--concurrency", default="1,4,16,32", help="comma-separated levels (default: %(default)s)")
    p.add_argument("--n", type=int, default=200, help="requests per concurrency level (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=256, help="max_tokens per request (default: %(default)s)")
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (vLLM and specdec honour it)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: %(default)s)")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat",
                   help="/v1/chat/completions or /v1/completions (default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token ($OPENAI_API_KEY)")
    p.add_argument("--extra-body", type=json_object, default={},
                   help="JSON merged into every request, e.g. '{\"draft\": \"none\"}' for our plain baseline")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default: %(default)s)")
    p.add_argument("--label", default="", help="a name for this run, kept in the JSON and the scoreboard row")
    p.add_argument("--change", default="", help="what changed since the last run, kept in the JSON")
    add_output_flags(p)
    p.set_defaults(func=run)


@dataclass
class RequestResult:
    ok: bool = False
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # seconds to the first content chunk
    latency: float = 0.0  # seconds to the end of the stream
    itls: list[float] = field(default_factory=list)  # gaps between content chunks
    chunks: int = 0  # content chunks received (0: an empty answer, which has no TTFT)
    error: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def _content(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""


async def one_request(client, path: str, body: dict) -> RequestResult:
    """Stream one request; times each content chunk as it arrives."""
    result, chunks, last = RequestResult(), 0, 0.0
    start = time.perf_counter()
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    result.error = str(chunk["error"].get("message"))
                    return result
                now = time.perf_counter()
                if _content(chunk):
                    if chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itls.append(now - last)
                    chunks, last = chunks + 1, now
                if chunk.get("usage"):
                    result.output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                    result.prompt_tokens = int(chunk["usage"].get("prompt_tokens") or 0)
    except Exception as exc:  # noqa: BLE001 - any failure is one failed request, reported, not fatal
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency = time.perf_counter() - start
    result.output_tokens = result.output_tokens or chunks  # servers without usage: one token a chunk
    result.chunks, result.ok = chunks, True
    return result


def request_body(args: argparse.Namespace, model: str, prompt: str) -> dict:
    body = {"model": model, "max_tokens": args.max_tokens, "temperature": args.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if args.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if args.ignore_eos:
        body["ignore_eos"] = True
    body.update(args.extra_body or {})
    return body


async def run_level(client, args, model: str, prompts: list[str], concurrency: int):
    """N requests, at most `concurrency` in flight. Returns (results, wall seconds)."""
    path = "/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions"
    gate = asyncio.Semaphore(concurrency)

    async def gated(i: int) -> RequestResult:
        async with gate:
            return await one_request(client, path, request_body(args, model, prompts[i % len(prompts)]))

    start = time.perf_counter()
    results = await asyncio.gather(*(gated(i) for i in range(args.n)))
    return results, time.perf_counter() - start


def _stats_ms(name: str, values: list[float]) -> dict:
    ms = [v * 1000 for v in values]
    out = {f"mean_{name}_ms": statistics.fmean(ms) if ms else 0.0,
           f"median_{name}_ms": statistics.median(ms) if ms else 0.0}
    for q in PERCENTILES[1:]:
        out[f"p{q}_{name}_ms"] = _percentile(ms, q)
    return out


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(results: list[RequestResult], duration: float, concurrency: int) -> dict:
    done = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    summary = {
        "concurrency": concurrency, "num_prompts": len(results), "completed": len(done),
        "failed": len(results) - len(done), "duration": duration,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(done) / duration if duration else 0.0,
        "output_throughput": out_tokens / duration if duration else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration else 0.0,
    }
    summary.update(_stats_ms("ttft", [r.ttft for r in done if r.chunks]))
    summary.update(_stats_ms("tpot", [t for r in done if (t := r.tpot) is not None]))
    summary.update(_stats_ms("itl", [gap for r in done for gap in r.itls]))
    summary.update(_stats_ms("e2el", [r.latency for r in done]))
    summary["errors"] = sorted({r.error for r in results if r.error})[:5]
    return summary


def parse_spec_counters(metrics_text: str) -> dict | None:
    """Speculation counters (ours or vLLM's) from Prometheus text; None when the server has none."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict = {}
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        base = family.name.split(":", 1)[-1].removesuffix("_total")
        if base in SPEC_COUNTERS:
            counts.setdefault(base, 0.0)  # a family with no samples yet still means "the server counts"
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if base == "spec_decode_num_accepted_tokens_per_pos":
                pos = int(sample.labels.get("position", 0))
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
            elif base in SPEC_COUNTERS:
                counts[base] = counts.get(base, 0.0) + sample.value
    if not counts:
        return None
    counts["per_pos"] = per_pos
    return counts


def spec_delta(before: dict | None, after: dict | None) -> dict | None:
    if not before or not after:
        return None
    d = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in SPEC_COUNTERS}
    drafts, drafted, accepted = (d[n] for n in SPEC_COUNTERS)
    per_pos = {p: after["per_pos"].get(p, 0.0) - before["per_pos"].get(p, 0.0) for p in after["per_pos"]}
    return {"num_drafts": drafts, "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else 0.0,  # vLLM's definition (tau)
            "acceptance_rate_per_pos": [per_pos[p] / drafts if drafts else 0.0 for p in sorted(per_pos)]}


async def _metrics(client) -> dict | None:
    try:
        response = await client.get("/metrics")
        return parse_spec_counters(response.text) if response.status_code == 200 else None
    except Exception:  # noqa: BLE001 - a server without /metrics (a cloud API) is fine
        return None


async def _speculation(client) -> dict:
    """Our server's speculation controller summary as /speculation gives it (auto: its caps and scores
    by load bucket); None from other servers."""
    try:
        response = await client.get("/speculation")
        shown = response.json() if response.status_code == 200 else {}
    except Exception:  # noqa: BLE001 - not our server
        shown = {}
    return {"controller": shown.get("controller") or None}


async def _server_info(client, model: str | None) -> tuple[str, dict]:
    """The model id (the first served one unless given) and our server's speculation settings."""
    try:
        response = await client.get("/v1/models")
        cards = response.json().get("data", []) if response.status_code == 200 else []
    except Exception:  # noqa: BLE001
        cards = []
    card = next((c for c in cards if model in (None, c.get("id"))), {})
    if model is None and not card:
        raise InvalidRequestError("--model not given and /v1/models lists none; pass --model NAME")
    return model or card["id"], card.get("specdec") or {}


async def bench(args: argparse.Namespace, prompts: list[str], levels: list[int],
                servers: list[tuple[str, str]]) -> dict:
    """Each level on each server in turn (side by side, so that drift on the machine hits all alike)."""
    import httpx
    from contextlib import AsyncExitStack

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=max(levels) + 4)
    async with AsyncExitStack() as stack:
        clients, out = {}, {}
        for label, url in servers:
            base = url.rstrip("/").removesuffix("/v1")
            client = await stack.enter_async_context(
                httpx.AsyncClient(base_url=base, headers=headers, timeout=args.timeout, limits=limits))
            model, spec_info = await _server_info(client, args.model)
            clients[label] = (client, model)
            out[label] = {"label": label, "base_url": url, "model": model, "server_speculation": spec_info, "runs": []}
        for concurrency in levels:
            for label, (client, model) in clients.items():
                before = await _metrics(client)
                results, duration = await run_level(client, args, model, prompts, concurrency)
                summary = summarize(results, duration, concurrency)
                summary["spec_decode"] = spec_delta(before, await _metrics(client))
                summary.update(await _speculation(client))
                out[label]["runs"].append(summary)
    return {"servers": list(out.values())}


def add_speedups(result: dict) -> str:
    """Each run's output tokens/s over the baseline server's at the same concurrency; the baseline's label."""
    servers = result["servers"]
    base = next((s for s in servers if s["label"] == "plain"), servers[0])
    refs = {run["concurrency"]: run for run in base["runs"]}  # servers may run different levels
    for server in servers:
        for run in server["runs"]:
            ref = refs.get(run["concurrency"])
            run["speedup"] = run["output_throughput"] / ref["output_throughput"] if ref and ref["output_throughput"] \
                else None
    return base["label"]


def plot_speedups(result: dict, out_dir: str) -> str:
    from specdec.bench.common import new_figure, save_plot

    fig, ax = new_figure()
    for server in result["servers"]:
        runs = server["runs"]
        ax.plot([r["concurrency"] for r in runs], [r["speedup"] or 0.0 for r in runs], marker="o", label=server["label"])
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel(f"output tokens/s over {result['baseline']}")
    ax.set_title(f"bench serve: {result['servers'][0]['model']}\nmax_tokens {result['max_tokens']}, "
                 f"{result['machine']}", fontsize=8)
    ax.legend()
    return str(save_plot(fig, out_dir, f"serve-{result['date']}"))


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidRequestError(f"--concurrency: expected numbers like 1,4,16, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise InvalidRequestError(f"--concurrency: levels must be >= 1, got {text!r}")
    return levels


def _servers(args: argparse.Namespace) -> list[tuple[str, str]]:
    servers = [("server", args.base_url)] if args.base_url else []
    for spec in args.server:
        label, sep, url = spec.partition("=")
        if not sep or not label or not url:
            raise InvalidRequestError(f"--server: expected LABEL=URL, got {spec!r}")
        servers.append((label, url))
    if not servers:
        raise InvalidRequestError("give --base-url URL or one or more --server LABEL=URL")
    if len({label for label, _ in servers}) < len(servers):
        raise InvalidRequestError("--server: each label once")
    return servers


def run(args: argparse.Namespace) -> int:
    from specdec.bench.common import read_prompts
    from specdec.bench.scoreboard import machine_name

    if args.n < 1 or args.max_tokens < 1:
        raise InvalidRequestError("--n and --max-tokens must be >= 1")
    levels = _levels(args.concurrency)
    servers = _servers(args)
    prompts = read_prompts(args.prompts)
    result = asyncio.run(bench(args, prompts, levels, servers))
    result.update(date=time.strftime("%Y%m%d-%H%M%S"), backend=f"openai-{args.endpoint}",
                  prompts=args.prompts or "built-in", max_tokens=args.max_tokens, ignore_eos=args.ignore_eos,
                  temperature=args.temperature, n=args.n, label=args.label, change=args.change,
                  machine=machine_name())
    path = report(result, args.out_dir)
    if not args.no_scoreboard:
        scoreboard_rows(result, args.scoreboard, args.extra_body)
    print(f"saved {path}" + (f"; plot {result['plot']}" if result.get("plot") else ""))
    return 0


def report(result: dict, out_dir: str) -> Path:
    """Speedups over the baseline server, the plot (with two or more servers), the JSON and a table
    per server, for a result of bench() (or runs of several benches gathered into one)."""
    from specdec.bench.scoreboard import save_json

    result["baseline"] = add_speedups(result)
    if len(result["servers"]) > 1:
        result["plot"] = plot_speedups(result, out_dir)
    path = save_json(result, out_dir, "serve")
    for server in result["servers"]:
        _print_table(result, server)
    return path


def scoreboard_rows(result: dict, scoreboard: str | Path, extra_body: dict | None = None) -> None:
    """A row per server and level, appended to the scoreboard file."""
    from specdec.bench.scoreboard import ScoreRow, append_row

    label = f" [{result['label']}]" if result.get("label") else ""
    for server in result["servers"]:
        info = server["server_speculation"]
        draft = (extra_body or {}).get("draft") or info.get("draft", "?")
        k = (extra_body or {}).get("k") or info.get("k", "-")
        name = "" if server["label"] == "server" else f"{server['label']}: "
        for r in server["runs"]:
            spec = r["spec_decode"] if r["spec_decode"] and r["spec_decode"]["num_drafts"] else {}
            append_row(ScoreRow(target=server["model"], draft=f"{name}{draft} (serve, c={r['concurrency']}){label}",
                                k=str(k) if spec else "-", precision="-", tokens_per_second=r["output_throughput"],
                                speedup=r.get("speedup") if len(result["servers"]) > 1 else None,
                                tau=spec.get("mean_acceptance_length"), alpha=spec.get("acceptance_rate")),
                       scoreboard)


def _print_table(result: dict, server: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    console = Console(width=max(console.width, 140))  # a pipe reports 80 columns: too few for this table

    table = Table(title=f"bench serve \\[{escape(server['label'])}]: {server['model']} ({result['backend']}, max_tokens "
                        f"{result['max_tokens']}; speedup over {result['baseline']})", title_justify="left")
    for col in ("conc.", "done/failed", "req/s", "out tok/s", "speedup", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
                "ITL p50/p99 ms", "alpha", "tau"):
        table.add_column(col, justify="right")
    for r in server["runs"]:
        spec = r["spec_decode"] if r["spec_decode"] and r["spec_decode"]["num_drafts"] else {}
        table.add_row(str(r["concurrency"]), f"{r['completed']}/{r['failed']}", f"{r['request_throughput']:.2f}",
                      f"{r['output_throughput']:.1f}", f"{r['speedup']:.2f}" if r.get("speedup") else "-",
                      f"{r['median_ttft_ms']:.0f}/{r['p99_ttft_ms']:.0f}",
                      f"{r['median_tpot_ms']:.1f}/{r['p99_tpot_ms']:.1f}",
                      f"{r['median_itl_ms']:.1f}/{r['p99_itl_ms']:.1f}",
                      f"{spec['acceptance_rate']:.2f}" if spec else "-",
                      f"{spec['mean_acceptance_length']:.2f}" if spec else "-")
    console.print(table)
    for r in server["runs"]:
        for error in r["errors"]:
            print(f"  [{server['label']}] c={r['concurrency']} error: {error}")
