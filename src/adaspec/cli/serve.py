"""``adaspec serve``: the options of the OpenAI-compatible server (:mod:`adaspec.server.main` runs it)."""

from __future__ import annotations

import argparse

from adaspec.cli.options import add_catch_up_arg, add_model_args, add_strict_arg
from adaspec.server.main import serve


def add_serve_parser(sub) -> None:
    srv = sub.add_parser("serve", help="OpenAI-compatible HTTP server with speculative-decoding metrics")
    add_model_args(srv)
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, loopback only)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--api-key", action="append", default=None, metavar="KEY",
                     help="require 'Authorization: Bearer KEY' on every route but /health; repeat for several keys "
                          "(or $ADASPEC_API_KEY, keys separated by commas). Each key has its own suffix cache")
    srv.add_argument("--suffix-share", action="store_true",
                     help="let every API key's requests draft from one shared suffix cache (default: one partition "
                          "per key, so no request drafts from text another key's requests wrote)")
    srv.add_argument("--suffix-cache-tokens", type=int, default=None, metavar="TOKENS",
                     help="size of the suffix cache over all keys (default: the --draft suffix spec's tokens, else "
                          "100000; about 0.5 kB per token, docs/guide/suffix.md)")
    srv.add_argument("--no-prefix-cache", action="store_true",
                     help="prefill every prompt whole (default with --max-batch 1: keep the target's cache between "
                          "requests and prefill only what a prompt does not share with the sequence before it, from "
                          "the same API key; strict-mode requests prefill cold)")
    srv.add_argument("--prefix-cache-mib", type=int, default=None, metavar="MIB",
                     help="with the prefix cache: host memory for copies of earlier requests' caches, so that "
                          "interleaved sessions each reuse their own prefix, least recently used evicted first (as "
                          "llama-server's --cache-ram; default: 1024; 0: the request before only)")
    srv.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                     help="model name(s) clients use, the first one reported (default: --target as given; the "
                          "runtime-qualified name, e.g. NAME@llamacpp, is always accepted too)")
    srv.add_argument("--allowed-hosts", default=None, metavar="H1,H2",
                     help="host names accepted in the Host/Origin headers (DNS-rebinding protection; default for a "
                          "loopback bind: localhost,127.0.0.1,::1 and --host; '*': no check, the default otherwise)")
    srv.add_argument("--max-slots-per-request", type=int, default=None, metavar="N",
                     help="running slots one request's n choices may hold at once (default: half of --max-batch)")
    srv.add_argument("--max-queue-per-client", type=int, default=None, metavar="N",
                     help="queue places one client address may hold (default: the whole --max-queue); a freed slot "
                          "always goes to the waiting client holding the fewest slots")
    srv.add_argument("--prefill-chunk", type=int, default=None, metavar="TOKENS",
                     help="with --max-batch > 1: prompt tokens prefilled per batch step while other requests decode "
                          "(default: 64; 0: whole prompts)")
    srv.add_argument("--prefill-step-ms", type=float, default=None, metavar="MS",
                     help="with --max-batch > 1: size each step's prefill chunk (at most --prefill-chunk) and draft "
                          "catch-up from the measured cost per token, so that a step carrying them while other "
                          "requests decode takes about this long (default: 750; 0: fixed chunks)")
    srv.add_argument("--max-scored-tokens", type=int, default=4096, metavar="TOKENS",
                     help="prompt tokens echo + logprobs may score per request (413 beyond)")
    srv.add_argument("--max-scored-logits-mb", type=int, default=256, metavar="MIB",
                     help="MiB of float32 logits a scored prefill holds at once (per request and batch step)")
    srv.add_argument("--allow-drafter", action="append", default=[], metavar="MODEL",
                     help="another draft model clients may pick per request (loaded at start; repeatable)")
    srv.add_argument("--max-batch", type=int, default=1,
                     help="requests decoding together (continuous batching; each row speculates on its own)")
    srv.add_argument("--max-queue", type=int, default=32, help="requests that may wait; more get 503")
    srv.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request, queue included")
    srv.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413")
    srv.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens when a request gives none")
    srv.add_argument("--max-tokens-limit", type=int, default=None, help="largest max_tokens accepted")
    srv.add_argument("--metrics-namespace", default="adaspec", help="metric name prefix ('vllm' for vLLM dashboards)")
    srv.add_argument("--no-warmup", action="store_true", help="skip the warm-up generation at start")
    add_strict_arg(srv)
    add_catch_up_arg(srv)
    srv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    srv.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    return serve(args)
