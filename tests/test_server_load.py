"""Disconnects and bursts: the server stays healthy, the queue is bounded, answers never get mixed up."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from tests.server_tiny_model import shared_server

MAX_QUEUE = 2
MAX_NUM_SEQS = 2


@pytest.fixture(scope="module")
def server():
    return shared_server("--max-queue", str(MAX_QUEUE), "--max-num-seqs", str(MAX_NUM_SEQS))


def gauge(metrics_text: str, name: str) -> float:
    match = re.search(rf"^specdec:{name}\{{[^}}]*\}} (\S+)$", metrics_text, re.M)
    return float(match.group(1)) if match else 0.0


def wait_idle(url: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics").text
        if gauge(text, "num_requests_running") == 0 and gauge(text, "num_requests_waiting") == 0:
            return text
        time.sleep(0.2)
    raise AssertionError("the server did not go idle")


def test_clients_that_disconnect_mid_stream_leave_the_server_idle(server):
    async def leave_early(http: httpx.AsyncClient, i: int) -> int:
        body = {"prompt": f"the cat runs {i}", "max_tokens": 150, "ignore_eos": True, "stream": True,
                "temperature": 0}
        async with http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return r.status_code  # a 503 from the bounded queue is fine here
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    break  # hang up after the first token
        return 200

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            for _ in range(3):  # waves, so that some disconnect while running and some while waiting
                statuses = await asyncio.gather(*(leave_early(http, i) for i in range(5)))
                assert set(statuses) <= {200, 503}

    asyncio.run(main())
    text = wait_idle(server.url)
    assert 'finished_reason="abort"' in text  # generations were cut short, not run to the end
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    after = httpx.post(server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 5, "temperature": 0,
                                                           "ignore_eos": True}, timeout=30)
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 5


def test_burst_beyond_the_queue_gets_503_and_no_mixed_up_answers(server):
    prompts = [f"{a} {b} is fast" for a in ("one", "two", "three") for b in ("cat", "dog", "model")]

    def body(prompt):
        return {"prompt": prompt, "max_tokens": 40, "ignore_eos": True, "temperature": 0}

    with httpx.Client(base_url=server.url, timeout=60) as http:  # one at a time: the expected answers
        expected = {p: http.post("/v1/completions", json=body(p)).json()["choices"][0]["text"] for p in prompts}

    async def burst():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            return await asyncio.gather(*(http.post("/v1/completions", json=body(p)) for p in prompts))

    responses = asyncio.run(burst())
    served = [(p, r) for p, r in zip(prompts, responses) if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert len(served) >= MAX_NUM_SEQS + MAX_QUEUE and refused, [r.status_code for r in responses]
    for prompt, r in served:
        assert r.json()["choices"][0]["text"] == expected[prompt]
    for r in refused:
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
    wait_idle(server.url)


def test_shutdown_finishes_the_stream_in_flight_and_refuses_new_work():
    """What SIGTERM does (uvicorn's handler sets should_exit, then the drain runs): the running stream
    still ends with every token and [DONE]."""
    import socket
    import threading

    from specdec.runtime import build_runtime
    from specdec.server.app import ServerConfig, ServerState, create_app
    from specdec.server.drain import make_server
    from tests.server_tiny_model import build_tiny_models, tiny_root, torch_threads

    target, _ = build_tiny_models(tiny_root())
    state = ServerState(ServerConfig("tiny", "none", 1), build_runtime(str(target), "none"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = make_server(create_app(state), state.worker, "127.0.0.1", port, "warning", state.config.limits,
                         grace_s=30)
    thread = threading.Thread(target=server.run, daemon=True)
    with torch_threads(1):
        thread.start()
        while not server.started:
            time.sleep(0.05)
        body = {"prompt": "hello", "max_tokens": 120, "ignore_eos": True, "stream": True, "temperature": 1}
        lines = []
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line and not lines:
                    server.should_exit = True  # as on SIGTERM
                lines += [line] if line else []
        thread.join(timeout=30)
    assert lines[-1] == "data: [DONE]" and len(lines) > 100  # every token arrived, then the end marker
    assert not thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
