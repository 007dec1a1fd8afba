"""`specdec serve`: the OpenAI-compatible server with the live web view at `/`."""

from __future__ import annotations

import argparse
import os

from specdec.commands import add_k_flag, add_model_flags, positive_int

EXTRA_DRAFTERS = ("none", "lookup")  # cheap to keep loaded; the web view compares against them


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve an OpenAI-compatible API (and a web view) with speculative decoding",
                       description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics "
                                   "and a web view at / . Up to --max-num-seqs sequences decode together in "
                                   "one batched engine; more wait in a bounded queue.")
    add_model_flags(p)
    add_k_flag(p, note=" (under --speculation auto the most; under request, unless a request sets `k`)")
    p.add_argument("--speculation", default="auto", metavar="auto|K|request",
                   help="auto: 0..K (the -k above) drafts per sequence per step, whatever makes the batch "
                        "fastest (it times the target at start-up); K: that many for every sequence; under "
                        "either a request's `k` is not used; request: each request's `k`, else -k "
                        "(default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY"),
                   help="require `Authorization: Bearer KEY` on /v1/* (default: $SPECDEC_API_KEY, else none)")
    p.add_argument("--max-num-seqs", type=positive_int, default=8,
                   help="sequences that decode together (the target's KV cache slots); a request with n > 1 "
                        "brings n (default: %(default)s)")
    p.add_argument("--max-queue", type=int, default=16,
                   help="sequences that may wait for a slot; beyond that a request gets 503 (default: %(default)s)")
    p.add_argument("--max-model-len", type=positive_int, default=None,
                   help="positions per slot, prompt + answer (default: the target's context, at most 4096)")
    p.add_argument("--prefill-chunk", type=positive_int, default=256,
                   help="most prompt tokens one sequence runs in one engine step, so a long prompt holds "
                        "the others up little (default: %(default)s)")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: the target's name)")
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="on SIGTERM, seconds to finish requests in flight; then they get an error "
                        "(default: %(default)s)")
    add_limit_flags(p)
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    from specdec.server.limits import Limits

    d = Limits()
    p.add_argument("--max-body-bytes", type=positive_int, default=d.max_body_bytes,
                   help="largest request body; larger gets 413 (default: %(default)s)")
    p.add_argument("--timeout-keep-alive", type=float, default=d.keep_alive_s,
                   help="seconds an idle connection stays open, new or between requests (default: %(default)s)")
    p.add_argument("--timeout-headers", type=float, default=d.header_timeout_s,
                   help="seconds from a request's first byte to the end of its headers, else the connection "
                        "closes (default: %(default)s)")
    p.add_argument("--timeout-body", type=float, default=d.body_timeout_s,
                   help="seconds to receive a request's body, else 408 (default: %(default)s)")


def build_state(args: argparse.Namespace):
    from specdec.drafters import make_drafter
    from specdec.errors import InvalidRequestError
    from specdec.runtime import build_runtime
    from specdec.server.app import ServerConfig, ServerState
    from specdec.server.limits import Limits
    from specdec.engine.controller import speculation_from_flag

    speculation = speculation_from_flag(args.speculation, args.k)
    if args.max_queue < 0:
        raise InvalidRequestError(f"--max-queue must be >= 0, got {args.max_queue}")
    if not args.graceful_timeout >= 0:
        raise InvalidRequestError(f"--graceful-timeout must be >= 0 seconds, got {args.graceful_timeout}")
    for flag in ("timeout_keep_alive", "timeout_headers", "timeout_body"):
        if not getattr(args, flag) > 0:
            raise InvalidRequestError(f"--{flag.replace('_', '-')} must be > 0 seconds, got {getattr(args, flag)}")
    limits = Limits(args.max_body_bytes, args.timeout_keep_alive, args.timeout_headers, args.timeout_body)
    runtime = build_runtime(args.target, args.draft, device=args.device, dtype=args.dtype,
                            backend=getattr(args, "backend", "auto"), threads=getattr(args, "threads", None))
    extra = {name: make_drafter(name, runtime.target) for name in EXTRA_DRAFTERS if name != args.draft}
    config = ServerConfig(model_name=args.served_model_name or runtime.target.name, default_draft=args.draft,
                          k=args.k, api_key=args.api_key or None, max_queue=args.max_queue, limits=limits,
                          max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                          prefill_chunk=args.prefill_chunk, speculation=speculation)
    return ServerState(config, runtime, extra)


def _speculation_line(state) -> str:
    controller = state.engine.controller
    return {"request": f"K={state.config.k} unless a request sets k", "fixed": f"K={controller.k} for every sequence",
            "auto": f"K auto, caps {'/'.join(map(str, getattr(controller, 'arms', ())))}"}[controller.name]


def run(args: argparse.Namespace) -> int:
    from specdec.server.app import create_app
    from specdec.server.drain import make_server

    state = build_state(args)
    threads = state.runtime.threads
    slots = state.slots
    cache = f"KV cache {state.kv_cache_bytes / 2**20:.0f} MiB" if state.kv_cache_bytes else "a KV cache per slot"
    print(f"specdec: serving {state.config.model_name!r} (draft {args.draft}, {_speculation_line(state)}, {threads.describe()}) "
          f"at http://{args.host}:{args.port}/ ; API at /v1", flush=True)
    print(f"specdec: {type(slots).__name__}: {slots.max_slots} sequences x {slots.max_length} positions, {cache}; "
          f"up to {args.max_queue} more wait", flush=True)
    make_server(create_app(state), state.worker, args.host, args.port, args.log_level, state.config.limits,
                args.graceful_timeout).run()
    return 0  # also after SIGTERM: the drain answered every request
