"""``adaspec bench``, ``advise``, ``map`` and ``profile``: the performance-boundary study (:mod:`adaspec.bench`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from adaspec.bench.grid import build_config, expand
from adaspec.cli.options import add_runtime_args
from adaspec.defaults import DEVICE_CHOICES
from adaspec.errors import ConfigError
from adaspec.models import DEFAULT_DRAFT, DEFAULT_TARGET

MAP_TITLE = "Where speculative decoding pays on this machine"


def add_bench_parsers(sub) -> None:
    """``bench``, ``map`` and ``profile``: the performance-boundary study (adaspec.bench)."""
    bench = sub.add_parser("bench", help="sweep speculative settings against plain decoding (JSONL, resumable)")
    preset = bench.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_const", const="quick", dest="preset",
                        help="the quick preset (about 10 minutes on 2 CPU cores)")
    preset.add_argument("--full", action="store_const", const="full", dest="preset", help="the full preset (hours)")
    bench.add_argument("--config", help="TOML or YAML sweep config (applied over the preset, if any)")
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override, e.g. bench.dtype='[\"float32\"]', micro.repeats=5, sweep.alpha-k.k=[2,4]")
    bench.add_argument("--sweeps", default=None, help="comma-separated sweep names to run (default: all)")
    bench.add_argument("--dtype", default=None, help="comma-separated dtypes (overrides bench.dtype)")
    bench.add_argument("--threads", default=None, help="comma-separated thread counts (overrides bench.threads)")
    bench.add_argument("--backend", default=None,
                       help="comma-separated backends: torch, llamacpp, ik (overrides bench.backend)")
    bench.add_argument("--device", default=None, choices=DEVICE_CHOICES,
                       help="where PyTorch settings run (overrides bench.device; default auto: CUDA when PyTorch "
                            "sees one); the GGUF runtimes run on the CPU")
    bench.add_argument("--out", default=None,
                       help="results file (appended; reruns resume; default results/bench.jsonl, with --endpoint "
                            "results/endpoint.jsonl)")
    bench.add_argument("--time-limit", type=float, default=None, metavar="MIN",
                       help="start no new point after MIN minutes (rerun to continue)")
    bench.add_argument("--dry-run", action="store_true", help="print the points and exit")
    ep = bench.add_argument_group("a serving endpoint instead of adaspec's engine (any OpenAI-compatible server)")
    ep.add_argument("--endpoint", default=None, metavar="URL",
                    help="base URL of the server to measure (http://host:port, with or without /v1)")
    ep.add_argument("--baseline", default=None, metavar="URL",
                    help="the same model served without speculation, for speedups (default: --endpoint itself when "
                         "--baseline-body is given)")
    ep.add_argument("--body", default="{}", metavar="JSON", help="extra request fields for the endpoint")
    ep.add_argument("--baseline-body", default=None, metavar="JSON",
                    help='extra request fields for the baseline, e.g. \'{"speculation": {"drafter": "none"}}\' '
                         'for adaspec serve')
    ep.add_argument("--model", default=None, help="model name to request (default: the first of GET /v1/models)")
    ep.add_argument("--api", default="chat", choices=("chat", "completions"),
                    help="/v1/chat/completions or /v1/completions (default: %(default)s)")
    ep.add_argument("--workload", default="humaneval",
                    help="a workload name (humaneval, gsm8k, specbench[:<category>], code-edit, "
                         "structured[:<category>], ...) or a JSONL of prompts (default: %(default)s)")
    ep.add_argument("--prompts", type=int, default=8, help="prompts taken from the workload (default: %(default)s)")
    ep.add_argument("--max-tokens", type=int, default=128)
    ep.add_argument("--temperature", type=float, default=0.0)
    ep.add_argument("--concurrency", default=None,
                    help="closed-loop client counts, comma-separated (default: 1 unless --rate is given)")
    ep.add_argument("--rate", default=None, help="open-loop Poisson arrival rates in requests/s, comma-separated")
    ep.add_argument("--requests", type=int, default=None,
                    help="requests per configuration (default: the prompt count, at least 2 per client)")
    ep.add_argument("--rounds", type=int, default=1, help="repeat every configuration (arms alternate)")
    ep.add_argument("--settle", type=float, default=0.0, metavar="S",
                    help="before measuring, decode S seconds of full requests on each arm (a freshly started "
                         "server can decode slowly at first; default: %(default)s)")
    ep.add_argument("--interleave", action="store_true",
                    help="at one client, alternate the arms request by request (needs --baseline URL): each "
                         "prompt's pair is measured seconds apart, so slow spells of the machine hit both")
    ep.add_argument("--api-key", default=None)
    ep.add_argument("--request-timeout", type=float, default=300.0, metavar="S")
    ep.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput objective: TTFT at most this")
    ep.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput objective: TPOT at most this")
    ep.add_argument("--seed", type=int, default=0)
    bench.set_defaults(func=cmd_bench)

    adv = sub.add_parser("advise", help="a speculative configuration for vLLM, SGLang or llama.cpp from endpoint "
                                        "results (adaspec bench --endpoint with a baseline)")
    adv.add_argument("results", nargs="+", help="results files written by adaspec bench --endpoint")
    adv.add_argument("--for", dest="engine", required=True, choices=("vllm", "sglang", "llamacpp"))
    adv.add_argument("--method", default="ngram", choices=("ngram", "draft"),
                     help="what the engine drafts with: prompt lookup or a draft model (default: %(default)s)")
    adv.add_argument("--draft-model", default=None, help="the draft model's name or path, for --method draft")
    adv.add_argument("--model", default=None, help="the target model's name (default: the one measured)")
    adv.add_argument("--max-k", type=int, default=8)
    adv.add_argument("--json", action="store_true", help="print one JSON object")
    adv.set_defaults(func=cmd_advise)

    mp = sub.add_parser("map", help="boundary maps (PNG) and a Markdown/HTML report from bench results")
    mp.add_argument("results", nargs="*", help="results files written by adaspec bench (with --hardware: measured "
                                               "micro rows to check the prediction against)")
    mp.add_argument("--report", default="results/boundary.md", help="Markdown report path")
    mp.add_argument("--img-dir", default=None, help="folder for the PNGs (default: img/ beside the report)")
    mp.add_argument("--html", default=None, help="also write an HTML version here")
    mp.add_argument("--title", default=MAP_TITLE)
    mp.add_argument("--notes", default=None, metavar="FILE",
                    help="Markdown written by you (what the numbers mean), placed after the report's overview")
    mp.add_argument("--command", action="append", default=[], metavar="CMD",
                    help="the bench command that produced the results, for the report (repeatable; default: the "
                         "command lines recorded in the results)")
    hw = mp.add_argument_group("predicted maps (no measurement: the roofline model of adaspec.bench.hardware)")
    hw.add_argument("--hardware", default=None, metavar="NAME",
                    help="predict for a named device (rtx-3090, rtx-4090, a100-80gb, h100-sxm, h200, laptop-cpu) or "
                         "this-cpu (measured now) instead of reading results")
    hw.add_argument("--shape", default="7b", help="target model shape (0.5b..32b, qwen2.5-7b, vicuna-7b, a zoo name; "
                                                  "default: %(default)s)")
    hw.add_argument("--draft", action="append", default=None, metavar="SHAPE",
                    help="draft model shape, or ngram for prompt lookup (repeatable; default: 0.5b and ngram)")
    hw.add_argument("--dtype", default="bfloat16",
                    help="bfloat16, float16, float32, q4_k_m, q8_0 (default: %(default)s)")
    hw.add_argument("--layer-ms", type=float, default=None,
                    help="host time per decoder layer, ms (default: the profile's; about 0 for CUDA graphs)")
    hw.add_argument("--replay", action="append", default=[], metavar="FILE",
                    help="adaspec compare results whose measured speculation steps (chains, trees) are replayed on "
                         "this hardware: predicted speedups per method (repeatable)")
    mp.set_defaults(func=cmd_map)

    prof = sub.add_parser("profile", help="measure a workload sample and advise whether and how to speculate")
    prof.add_argument("workload", help="a workload name (humaneval, gsm8k, specbench[:<category>], rag, "
                                       "summarization, code-edit, multi-turn, gsm8k-cot) or a JSONL of prompts "
                                       "(fields prompt/text/question/turns)")
    prof.add_argument("--target", default=DEFAULT_TARGET, help="target model (default: %(default)s)")
    prof.add_argument("--drafts", default=f"{DEFAULT_DRAFT},ngram",
                      help="comma-separated candidate drafters (default: %(default)s)")
    prof.add_argument("--sample", type=int, default=3, help="prompts measured (default: %(default)s)")
    prof.add_argument("--max-new-tokens", type=int, default=48, help="tokens per probe run (default: %(default)s)")
    prof.add_argument("--confirm-tokens", type=int, default=128, metavar="N",
                      help="then run the recommended configuration as it will run, N tokens per answer, against "
                           "plain decoding on the same prompts; the expected speedup is that measurement "
                           "(0: the cost model's prediction only; default: %(default)s)")
    prof.add_argument("--temperature", type=float, default=0.0)
    add_runtime_args(prof)
    prof.add_argument("--seed", type=int, default=0)
    prof.add_argument("--json", action="store_true", help="print one JSON object")
    pe = prof.add_argument_group("a serving endpoint instead of adaspec's engine")
    pe.add_argument("--endpoint", default=None, metavar="URL", help="measure this OpenAI-compatible server")
    pe.add_argument("--baseline", default=None, metavar="URL", help="the same model without speculation")
    pe.add_argument("--baseline-body", default=None, metavar="JSON",
                    help="request fields that turn speculation off on --endpoint itself (adaspec serve: "
                         "'{\"speculation\": {\"drafter\": \"none\"}}')")
    pe.add_argument("--rounds", type=int, default=1,
                    help="send every prompt this many times per arm (arms alternate); each arm's median rate per "
                         "prompt is paired (default: %(default)s)")
    pe.add_argument("--settle", type=float, default=0.0, metavar="S",
                    help="before measuring, decode S seconds of full requests on each server (default: %(default)s)")
    pe.add_argument("--interleave", action="store_true",
                    help="alternate the two servers request by request (needs --baseline URL)")
    pe.add_argument("--pick", default=None, choices=("random", "first"),
                    help="which prompts of the workload: a random sample drawn with --seed (kept in file order), or "
                         "the first ones (default: random)")
    pe.add_argument("--precision", type=float, default=None, metavar="P",
                    help="widen the sample until the speedup's 95%% interval is within ± P of it (0.10: ±10%%), "
                         "measuring further prompts of the same random order in passes (each at most doubling the "
                         "sample), up to the whole workload")
    pe.add_argument("--out", default="results/profile-endpoint.jsonl", help="endpoint results file (resumable)")
    prof.set_defaults(func=cmd_profile)


def _floats(text: str | None, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()] if text else []
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated numbers, not {text!r}") from None


def _json_object(text: str | None, what: str) -> dict | None:
    if text is None:
        return None
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{what} is not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{what} must be a JSON object, not {text!r}")
    return obj


def cmd_bench_endpoint(args: argparse.Namespace) -> int:
    from adaspec.bench.endpoint import EndpointConfig, run_endpoint_bench

    rates = _floats(args.rate, "--rate")
    try:
        concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()] if args.concurrency else []
    except ValueError:
        raise ConfigError(f"--concurrency must be comma-separated whole numbers, not {args.concurrency!r}") from None
    concurrency = concurrency or ([] if rates else [1])
    cfg = EndpointConfig(url=args.endpoint, baseline=args.baseline, body=_json_object(args.body, "--body") or {},
                         baseline_body=_json_object(args.baseline_body, "--baseline-body"), model=args.model,
                         api=args.api, workload=args.workload, prompts=args.prompts, max_tokens=args.max_tokens,
                         temperature=args.temperature, concurrency=concurrency, rates=rates, requests=args.requests,
                         rounds=args.rounds, seed=args.seed, api_key=args.api_key, timeout_s=args.request_timeout,
                         interleave=args.interleave,
                         slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms)
    out = Path(args.out or "results/endpoint.jsonl")
    argv = ["adaspec", "bench"]
    for flag in ("endpoint", "baseline", "body", "baseline_body", "model", "api", "workload", "prompts", "max_tokens",
                 "temperature", "concurrency", "rate", "requests", "rounds", "settle", "slo_ttft_ms", "slo_tpot_ms",
                 "out"):
        value = getattr(args, flag)
        if value is not None and not (flag == "body" and value == "{}") and not (flag == "settle" and not value):
            argv += [f"--{flag.replace('_', '-')}", f"'{value}'" if flag.endswith("body") else str(value)]
    argv += ["--interleave"] if args.interleave else []
    result = run_endpoint_bench(cfg, out, log=lambda msg: print(msg, file=sys.stderr),
                                time_limit_s=args.time_limit * 60 if args.time_limit else None, argv=argv,
                                settle_s=args.settle)
    print(f"{result['run']} configurations measured, {result['done']} already in {out}"
          + (", stopped at the time limit (rerun to continue)" if result["stopped"] else "")
          + f". Next: adaspec map {out} --report results/endpoint.md")
    return 0


def cmd_advise(args: argparse.Namespace) -> int:
    from adaspec.bench.advise import advise_files, format_advice

    out = advise_files([Path(p) for p in args.results], args.engine, method=args.method, draft=args.draft_model,
                       model=args.model, max_k=args.max_k)
    print(json.dumps(out, indent=2) if args.json else format_advice(args.engine, out, out["config"]))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from adaspec.bench.sweep import run_bench

    if args.endpoint:
        return cmd_bench_endpoint(args)
    args.out = args.out or "results/bench.jsonl"

    overrides = list(args.set)
    if args.dtype:
        overrides.append("bench.dtype=" + json.dumps(args.dtype.split(",")))
    if args.threads:
        overrides.append("bench.threads=[" + args.threads + "]")
    if args.backend:
        overrides.append("bench.backend=" + json.dumps(args.backend.split(",")))
    if args.device:
        overrides.append("bench.device=" + json.dumps(args.device))
    cfg = build_config(config_file=args.config, preset_name=args.preset, overrides=overrides,
                       sweeps=args.sweeps.split(",") if args.sweeps else None)
    if args.dry_run:
        for p in expand(cfg):
            print(json.dumps(p.fields()))
        return 0
    argv = ["adaspec", "bench"] + ([f"--{args.preset}"] if args.preset else [])
    for flag in ("config", "sweeps", "dtype", "threads", "backend", "device", "out"):
        if getattr(args, flag):
            argv += [f"--{flag}", str(getattr(args, flag))]
    argv += [f"--set '{o}'" for o in args.set]
    result = run_bench(cfg, Path(args.out), time_limit_s=args.time_limit * 60 if args.time_limit else None,
                       log=lambda msg: print(msg, file=sys.stderr), argv=argv)
    print(f"{result['run']} points measured, {result['done']} already in {args.out}"
          + (", stopped at the time limit (rerun to continue)" if result["stopped"] else "")
          + f". Next: adaspec map {args.out}")
    return 0


def cmd_map(args: argparse.Namespace) -> int:
    from adaspec.bench.report import make_report

    if args.hardware:
        from adaspec.bench.predicted import predicted_report

        out = predicted_report(args.hardware, args.shape, args.draft or ["0.5b", "ngram"], Path(args.report),
                               dtype=args.dtype, img_dir=Path(args.img_dir) if args.img_dir else None,
                               layer_ms=args.layer_ms, measured=[Path(r) for r in args.results],
                               replay=[Path(r) for r in args.replay])
        print(f"wrote {out['report']} (PREDICTED, {out['profile'].name})"
              + "".join(f"\n  {p}" for p in out["figures"].values()))
        return 0
    if not args.results:
        raise ConfigError("adaspec map needs results files written by adaspec bench (or --hardware NAME for "
                          "predicted maps)")
    from adaspec.bench.endpoint import is_endpoint_file

    endpoint = [r for r in args.results if is_endpoint_file(Path(r))]
    if endpoint:
        if len(endpoint) != len(args.results):
            raise ConfigError("give endpoint results (adaspec bench --endpoint) and engine results (adaspec bench) "
                              "to separate adaspec map calls: they make different reports")
        from adaspec.bench.endpoint_report import make_endpoint_report

        title = args.title if args.title != MAP_TITLE else "Speculative decoding on a serving endpoint"
        out = make_endpoint_report([Path(r) for r in endpoint], Path(args.report),
                                   img_dir=Path(args.img_dir) if args.img_dir else None,
                                   html=Path(args.html) if args.html else None, title=title,
                                   commands=args.command or None)
        print(f"wrote {out['report']}" + "".join(f"\n  {p}" for p in out["figures"].values()))
        return 0
    out = make_report([Path(r) for r in args.results], Path(args.report),
                      img_dir=Path(args.img_dir) if args.img_dir else None,
                      html=Path(args.html) if args.html else None, title=args.title, commands=args.command,
                      notes=Path(args.notes) if args.notes else None,
                      map_command=" ".join(["adaspec", "map", *args.results, "--report", args.report]
                                           + (["--img-dir", args.img_dir] if args.img_dir else [])
                                           + (["--html", args.html] if args.html else [])
                                           + (["--notes", args.notes] if args.notes else [])
                                           + [f"--command '{c}'" for c in args.command]))
    print(f"wrote {out['report']}" + "".join(f"\n  {p}" for figs in out["figures"].values() for p in figs.values()))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from adaspec.bench.profile import format_advice, profile_workload

    if args.endpoint:
        from adaspec.bench.advise import format_profile, profile_endpoint
        from adaspec.bench.endpoint import EndpointConfig, read_rows, run_endpoint_bench, workload_items

        if not args.baseline and args.baseline_body is None:
            raise ConfigError("profile --endpoint needs a baseline: --baseline URL or --baseline-body JSON")
        if args.precision is not None and not 0 < args.precision < 1:
            raise ConfigError(f"--precision takes a fraction of the speedup in (0, 1), e.g. 0.10, not {args.precision}")
        if args.sample < 1:
            raise ConfigError(f"--sample must be >= 1, not {args.sample}")
        total = len(workload_items(args.workload))
        out, rows, taken, want, passes = Path(args.out), [], 0, min(args.sample, total), 0
        while True:  # one pass, or more while --precision is not reached and prompts are left
            cfg = EndpointConfig(url=args.endpoint, baseline=args.baseline,
                                 baseline_body=_json_object(args.baseline_body, "--baseline-body"),
                                 workload=args.workload, prompts=want - taken,
                                 max_tokens=args.confirm_tokens or args.max_new_tokens,
                                 temperature=args.temperature, seed=args.seed, requests=want - taken,
                                 rounds=args.rounds, interleave=args.interleave, pick=args.pick or "random",
                                 skip=taken)
            key = run_endpoint_bench(cfg, out, log=lambda msg: print(msg, file=sys.stderr),
                                     settle_s=args.settle if passes == 0 else 0.0)["key"]  # warm after a pass
            rows += [r for r in read_rows([out]) if r.get("run") == key]
            taken, passes = want, passes + 1
            p = profile_endpoint(rows, precision=args.precision or 0.10)
            reached = p["precision"] is not None and p["precision"] <= (args.precision or 0.0)
            if args.precision is None or reached or taken >= total:
                break
            # toward the sample the spread asks for, at most doubling per pass (a spread from few prompts is rough)
            want = min(total, 2 * taken, max(taken + 1, p["prompts_needed"] or total))
            spread = f"±{100 * p['precision']:.1f}%" if p["precision"] is not None else "no spread yet"
            print(f"{p['prompts']} prompt(s): {spread}, short of ±{100 * args.precision:g}%; measuring prompts "
                  f"{taken + 1}-{want} of {total}", file=sys.stderr)
        p["passes"], p["workload_prompts"] = passes, total
        if args.precision is not None:
            p["precision_reached"] = reached
        print(json.dumps(p, indent=2) if args.json else format_profile(p, out))
        return 0
    if args.rounds != 1 or args.settle or args.interleave or args.precision is not None or args.pick:
        raise ConfigError("--rounds, --settle, --interleave, --pick and --precision measure a serving endpoint: give "
                          "--endpoint URL")

    advice = profile_workload(args.workload, target=args.target, drafts=args.drafts.split(","),
                              sample=args.sample, max_new_tokens=args.max_new_tokens,
                              temperature=args.temperature, dtype=args.dtype, threads=args.threads, seed=args.seed,
                              backend=args.backend, device=args.device, confirm_tokens=args.confirm_tokens)
    print(json.dumps(advice, indent=2) if args.json else format_advice(advice))
    return 0
