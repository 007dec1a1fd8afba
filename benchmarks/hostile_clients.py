"""Hostile clients against `specdec serve`: does a normal request, and /health, keep their times?

Starts `specdec serve` on the embedded model (--threads 1) on 127.0.0.1, times a normal request
(a greedy completion of --max-tokens tokens, ignore_eos) alone, then under each attack of issue 58,
while a probe times /health and /metrics every 50 ms:

- stops-huge: 2 clients looping on 20,000 stop strings of 95 characters (1.98 MB; refused: 16 at most)
- stops-max / stops-none: 2 clients generating --max-tokens tokens with 16 stop strings of 256
  characters (the most the server takes), and the same 2 without stops (the control: the cost of
  sharing the batch, which no stop check should add to)
- chat-63k: 4 clients looping on 63,000 empty chat messages (2.08 MB)
- ids-1m: 8 clients looping on prompts of 1,000,000 token ids (2 MB each)

Attackers run in a process of their own at the lowest CPU priority (they stand for remote clients:
their client-side work must not slow the probe or the server). Prints a
table; saves results/hostile-clients-<time>.json (the server's log goes to the temp directory). Loopback only, bounded in time (--phase-s a phase).

    PYTHONPATH=src python benchmarks/hostile_clients.py [--max-tokens 48] [--runs 3] [--phase-s 40]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

PROMPT = "The history of the printing press begins"
ATTACKS = {  # name: (clients, the body each sends, its endpoint)
    "stops-huge": (2, lambda t: {"prompt": PROMPT, "max_tokens": t, "stop": [f"{i:05d}" + "x" * 90 for i in
                                                                            range(20000)]}, "/v1/completions"),
    "stops-max": (2, lambda t: {"prompt": PROMPT, "max_tokens": t, "ignore_eos": True, "temperature": 0,
                                "stop": [f"{i:02d}" + "q" * 254 for i in range(16)]}, "/v1/completions"),
    "stops-none": (2, lambda t: {"prompt": PROMPT, "max_tokens": t, "ignore_eos": True, "temperature": 0},
                   "/v1/completions"),
    "chat-63k": (4, lambda t: {"messages": [{"role": "user", "content": ""}] * 63000, "max_tokens": t},
                 "/v1/chat/completions"),
    "ids-1m": (8, lambda t: {"prompt": [1] * 1_000_000, "max_tokens": t}, "/v1/completions"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "--threads", "1", "--host", "127.0.0.1",
           "--port", str(port)]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; see its log")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit("the server did not start in time")


def normal_request(url: str, max_tokens: int) -> float:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    r.raise_for_status()
    return time.perf_counter() - start


class Probe(threading.Thread):
    """Times GET /health and GET /metrics every `every` seconds until stopped."""

    def __init__(self, url: str, every: float = 0.05):
        super().__init__(daemon=True)
        self.url, self.every, self.stop, self.ms = url, every, threading.Event(), {"health": [], "metrics": []}

    def run(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self.stop.is_set():
                for name in self.ms:
                    start = time.perf_counter()
                    http.get(f"{self.url}/{name}")
                    self.ms[name].append(1000 * (time.perf_counter() - start))
                time.sleep(self.every)


def attack(url: str, name: str, max_tokens: int, stop_at: float, out) -> None:
    """In a process of its own: the attack's clients loop until `stop_at`; out gets the status counts."""
    os.nice(19)  # remote clients in life: their own CPU work is not the server's to pay for
    clients, make, path = ATTACKS[name]
    body = json.dumps(make(max_tokens), separators=(",", ":")).encode()
    statuses: Counter = Counter()

    def loop() -> None:
        with httpx.Client(timeout=300) as http:
            while time.time() < stop_at:
                try:
                    statuses[http.post(url + path, content=body, headers={"content-type": "application/json"})
                             .status_code] += 1
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(dict(statuses))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def phase(url: str, name: str | None, args) -> dict:
    """The normal request's times (and the probe's) alone (name None) or under attack `name`."""
    probe, queue, attacker = Probe(url), multiprocessing.Queue(), None
    probe.start()
    if name is not None:
        attacker = multiprocessing.Process(target=attack, args=(url, name, args.max_tokens,
                                                                time.time() + args.phase_s, queue))
        attacker.start()
        time.sleep(2)  # the attack is under way
    times = [normal_request(url, args.max_tokens) for _ in range(args.runs)]
    statuses = {}
    if attacker is not None:
        statuses = queue.get(timeout=args.phase_s + 300)
        attacker.join()
    probe.stop.set()
    probe.join()
    row = {"phase": name or "alone", "normal_s": times, "normal_median_s": statistics.median(times)}
    for kind, ms in probe.ms.items():
        row[f"{kind}_ms"] = {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99), "max": max(ms), "n": len(ms)}
    row["attacker_statuses"] = statuses
    return row


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3, help="normal requests a phase (one after another)")
    parser.add_argument("--phase-s", type=float, default=40, help="seconds the attackers loop in a phase")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(tempfile.gettempdir()) / f"hostile-clients-{stamp}-server.log"  # an access line a request: large
    proc = start_server(port, log)
    try:
        wait_ready(url, proc)
        normal_request(url, args.max_tokens)  # warm
        rows = [phase(url, None, args)]
        rows += [phase(url, name, args) for name in args.attacks.split(",")]
    finally:
        proc.terminate()
        proc.wait(60)
    alone = rows[0]["normal_median_s"]
    print(f"{'phase':<11} {'normal s':>9} {'x alone':>8} {'health p50/p99/max ms':>22} {'metrics p99 ms':>15}  attackers got")
    for row in rows:
        h, m = row["health_ms"], row["metrics_ms"]
        print(f"{row['phase']:<11} {row['normal_median_s']:9.2f} {row['normal_median_s'] / alone:8.2f} "
              f"{h['p50']:7.1f}/{h['p99']:6.1f}/{h['max']:6.1f} {m['p99']:15.1f}  {row['attacker_statuses']}")
    result = {"cpu": cpu_model(), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
              "command": " ".join(sys.argv), "max_tokens": args.max_tokens, "runs": args.runs, "phases": rows}
    path = args.out / f"hostile-clients-{stamp}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"CPU: {result['cpu']}; saved {path}; the server's log: {log}")


if __name__ == "__main__":
    main()
