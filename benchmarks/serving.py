"""The serving benchmark of issue 26: `specdec bench serve` against several `specdec serve` processes.

On a GPU: the random-weight Llama-3.1-8B target (`random:llama-3.1-8b`, bf16) and the oracle drafter
at alpha 0.8 paying a random Llama-3.2-1B's draft cost (`oracle:0.8:random:llama-3.2-1b`), served
four ways, one server at a time: plain one sequence at a time (`--max-num-seqs 1`, the server before
batching), plain batched, a fixed K, and `--speculation auto`. Each server starts on 127.0.0.1,
answers warm-up requests (the oracle records the target's continuation of each prompt then, and
Triton compiles its kernels), and then each concurrency level runs `--n` streamed requests of
`--max-tokens` tokens (ignore_eos, greedy). The runs of all servers are gathered into one result:
the JSON, the plot of speedup against concurrency and the tables of `specdec bench serve`, a
scoreboard row per server and level, the servers' logs and a short summary table, all under --out.

Random weights and the oracle measure the engine and the server, not a model pair: every number
here is labelled so. With --smoke (and on a machine without a GPU) the same run at a tiny size on
the CPU, a few requests a level, tests this script end to end in about a minute. With --cpu, the
README's CPU table: the embedded SmolLM2-135M with its default drafter (`auto`: lookup, then the
embedded draft model) on this machine's CPU, one torch thread a server.

    bash benchmarks/serving.sh [--smoke | --cpu] [--servers plain,auto] [--levels 16,32] [--rounds R] [--out DIR] [--deadline-s S]

With --rounds R > 1 the chosen servers run side by side instead: all started and warmed first, then
each level on each server in turn, R times, so that a ratio compares runs minutes apart and the
rounds' spread shows its noise (one server after another, a run's ratio at 16 and 32 in flight moved
by about ten percent on the H200).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class ServerSpec:
    """One server of the comparison: its label, its slots (--max-num-seqs), its flags beyond the
    plan's and those, its levels (None: all of the plan's) and the most requests a level (None: the
    plan's n)."""

    label: str
    slots: int
    flags: tuple[str, ...]
    levels: tuple[int, ...] | None = None
    max_n: int | None = None

    @property
    def all_flags(self) -> tuple[str, ...]:
        return ("--max-num-seqs", str(self.slots), *self.flags)


@dataclass(frozen=True)
class Plan:
    """What one run serves and asks. n_per_level: requests at each concurrency level."""

    target: str
    draft: str  # the oracle: the speculative servers' drafter
    k: int
    device: str
    max_num_seqs: int
    max_model_len: int
    levels: tuple[int, ...]
    n_per_level: tuple[int, ...]
    max_tokens: int
    warmup_tokens: int
    server_flags: tuple[str, ...] = ()
    label: str = "oracle alpha 0.8 on random weights (random:llama-3.1-8b): an engine measurement"
    start_timeout_s: float = 420.0  # Triton compiles and graph captures of the first server dominate
    request_timeout_s: float = 180.0

    def n_at(self, level: int) -> int:
        return dict(zip(self.levels, self.n_per_level))[level]

    def only(self, levels: tuple[int, ...]) -> "Plan":
        """The same plan at some of its levels (their n unchanged)."""
        unknown = sorted(set(levels) - set(self.levels))
        if unknown:
            raise SystemExit(f"serving: no level {unknown} in this plan; its levels are {list(self.levels)}")
        kept = [v for v in self.levels if v in levels]
        return replace(self, levels=tuple(kept), n_per_level=tuple(self.n_at(v) for v in kept))

    def servers(self) -> list[ServerSpec]:
        """In order of need, should the deadline cut the run short: plain (every speedup's
        baseline), auto, the server of one sequence at a time, and the fixed K."""
        spec = ("--draft", self.draft, "-k", str(self.k))
        # One at a time, throughput does not depend on the concurrency: the first level and the
        # largest up to 16 say so (the target reads batched plain at 16 against this server),
        # with no more requests than that concurrency (they all wait their turn anyway).
        top = max((v for v in self.levels if v <= 16), default=self.levels[0])
        return [ServerSpec("plain", self.max_num_seqs, ("--draft", "none")),
                ServerSpec("auto", self.max_num_seqs, (*spec, "--speculation", "auto")),
                ServerSpec("one-at-a-time", 1, ("--draft", "none"), tuple(sorted({self.levels[0], top})), top),
                ServerSpec(f"k{self.k}", self.max_num_seqs, (*spec, "--speculation", str(self.k)))]

    def control(self) -> ServerSpec:
        """A second plain server (only when --servers names it): plain against itself, whose ratio
        says what a server's start order and its neighbours on the GPU cost, with no speculation."""
        return ServerSpec("plain-b", self.max_num_seqs, ("--draft", "none"))


# n per level: 8 at concurrency 1, else twice the concurrency (the whole GPU run: about 5 minutes).
GPU = Plan(target="random:llama-3.1-8b", draft="oracle:0.8:random:llama-3.2-1b", k=4, device="cuda",
           max_num_seqs=32, max_model_len=1024, levels=(1, 4, 16, 32), n_per_level=(8, 16, 32, 64),
           max_tokens=256, warmup_tokens=128)
SMOKE = Plan(target="random:llama-tiny", draft="oracle:0.8:random:llama-tiny", k=4, device="cpu",
             max_num_seqs=4, max_model_len=512, levels=(1, 4), n_per_level=(2, 4), max_tokens=16,
             warmup_tokens=4, server_flags=("--threads", "1"), start_timeout_s=120.0, request_timeout_s=60.0,
             label="oracle alpha 0.8 on random weights (random:llama-tiny): a smoke run")
# The embedded model and its default drafter on the CPU (about 20 minutes on 2 shared cores).
CPU = Plan(target="default", draft="auto", k=4, device="cpu", max_num_seqs=16, max_model_len=1024,
           levels=(1, 4, 16), n_per_level=(8, 16, 32), max_tokens=64, warmup_tokens=16,
           server_flags=("--threads", "1"), start_timeout_s=180.0, request_timeout_s=600.0,
           label="embedded SmolLM2-135M, default drafter (auto), one torch thread")


class Deadline(Exception):
    """The run's own time limit passed (--deadline-s), or it was told to stop (SIGTERM): what was
    measured is still reported."""


STARTED: list["Server"] = []  # every server this run started, stopped again at the end whatever happened


class Server:
    """`specdec serve` in a session of its own (so that stopping it stops all it started)."""

    def __init__(self, plan: Plan, spec: ServerSpec, log):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "specdec.cli", "serve", "--target", plan.target, "--device", plan.device,
               "--max-model-len", str(plan.max_model_len), "--max-queue", "128", "--graceful-timeout", "5",
               "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
               *plan.server_flags, *spec.all_flags]
        log.write(f"\n==== {spec.label}: {' '.join(cmd)}\n")
        log.flush()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        STARTED.append(self)

    def wait_ready(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode} (see servers.log)")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"the server did not answer /health within {timeout_s:.0f} s (see servers.log)")

    def stop(self) -> None:
        """SIGTERM to its session, then SIGKILL after 30 s."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def bench_level(url: str, label: str, concurrency: int, n: int, max_tokens: int, timeout_s: float,
                work: Path) -> dict:
    """One level on one server through `specdec bench serve` (in this process): its server entry."""
    from specdec.cli import main

    out = Path(tempfile.mkdtemp(dir=work))
    status = main(["bench", "serve", "--server", f"{label}={url}", "--concurrency", str(concurrency),
                   "--n", str(n), "--max-tokens", str(max_tokens), "--ignore-eos", "--temperature", "0",
                   "--timeout", str(timeout_s), "--out-dir", str(out), "--no-scoreboard"])
    if status != 0:
        raise RuntimeError(f"bench serve failed on {label} at concurrency {concurrency} (status {status})")
    (saved,) = out.glob("serve-*.json")
    return json.loads(saved.read_text())["servers"][0]


def warm_up(plan: Plan, spec: ServerSpec, server: Server, work: Path) -> None:
    """Every prompt at the server's own batch size, twice as many requests as slots so that the
    second wave joins a running batch: the oracle's recordings, and Triton's compiles and tunings for
    the mixed prefill/decode shapes (else they stall the first level that meets them)."""
    bench_level(server.url, spec.label, spec.slots, max(2 * spec.slots, 4), plan.warmup_tokens,
                plan.request_timeout_s, work)


def levels_of(plan: Plan, spec: ServerSpec) -> tuple[int, ...]:
    return spec.levels or plan.levels


def measure_level(plan: Plan, spec: ServerSpec, server: Server, level: int, work: Path) -> dict:
    """One level on one server (at most spec.max_n requests): its server entry."""
    n = min(plan.n_at(level), spec.max_n or plan.n_at(level))
    return bench_level(server.url, spec.label, level, n, plan.max_tokens, plan.request_timeout_s, work)


def run_server(plan: Plan, spec: ServerSpec, log, work: Path, entries: dict) -> None:
    """Start one server, warm it up, run its levels into entries[label], stop it."""
    server = Server(plan, spec, log)
    started = time.monotonic()
    try:
        server.wait_ready(plan.start_timeout_s)
        print(f"[{spec.label}] ready in {time.monotonic() - started:.0f} s; warming up", flush=True)
        warm_up(plan, spec, server, work)
        for level in levels_of(plan, spec):
            run = measure_level(plan, spec, server, level, work)
            runs = entries[spec.label]["runs"] if spec.label in entries else []
            entries[spec.label] = {**run, "runs": runs + run["runs"], "flags": list(spec.all_flags)}
    except Deadline:
        raise
    except Exception as exc:  # noqa: BLE001 - one server's failure: the others still run and report
        print(f"[{spec.label}] failed: {type(exc).__name__}: {exc}", flush=True)
    finally:
        server.stop()
        print(f"[{spec.label}] stopped after {time.monotonic() - started:.0f} s", flush=True)


def run_interleaved(plan: Plan, specs: list[ServerSpec], rounds: int, log, work: Path, measured: dict) -> None:
    """Every server up at once, warmed; then each level runs on each server in turn, `rounds` times,
    the order reversed every other round, into measured[label][level] (a list of runs, one a round).
    So each round's ratio compares servers measured minutes apart at most, and the spread between
    rounds shows the noise a ratio carries."""
    try:
        _interleave(plan, specs, rounds, log, work, measured)
    except Deadline:
        raise
    except Exception as exc:  # noqa: BLE001 - what the rounds measured before it is still reported
        print(f"serving: the rounds stopped: {type(exc).__name__}: {exc}", flush=True)


def _interleave(plan: Plan, specs: list[ServerSpec], rounds: int, log, work: Path, measured: dict) -> None:
    servers = []
    for spec in specs:
        server = Server(plan, spec, log)
        started = time.monotonic()
        try:
            server.wait_ready(plan.start_timeout_s)
            warm_up(plan, spec, server, work)
        except Deadline:
            raise
        except Exception as exc:  # noqa: BLE001 - one server's failure: the others still run
            print(f"[{spec.label}] failed to start: {type(exc).__name__}: {exc}", flush=True)
            server.stop()
            continue
        servers.append((spec, server))
        print(f"[{spec.label}] ready and warmed in {time.monotonic() - started:.0f} s", flush=True)
    for level in plan.levels:
        for r in range(rounds):
            for spec, server in servers if r % 2 == 0 else servers[::-1]:
                if level not in levels_of(plan, spec):
                    continue
                try:
                    run = measure_level(plan, spec, server, level, work)
                except Deadline:
                    raise
                except Exception as exc:  # noqa: BLE001 - a failed level leaves a gap in that round, no more
                    print(f"[{spec.label}] concurrency {level}, round {r + 1} failed: {type(exc).__name__}: {exc}",
                          flush=True)
                    continue
                measured.setdefault(spec.label, {"flags": list(spec.all_flags), "levels": {}})
                measured[spec.label]["levels"].setdefault(level, []).append({**run, "round": r + 1})
                print(f"[{spec.label}] concurrency {level}, round {r + 1}: "
                      f"{run['runs'][0]['output_throughput']:.1f} out tok/s{auto_note(run['runs'][0], level)}"
                      f"{memory_note(server.proc.pid)}", flush=True)


def memory_note(pid: int) -> str:
    """", 33012 MiB on the GPU": what nvidia-smi reports the server's process holds (which servers fit
    one GPU side by side); "" where there is no nvidia-smi or it reports nothing for the process."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    mib = gpu_mib_of(out, pid)
    return "" if mib is None else f", {mib} MiB on the GPU"


def gpu_mib_of(listing: str, pid: int) -> int | None:
    """The MiB that `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`
    lists for this process (summed over GPUs), None if it lists none."""
    rows = [line.split(",") for line in listing.splitlines() if line.count(",") == 1]
    mine = [int(mib) for p, mib in rows if p.strip() == str(pid) and mib.strip().isdigit()]
    return sum(mine) if mine else None


def auto_note(run: dict, level: int) -> str:
    """An auto server's bandit at this level's load bucket after the run, e.g. "; auto at 16: cap 0
    (leader 0; tok/s by cap 0: 3010, 2: 2890, 4: 2650)"; "" from other servers."""
    from specdec.engine.auto import bucket_of

    buckets = (run.get("controller") or {}).get("buckets") or ()
    row = next((b for b in buckets if b["load"] == bucket_of(level)), None)
    if row is None:
        return ""
    scores = ", ".join(f"{cap}: {s:.0f}" for cap, s in row["scores"].items() if s is not None)
    return f"; auto at {row['load']}: cap {row['arm']} (leader {row['leader']}; tok/s by cap {scores})"


def merge_rounds(measured: dict) -> dict:
    """entries as run_server makes them from run_interleaved's rounds: for each server and level the
    run of median throughput (the lower middle one), with every round's [round, throughput] beside it."""
    entries = {}
    for label, server in measured.items():
        runs = []
        for level, tries in server["levels"].items():
            ordered = sorted(tries, key=lambda t: t["runs"][0]["output_throughput"])
            middle = ordered[(len(ordered) - 1) // 2]
            runs.append({**middle["runs"][0], "rounds": [[t["round"], t["runs"][0]["output_throughput"]] for t in tries]})
        first = next(iter(server["levels"].values()))[0]
        entries[label] = {**first, "runs": runs, "flags": server["flags"]}
    return entries


def round_ratio_lines(result: dict) -> list[str]:
    """Each server's throughput over plain's, round by round (runs measured side by side), per level."""
    by_label = {s["label"]: {r["concurrency"]: r.get("rounds") for r in s["runs"]} for s in result["servers"]}
    plain = by_label.get("plain", {})
    lines = []
    for label, levels in by_label.items():
        for level, rounds in levels.items():
            if label == "plain" or not rounds or not plain.get(level):
                continue
            base = dict(plain[level])  # round -> plain's throughput: a round one of them missed has no ratio
            ratios = [tp / base[r] for r, tp in rounds if r in base]
            if not ratios:
                continue
            lines.append(f"{label} / plain at concurrency {level}, by round: "
                         f"{' '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f})")
    return lines


def gather(plan: Plan, entries: dict, device: str) -> dict:
    """One result of `specdec bench serve`'s shape from the servers' runs, with the plan beside it."""
    from specdec.bench.scoreboard import machine_name

    return {"servers": list(entries.values()), "date": time.strftime("%Y%m%d-%H%M%S"), "backend": "openai-chat",
            "prompts": "built-in", "max_tokens": plan.max_tokens, "ignore_eos": True, "temperature": 0.0,
            "n": dict(zip(map(str, plan.levels), plan.n_per_level)), "machine": f"{machine_name()}, {device}",
            "label": plan.label,
            "change": "", "plan": asdict(plan)}


def summary_lines(result: dict) -> list[str]:
    """The short table printed last: out tok/s and speedup over plain per server and level, and the
    ratios the issue's targets are about."""
    by_label = {s["label"]: {r["concurrency"]: r for r in s["runs"]} for s in result["servers"]}
    lines = [f"{'server':<14}{'conc.':>6}{'out tok/s':>11}{'vs plain':>10}{'alpha':>7}{'tau':>6}"]
    for label, runs in by_label.items():
        for level, r in runs.items():
            spec = r.get("spec_decode") or {}
            alpha, tau = (f"{spec['acceptance_rate']:.2f}", f"{spec['mean_acceptance_length']:.2f}") \
                if spec.get("num_drafts") else ("-", "-")
            speedup = f"{r['speedup']:.2f}x" if r.get("speedup") else "-"
            lines.append(f"{label:<14}{level:>6}{r['output_throughput']:>11.1f}{speedup:>10}{alpha:>7}{tau:>6}"
                         f"{auto_note(r, level)}")
    plain, alone = by_label.get("plain", {}), by_label.get("one-at-a-time", {})
    for level in sorted(set(plain) & set(alone)):
        ratio = plain[level]["output_throughput"] / alone[level]["output_throughput"]
        lines.append(f"plain batched / one-at-a-time at concurrency {level}: {ratio:.1f}x")
    return lines + round_ratio_lines(result)


def choose_servers(plan: Plan, names: str | None) -> list[ServerSpec]:
    """The servers --servers names, started in that order (default: the plan's four, in its order)."""
    if names is None:
        return plan.servers()
    known = {s.label: s for s in [*plan.servers(), plan.control()]}
    unknown = [n for n in names.split(",") if n not in known]
    if unknown:
        raise SystemExit(f"serving: unknown server {', '.join(unknown)}; choose from {', '.join(known)}")
    return [known[n] for n in names.split(",")]


def concurrency_levels(text: str) -> tuple[int, ...]:
    """--levels: whole numbers, comma-separated ("16,32")."""
    return tuple(int(v) for v in text.split(","))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="the tiny CPU version (also chosen without a GPU)")
    p.add_argument("--cpu", action="store_true", help="the embedded model on this CPU (the README's table)")
    p.add_argument("--servers", default=None,
                   help="these of plain, auto, one-at-a-time, k4 and plain-b (a second plain server: the A/A "
                        "control), comma-separated, started in that order (default: the first four)")
    p.add_argument("--levels", default=None, type=concurrency_levels,
                   help="only these of the plan's concurrency levels, comma-separated (default: all)")
    p.add_argument("--out", default="results/gpu-serving", help="where the results go (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=1,
                   help="with more than 1: every server up at once, each level run on each in turn this many "
                        "times (order reversed every other round); the tables show each server's median round "
                        "(the lower middle one: at 2 rounds its slower), the summary each round's ratio to "
                        "plain (default: %(default)s: one server after another)")
    p.add_argument("--deadline-s", type=float, default=540.0,
                   help="stop measuring after this many seconds and report what was measured "
                        "(default: %(default)s, under the device's 600 s a command)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    return args


def on_signal(signum, frame):
    raise Deadline(signal.Signals(signum).name)  # through the finally clauses: the servers are stopped


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    gpu = torch.cuda.is_available() and not (args.smoke or args.cpu)
    if not gpu and not (args.smoke or args.cpu):
        print("serving: no GPU here; running the CPU smoke version", flush=True)
    if args.cpu:
        plan, device = CPU, f"CPU, {os.cpu_count()} cores"
    else:
        plan, device = (GPU, torch.cuda.get_device_name()) if gpu else (SMOKE, "CPU smoke run")
    if args.levels:
        plan = plan.only(args.levels)
    chosen = choose_servers(plan, args.servers)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for signum in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    signal.alarm(max(1, int(args.deadline_s)))
    entries: dict = {}
    measured: dict = {}  # --rounds > 1: label -> {"flags", "levels": {level: [run of each round]}}
    with tempfile.TemporaryDirectory() as work, (out / "servers.log").open("w") as log:
        try:
            if args.rounds > 1:
                run_interleaved(plan, chosen, args.rounds, log, Path(work), measured)
            else:
                for spec in chosen:
                    run_server(plan, spec, log, Path(work), entries)
        except Deadline as why:
            print(f"serving: stopped ({why}: SIGALRM is the {args.deadline_s:.0f} s deadline); "
                  "reporting what was measured", flush=True)
        finally:
            signal.alarm(0)
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_IGN)  # the report and the last stops run to the end
            for server in STARTED:
                server.stop()
    if measured:
        entries = merge_rounds(measured)
    return report(plan, entries, device, out, len(chosen))


def report(plan: Plan, entries: dict, device: str, out: Path, expected: int) -> int:
    from specdec.bench.serve import report as serve_report, scoreboard_rows

    if not entries:
        print("serving: nothing was measured (see servers.log)")
        return 1
    result = gather(plan, entries, device)
    path = serve_report(result, str(out))
    scoreboard_rows(result, out / "scoreboard-rows.md")
    lines = summary_lines(result)
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print(f"\nsaved {path}, {result.get('plot')}, {out / 'scoreboard-rows.md'}, {out / 'summary.txt'}, "
          f"{out / 'servers.log'}")
    print(f"{plan.target}, {plan.draft}, K {plan.k}, {device}; max_tokens {plan.max_tokens}, greedy, ignore_eos; "
          f"n per level {dict(zip(plan.levels, plan.n_per_level))}")
    print("\n".join(lines))
    return 0 if len(entries) == expected else 1


if __name__ == "__main__":
    sys.exit(main())
