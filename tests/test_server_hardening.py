"""A hostile client's tries against `specdec serve`: huge or slow bodies, idle and slow connections,
coerced types, out-of-range seeds, clients that leave while queued, and SIGTERM in the middle of work.

Two tiny-model servers: the shared one (defaults), and one with short timeouts that the last test
stops with SIGTERM. Every loop is bounded; all traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import threading
import time

import httpx
import pytest

from tests.server_tiny_model import ServerProcess, build_tiny_models, shared_server, tiny_root

COMP = "/v1/completions"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hello"}]
SIXTEEN_MB = 16 * 1024 * 1024
GRACE = 2  # --graceful-timeout of the short-timeout server
# Streams in the SIGTERM test: 31 x 150 tokens, one at a time, take many times GRACE even on a fast
# CI runner (7 once finished inside the drain there).
STREAMS = 31


@pytest.fixture(scope="module")
def server():
    return shared_server("--max-queue", "2", "--max-num-seqs", "1")  # one slot: a second request waits


@pytest.fixture(scope="module")
def short_server():
    """Timeouts of 1 s; the SIGTERM test (the last in this file) ends it."""
    target, draft = build_tiny_models(tiny_root())
    args = ["--target", str(target), "--draft", str(draft), "-k", "4", "--served-model-name", "tiny",
            "--max-queue", "40", "--max-num-seqs", "1", "--graceful-timeout", str(GRACE), "--timeout-keep-alive", "1",
            "--timeout-headers", "1", "--timeout-body", "1"]
    proc = ServerProcess(args, tiny_root() / "server-short-timeouts.log").wait_ready()
    yield proc
    proc.stop()


def raw_exchange(url: str, head: bytes, wait: float = 20.0) -> bytes:
    """Send `head` on a fresh connection, then read until the server closes it (or `wait` passes)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):  # socket.timeout past `wait`: the server kept the connection
            data += chunk
        return data


def parse_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def assert_error(status: int, body: bytes | dict, expected: int, param: str | None = None) -> dict:
    assert status == expected, body
    error = (json.loads(body) if isinstance(body, bytes) else body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert error["type"] == ("service_unavailable_error" if expected == 503 else "invalid_request_error")
    return error


# ---- sizes: a huge body is refused unread, and nothing it does delays /health --------------------


def test_a_16_mb_body_is_refused_with_413_before_it_is_read(server):
    head = (f"POST {COMP} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {SIXTEEN_MB}\r\n\r\n").encode()
    status, headers, body = parse_response(raw_exchange(server.url, head))  # not one body byte sent
    error = assert_error(status, body, 413)
    assert error["code"] == "request_too_large" and "--max-body-bytes" in error["message"]
    assert headers["connection"] == "close"


def test_health_answers_while_huge_prompts_arrive(server):
    """A 16 MB prompt (over the body limit) and a 1.5 MB one (under it, but far past the context) go
    in beside /health: each health check answers, and the 1.5 MB prompt is refused by its length."""
    results: dict[str, object] = {}

    def send(name: str, chars: int) -> None:
        body = {"prompt": "the cat " * (chars // 8), "max_tokens": 1}
        try:
            results[name] = httpx.post(server.url + COMP, json=body, timeout=120)
        except httpx.HTTPError as exc:  # the server may close a 16 MB upload it has refused
            results[name] = exc

    senders = [threading.Thread(target=send, args=(n, c)) for n, c in (("huge", SIXTEEN_MB), ("big", 1_500_000))]
    for t in senders:
        t.start()
    checks = 0
    try:
        while any(t.is_alive() for t in senders) and checks < 100:
            r = httpx.get(server.url + "/health", timeout=10)  # generous: on a blocked loop this waits 30 s+
            assert r.status_code == 200
            checks += 1
            time.sleep(0.05)
    finally:
        for t in senders:
            t.join(timeout=120)
    assert checks >= 1
    big = results["big"]
    assert isinstance(big, httpx.Response), big
    error = assert_error(big.status_code, big.json(), 400, "prompt")
    assert error["code"] == "context_length_exceeded" and "characters" in error["message"]  # refused untokenized
    huge = results["huge"]
    assert not isinstance(huge, httpx.Response) or huge.status_code == 413


class PidTokenizer:
    """Tokenizes any text as [the id of the process it runs in]."""

    all_special_tokens = ()

    def __call__(self, text: str, **_) -> dict:
        return {"input_ids": [os.getpid()]}


def test_a_body_is_read_and_tokenized_in_another_process():
    """Parsing, validating and tokenizing hold the GIL; in a process of their own they stall neither
    the event loop (and /health) nor the engine thread."""
    from specdec.server.prep import Preparer, PrepSettings

    async def main() -> list[int]:
        preparer = Preparer(PrepSettings(PidTokenizer(), "m", 100, None, 100))
        try:
            return (await preparer(b'{"prompt": "hello"}', chat=False)).prompt_ids
        finally:
            preparer.close()

    ids = asyncio.run(main())
    assert len(ids) == 1 and ids[0] != os.getpid()


def test_a_worker_process_that_dies_is_replaced():
    """One request gets a 503 to retry; the next is read by a new worker process."""
    from specdec.server.prep import Preparer, PrepSettings
    from specdec.server.protocol import APIError

    async def main() -> tuple[int, int, APIError]:
        preparer = Preparer(PrepSettings(PidTokenizer(), "m", 100, None, 100))
        body = b'{"prompt": "hello"}'
        try:
            first = (await preparer(body, chat=False)).prompt_ids[0]
            os.kill(first, signal.SIGKILL)
            with pytest.raises(APIError) as refused:
                await preparer(body, chat=False)
            return first, (await preparer(body, chat=False)).prompt_ids[0], refused.value
        finally:
            preparer.close()

    first, second, refused = asyncio.run(main())
    assert (refused.status, refused.code) == (503, "worker_restarted") and second not in (first, os.getpid())


def run_body_limit(messages: list[dict], max_bytes: int) -> tuple[list[dict], list[dict], list[int]]:
    """BodyLimit around an app that records what it receives; returns (app saw, sent, refusals)."""
    from specdec.server.connection import BodyLimit

    seen, sent, refused = [], [], []
    incoming = iter(messages + [{"type": "http.disconnect"}])

    async def app(scope, receive, send):
        seen.append(await receive())
        seen.append(await receive())

    async def receive():
        return next(incoming)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": COMP, "headers": []}  # chunked: no content-length
    asyncio.run(BodyLimit(app, max_bytes, 5.0, refused.append)(scope, receive, send))
    return seen, sent, refused


def test_a_chunked_body_past_the_limit_is_refused_as_it_arrives():
    parts = [{"type": "http.request", "body": b"x" * 600, "more_body": True} for _ in range(3)]
    seen, sent, refused = run_body_limit(parts, max_bytes=1000)
    assert not seen and refused == [413] and sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_too_large"


def test_a_chunked_body_within_the_limit_reaches_the_app_whole():
    parts = [{"type": "http.request", "body": b"ab", "more_body": True},
             {"type": "http.request", "body": b"cd", "more_body": False}]
    seen, sent, refused = run_body_limit(parts, max_bytes=4)
    assert seen == [{"type": "http.request", "body": b"abcd", "more_body": False}, {"type": "http.disconnect"}]
    assert not sent and not refused


# ---- a prompt near the context is prefilled in chunks, beside the others -------------------------

PREFILL_CHUNK = 4


def test_a_prompt_near_the_context_is_prefilled_in_chunks_beside_a_running_stream():
    """A 150-token prompt (the context is 160) arrives while a stream decodes one token a step (draft
    none): with --prefill-chunk 4 its prefill takes 38 engine steps, and the stream is in every one
    of them (an engine step runs all its sequences), instead of one long step that holds it up."""
    server = shared_server("--max-num-seqs", "2", "--prefill-chunk", str(PREFILL_CHUNK))
    long_prompt = list(range(10, 20)) * 15  # token ids: 150 tokens, 149 of them prefilled
    running = {"prompt": "hello", "max_tokens": 150, "ignore_eos": True, "stream": True, "draft": "none"}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        before = http.get("/metrics").text
        with http.stream("POST", COMP, json=running) as stream:
            lines = stream.iter_lines()
            next(line for line in lines if line.startswith("data: {"))  # it decodes
            long = http.post(COMP, json={"prompt": long_prompt, "max_tokens": 1, "draft": "none"})
            after = http.get("/metrics").text
            rest = [line for line in lines if line]
        assert long.status_code == 200, long.text
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"
    steps = counter(after, "engine_steps_total") - counter(before, "engine_steps_total")
    pairs = counter(after, "engine_step_sequences_total") - counter(before, "engine_step_sequences_total")
    assert pairs - steps >= -(-149 // PREFILL_CHUNK)  # steps that ran both: every chunk of the long prefill


# ---- types and values: strict, finite, valid Unicode, 64-bit seeds --------------------------------

STRICT_CASES = [  # (name, path, raw JSON body, param, words the message must hold)
    ("max_tokens a string", COMP, '{"prompt": "hello", "max_tokens": "8"}', "max_tokens", "integer"),
    ("max_tokens a boolean", COMP, '{"prompt": "hello", "max_tokens": true}', "max_tokens", "integer"),
    ("max_tokens a float", CHAT, '{"messages": %s, "max_tokens": 8.0}' % json.dumps(MSG), "max_tokens", "integer"),
    ("stream a string", COMP, '{"prompt": "hello", "max_tokens": 2, "stream": "yes"}', "stream", "boolean"),
    ("stream a number", CHAT, '{"messages": %s, "max_tokens": 2, "stream": 1}' % json.dumps(MSG), "stream",
     "boolean"),
    ("include_usage a string", COMP, '{"prompt": "hello", "stream": true, "stream_options": {"include_usage": "y"}}',
     "stream_options", "boolean"),
    ("k a string", COMP, '{"prompt": "hello", "k": "4"}', "k", "integer"),
    ("temperature NaN", COMP, '{"prompt": "hello", "temperature": NaN}', "temperature", "finite"),
    ("temperature Infinity", CHAT, '{"messages": %s, "temperature": Infinity}' % json.dumps(MSG), "temperature",
     "finite"),
    ("top_p -Infinity", COMP, '{"prompt": "hello", "top_p": -Infinity}', "top_p", "finite"),
    ("lone surrogate in a prompt", COMP, '{"prompt": "hel\\ud800lo"}', "prompt", "lone surrogate"),
    ("lone surrogate in a message", CHAT, '{"messages": [{"role": "user", "content": "hi \\udc00"}]}', "messages",
     "lone surrogate"),
    ("lone surrogate in a stop string", COMP, '{"prompt": "hello", "stop": ["\\ud83d"]}', "stop", "lone surrogate"),
    ("seed 2**64", COMP, '{"prompt": "hello", "seed": %d}' % 2**64, "seed", "2**64 - 1"),
    ("seed below -2**63", COMP, '{"prompt": "hello", "seed": %d}' % (-(2**63) - 1), "seed", "-2**63"),
]


@pytest.mark.parametrize("name,path,raw,param,words", STRICT_CASES, ids=[c[0] for c in STRICT_CASES])
def test_wrong_types_and_values_get_a_400_that_says_what_was_wrong(server, name, path, raw, param, words):
    r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=30)
    error = assert_error(r.status_code, r.content, 400, param)
    assert words in error["message"] and error["message"].startswith(param)


@pytest.mark.parametrize("seed", [2**64 - 1, 2**63, -1, -(2**63)])
def test_every_64_bit_seed_is_served(server, seed):
    body = {"prompt": "hello", "max_tokens": 3, "seed": seed, "temperature": 1}
    assert httpx.post(server.url + COMP, json=body, timeout=30).status_code == 200


def test_a_surrogate_pair_is_valid_unicode(server):
    raw = '{"prompt": "hello \\ud83d\\ude00", "max_tokens": 2}'  # one emoji, escaped as JSON does
    r = httpx.post(server.url + COMP, content=raw, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("method,path,allowed", [("GET", COMP, "POST"), ("PUT", "/health", "GET, HEAD"),
                                                 ("DELETE", CHAT, "POST")])
def test_a_wrong_method_is_405_with_allow(server, method, path, allowed):
    r = httpx.request(method, server.url + path, timeout=30)
    assert_error(r.status_code, r.content, 405)
    assert set(r.headers["allow"].split(", ")) == set(allowed.split(", "))  # a set: any order
    assert r.json()["error"]["code"] == "method_not_allowed"


# ---- clients that leave while queued are counted --------------------------------------------------


def counter(metrics_text: str, name: str) -> float:
    match = re.search(rf"^specdec:{name}\{{[^}}]*\}} (\S+)$", metrics_text, re.M)
    return float(match.group(1)) if match else float("nan")


def test_a_client_that_leaves_while_queued_is_counted(server):
    """One slot: a second request waits behind a running one, and its client leaves while it waits.
    The server must see that client go before the running request ends (the tiny model's 150 tokens
    take about half a second); on a loaded machine it once did not, the waiting request ran, and it
    left while running, which is no abandonment. So the scenario runs up to three times, and one
    attempt must count exactly one abandonment; a server that never counts one fails them all."""
    assert counter(httpx.get(server.url + "/metrics").text, "request_abandoned_total") >= 0, \
        "no specdec:request_abandoned_total in /metrics"
    for _ in range(3):
        counted = _abandonments_of_one_leaving_client(server)
        if counted:
            break
    assert counted == 1.0


def _abandonments_of_one_leaving_client(server) -> float:
    """The abandonments counted while one client leaves its request waiting behind a running one."""
    long_body = {"prompt": "hello", "max_tokens": 150, "ignore_eos": True, "stream": True, "k": 64}
    before = counter(httpx.get(server.url + "/metrics").text, "request_abandoned_total")

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            async with http.stream("POST", COMP, json=long_body) as running:
                assert running.status_code == 200
                lines = running.aiter_lines()
                async for line in lines:
                    if line.startswith("data: {"):
                        break  # it runs: 149 tokens to go
                async with http.stream("POST", COMP, json=long_body) as queued:
                    assert queued.status_code == 200  # admitted: it waits behind the running one
                # ... and its client has left, still waiting. The running stream is read to its end:
                # were it closed now too, its slot could free and admit the queued one before the
                # server saw that client go (then it left while running, not while queued).
                async for _ in lines:
                    pass

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while True:
        counted = counter(httpx.get(server.url + "/metrics").text, "request_abandoned_total") - before
        if counted or time.monotonic() > deadline:
            return counted
        time.sleep(0.2)


def test_a_stream_whose_client_leaves_before_its_first_byte_lets_its_job_go():
    """The disconnect arrives while the response's headers are being sent: the body's generator
    never starts (so its own cleanup never runs), yet the job must still leave the queue."""
    from specdec.server.app import _JobStream

    left, cleaned = [], []

    async def body():
        try:
            yield "data: never\n\n"
        finally:
            cleaned.append(True)

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        await asyncio.sleep(0.01)  # the headers take a moment to go out

    scope = {"type": "http", "asgi": {"spec_version": "2.3"}}
    asyncio.run(_JobStream(body(), lambda: left.append(True))(scope, receive, send))
    assert not cleaned  # what a plain StreamingResponse relied on never ran ...
    assert left == [True]  # ... and the job was let go all the same


# ---- timeouts: idle, slow headers, slow body ------------------------------------------------------


def test_an_idle_connection_is_closed(short_server):
    assert raw_exchange(short_server.url, b"") == b""  # closed by the server, with nothing sent


def test_headers_that_trickle_in_are_cut_off(short_server):
    host, port = short_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        closed = False
        for i in range(100):  # one header byte every 0.1 s: 10 s of headers, against a 1 s limit
            try:
                s.sendall(b"x-slow: ab\r\n"[i % 12: i % 12 + 1])
            except OSError:
                closed = True
                break
            time.sleep(0.1)
        s.settimeout(1)
        try:
            closed = closed or s.recv(1) == b""
        except ConnectionResetError:
            closed = True
    assert closed


def test_a_body_that_trickles_in_gets_408(short_server):
    head = (f"POST {COMP} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: 100\r\n\r\n").encode()
    status, headers, body = parse_response(raw_exchange(short_server.url, head + b'{"prompt": '))
    assert assert_error(status, body, 408)["code"] == "request_timeout"


# ---- SIGTERM: a real drain (keep this test last: it stops short_server) ---------------------------


def admitted(url: str) -> int:
    """Requests the server has taken: those in the system and those finished. The finished are read
    first, so that one finishing between the two reads is missed (an undercount) rather than counted twice."""
    text = httpx.get(url + "/metrics", timeout=10).text
    done = sum(float(v) for v in re.findall(r'^specdec:request_success_total\{[^}]*\} (\S+)$', text, re.M))
    return int(done) + httpx.get(url + "/health", timeout=10).json()["in_flight"]


def test_sigterm_drains_then_exits_0(short_server):
    """Work for far longer than --graceful-timeout on a one-at-a-time engine, then SIGTERM: /health and new
    requests get 503 during the drain, every stream ends with a finish or an error event and then
    [DONE], the non-streamed request (queued last) gets a JSON 503, and the process exits 0 without a
    traceback."""
    url = short_server.url
    body = {"prompt": "hello", "max_tokens": 150, "ignore_eos": True, "k": 64}
    http = httpx.Client(base_url=url, timeout=60)
    streams = [http.send(http.build_request("POST", COMP, json={**body, "stream": True}), stream=True)]
    lines = [streams[0].iter_lines()]
    first = next(line for line in lines[0] if line.startswith("data: {"))  # it runs
    for _ in range(STREAMS - 1):
        streams.append(http.send(http.build_request("POST", COMP, json={**body, "stream": True}), stream=True))
        assert streams[-1].status_code == 200
        lines.append(streams[-1].iter_lines())
    plain: dict[str, httpx.Response] = {}
    plain_thread = threading.Thread(target=lambda: plain.setdefault(
        "r", httpx.post(url + CHAT, json={**body, "messages": MSG}, timeout=60)))
    plain_thread.start()
    for _ in range(400):  # the non-streamed request queues last, behind all the streams
        if admitted(url) >= STREAMS + 1:  # it is in (streams may have finished meanwhile: they count)
            break
        time.sleep(0.05)
    short_server.proc.send_signal(signal.SIGTERM)

    health = None
    for _ in range(50):
        health = httpx.get(url + "/health", timeout=10)
        if health.status_code == 503:
            break
        time.sleep(0.05)
    assert health.status_code == 503
    late = httpx.post(url + COMP, json={"prompt": "hello", "max_tokens": 2}, timeout=10)
    assert assert_error(late.status_code, late.content, 503)["code"] == "shutting_down"

    endings = []
    for i, stream_lines in enumerate(lines):
        got = ([first] if i == 0 else []) + [line for line in stream_lines if line]
        assert got[-1] == "data: [DONE]", got[-3:]
        last = json.loads(got[-2].removeprefix("data: "))
        if "error" in last:
            assert assert_error(503, last, 503)["code"] == "shutting_down"
            endings.append("cut")
        else:
            assert last["choices"][0]["finish_reason"] == "length"
            endings.append("finished")
    assert "cut" in endings  # 31 x 150 tokens at K=64, one at a time, outlast a 2 s drain
    plain_thread.join(timeout=60)
    r = plain["r"]  # last in line, so cut as well: a JSON error, not a bare 500
    assert assert_error(r.status_code, r.content, 503)["code"] == "shutting_down"
    http.close()
    assert short_server.proc.wait(timeout=60) == 0
    log = short_server.log_path.read_text()
    assert "Traceback" not in log and "CancelledError" not in log and "Cancel" not in log, log
