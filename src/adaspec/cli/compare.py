"""``adaspec compare``: decoding methods compared on workloads (:mod:`adaspec.compare`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from adaspec.cli.options import add_catch_up_arg, add_model_args, add_strict_arg
from adaspec.models import DEFAULT_DRAFT


def add_compare_parser(sub) -> None:
    cmp = sub.add_parser("compare", help="compare decoding methods on workloads (interleaved, resumable)")
    add_model_args(cmp, DEFAULT_DRAFT)  # the draft model of DRAFTER-less methods (fixed:K, goodput, hf:...)
    preset = cmp.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_const", const="quick", dest="preset",
                        help="humaneval, gsm8k, Spec-Bench translation; T = 0 and 1; 1 prompt, 32 tokens; main methods")
    preset.add_argument("--full", action="store_const", const="full", dest="preset",
                        help="every category at T = 0 and 1, 10 prompts, 128 tokens, every method (hours)")
    cmp.add_argument("--methods", default=None,
                     help="comma-separated methods: plain, fixed:K, CONTROLLER[:K], DRAFTER/CONTROLLER[:K], "
                          "hybrid/CONTROLLER, hf:constant[:K], hf:heuristic, hf:dynamic, hf:pld; peers in their own "
                          "processes: llama-server:plain|draft[:K]|ngram[:N]|draft+ngram, llamacpp:pld[:N], "
                          "openvino:plain|draft[:K]|lookup[:K], vllm@URL (docs/guide/peers.md) "
                          "(default: plain,hybrid-suffix/goodput,goodput,fixed:2,fixed:4)")
    cmp.add_argument("--workloads", default=None,
                     help="comma-separated: humaneval, gsm8k, specbench, specbench:<category>, rag, summarization, "
                          "code-edit, multi-turn, gsm8k-cot, agentic (sessions, in step order), or JSONL paths "
                          "(default: humaneval)")
    cmp.add_argument("--limit", type=int, default=None,
                     help="prompts per workload, per category (default 10)")
    cmp.add_argument("--max-new-tokens", type=int, default=None, help="default 128")
    cmp.add_argument("--temperatures", default=None, help="comma-separated, e.g. 0,1.0 (default 0)")
    cmp.add_argument("--seed", type=int, default=0)
    cmp.add_argument("--out", default="results/compare.jsonl", help="results file (appended; reruns resume)")
    cmp.add_argument("--report", default=None, help="also write the Markdown summary here")
    cmp.add_argument("--time-limit", type=float, default=None, metavar="MIN",
                     help="start no new prompt after MIN minutes (rerun to continue)")
    cmp.add_argument("--no-prompt-cache", dest="prompt_cache", action="store_false",
                     help="every method prefills the prompt itself (default: one untimed prefill per prompt, "
                          "shared by all methods, so rows time decoding)")
    add_strict_arg(cmp)
    add_catch_up_arg(cmp)
    cmp.add_argument("--default-method", default=None,
                     help="the method the target check is about (default: adaspec's default configuration)")
    cmp.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from adaspec.compare import DEFAULT_METHOD, PRESETS, markdown_report, read_results, run_compare

    preset = PRESETS.get(args.preset, {})

    def pick(value, key, legacy):
        return value.split(",") if isinstance(value, str) else value if value is not None else preset.get(key, legacy)

    out = run_compare(target=args.target, draft=args.draft,
                      methods=pick(args.methods, "methods",
                                   ["plain", DEFAULT_METHOD, "goodput", "fixed:2", "fixed:4"]),
                      workloads=pick(args.workloads, "workloads", ["humaneval"]),
                      limit=pick(args.limit, "limit", 10),
                      max_new_tokens=pick(args.max_new_tokens, "max_new_tokens", 128),
                      temperatures=[float(t) for t in pick(args.temperatures, "temperatures", [0.0])],
                      out=Path(args.out), dtype=args.dtype, threads=args.threads, seed=args.seed,
                      backend=args.backend, device=args.device,
                      time_limit_s=args.time_limit * 60 if args.time_limit else None, prompt_cache=args.prompt_cache,
                      strict=args.strict, draft_catch_up=args.draft_catch_up)
    report = markdown_report(read_results(out), args.default_method or DEFAULT_METHOD)
    print(report)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(report, encoding="utf-8")
    return 0
