"""Entry point of ``adaspec serve`` (the argument parser lives in :mod:`adaspec.cli`)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from adaspec.errors import AdaspecError

API_KEY_ENV = "ADASPEC_API_KEY"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from adaspec.server.app import create_app
        from adaspec.server.auth import keys_from_cli
        from adaspec.server.hostcheck import parse_allowed_hosts
        from adaspec.server.host import ModelHost
        from adaspec.server.settings import (DEFAULT_PREFILL_CHUNK, DEFAULT_PREFILL_STEP_MS, DEFAULT_PREFIX_CACHE_MIB,
                                             ServerConfig)
    except ImportError as e:
        raise AdaspecError(f"adaspec serve needs the 'serve' extra ({e.name} is missing): "
                           "pip install 'adaspec[serve]'") from None

    api_key = keys_from_cli(args.api_key, os.environ.get(API_KEY_ENV))
    if args.suffix_cache_tokens is not None and args.suffix_cache_tokens < 0:
        raise AdaspecError(f"--suffix-cache-tokens must be >= 0, got {args.suffix_cache_tokens}")
    if not _is_loopback(args.host) and not api_key:
        print(f"adaspec: warning: listening on {args.host} without an API key; anyone who can reach this port can "
              f"use the model (set --api-key or {API_KEY_ENV})", file=sys.stderr)
    if args.max_queue < 0:
        raise AdaspecError(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.request_timeout <= 0:
        raise AdaspecError(f"--request-timeout must be > 0, got {args.request_timeout}")
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), format="%(levelname)s %(name)s: %(message)s")
    print(f"adaspec: loading {args.target} (drafter {args.draft}, controller {args.controller})...", file=sys.stderr)
    if args.max_batch < 1:
        raise AdaspecError(f"--max-batch must be >= 1, got {args.max_batch}")
    for flag, value in (("--max-slots-per-request", args.max_slots_per_request),
                        ("--max-queue-per-client", args.max_queue_per_client), ("--max-scored-tokens",
                        args.max_scored_tokens), ("--max-scored-logits-mb", args.max_scored_logits_mb)):
        if value is not None and value < 1:
            raise AdaspecError(f"{flag} must be >= 1, got {value}")
    if args.prefill_chunk is not None and args.prefill_chunk < 0:
        raise AdaspecError(f"--prefill-chunk must be >= 0 (0: whole prompts), got {args.prefill_chunk}")
    prefill_chunk = DEFAULT_PREFILL_CHUNK if args.prefill_chunk is None else (args.prefill_chunk or None)
    if args.prefill_step_ms is not None and not args.prefill_step_ms >= 0:
        raise AdaspecError(f"--prefill-step-ms must be >= 0 (0: fixed chunks), got {args.prefill_step_ms}")
    prefill_step_ms = DEFAULT_PREFILL_STEP_MS if args.prefill_step_ms is None else (args.prefill_step_ms or None)
    prefix_cache_mib = DEFAULT_PREFIX_CACHE_MIB if args.prefix_cache_mib is None else args.prefix_cache_mib
    if prefix_cache_mib < 0:
        raise AdaspecError(f"--prefix-cache-mib must be >= 0 (0: the request before only), got {prefix_cache_mib}")
    allowed_hosts = parse_allowed_hosts(args.allowed_hosts, args.host, _is_loopback(args.host))
    names = args.served_model_name or [args.target]  # the name the user typed (vLLM serves the model as given)
    # Loaded on a thread that then ends: loading may run parallel work (the runtime probe of --backend auto, a
    # PyTorch dtype conversion), and an OpenMP team left on the main thread would slow every forward of the
    # generation thread (ModelHost.on_generation_thread); a thread's team ends with it.
    with ThreadPoolExecutor(1, thread_name_prefix="adaspec-load") as once:
        host = once.submit(ModelHost.load, args.target, args.draft, controller=args.controller, k=args.k,
                           dtype=args.dtype, threads=args.threads, extra_drafters=args.allow_drafter,
                           backend=args.backend, device=args.device, max_batch=args.max_batch,
                           strict=args.strict, prefill_chunk=prefill_chunk, prefill_step_ms=prefill_step_ms,
                           served_as=names[0], suffix_tokens=args.suffix_cache_tokens,
                           prefix_cache=not args.no_prefix_cache,
                           prefix_cache_bytes=prefix_cache_mib << 20, draft_catch_up=args.draft_catch_up).result()
    if not args.no_warmup:  # on the generation thread, like every forward (ModelHost.on_generation_thread)
        host.on_generation_thread(host.warmup)
        curve = host.engine_for(host.default).engine.verify_curve
        if curve:  # the goodput controller's seed: its shape prices the draft lengths not yet run
            print("adaspec: verification cost curve (ms by tokens in one forward): "
                  + ", ".join(f"{n}: {ms:.0f}" for n, ms in curve.items()), file=sys.stderr)
        if host.batch is not None:
            curve = host.on_generation_thread(host.calibrate_batch)
            print("adaspec: batch cost curve (ms by tokens in one forward): "
                  + ", ".join(f"{n}: {ms:.0f}" for n, ms in curve.items()), file=sys.stderr)
            for name, (draft_ms, feed_ms) in host.batch.draft_costs.items():
                print(f"adaspec: draft model {name}: {draft_ms:.1f} ms per drafted token, {feed_ms:.2f} ms per "
                      "token fed (prices its first proposal in each request)", file=sys.stderr)
    config = ServerConfig(served_model_name=names[0], model_aliases=tuple(names[1:]), allowed_hosts=allowed_hosts,
                          max_slots_per_request=args.max_slots_per_request,
                          max_queue_per_client=args.max_queue_per_client, max_scored_tokens=args.max_scored_tokens,
                          max_scored_logits_mb=args.max_scored_logits_mb, api_key=api_key, max_queue=args.max_queue,
                          request_timeout=args.request_timeout, max_body_bytes=args.max_body_bytes,
                          default_max_tokens=args.default_max_tokens, max_tokens_limit=args.max_tokens_limit,
                          metrics_namespace=args.metrics_namespace, strict=args.strict,
                          suffix_share=args.suffix_share)
    import prometheus_client

    prometheus_client.disable_created_metrics()  # no *_created series (as vLLM)
    app = create_app(host, config)
    plain = f", plain step {host.plain_ms:.1f} ms" if host.plain_ms else ""
    auth = f"on, {len(api_key)} key(s){', suffix cache shared' if args.suffix_share else ''}" if api_key else "off"
    print(f"adaspec: serving {config.served_model_name or host.name} on http://{args.host}:{args.port}/v1 "
          f"(auth {auth}, batch {args.max_batch}, queue {args.max_queue}{plain}; also accepts "
          f"{host.name!r}; allowed hosts: {', '.join(allowed_hosts) if allowed_hosts else 'any'})",
          file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    finally:
        host.shutdown()
    return 0
