"""``adaspec eval``: task accuracy of plain vs speculative decoding (:mod:`adaspec.quality.evaluate`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from adaspec.cli.options import add_model_args
from adaspec.models import DEFAULT_DRAFT


def add_eval_parser(sub) -> None:
    ev = sub.add_parser("eval", help="task accuracy of plain vs speculative (and strict, lossy) decoding: HumanEval "
                                     "pass@1, GSM8K; paired tests, identity, divergence margins")
    add_model_args(ev, DEFAULT_DRAFT)
    ev.add_argument("--tasks", default="humaneval,gsm8k",
                    help="comma-separated: humaneval, gsm8k (zero-shot), gsm8k-cot (8-shot chain of thought), "
                         "structured (schema validity and exact fields; --limit counts per category) "
                         "(default: humaneval,gsm8k)")
    ev.add_argument("--methods", default=None,
                    help="comma-separated compare methods, with +strict and lossy modifiers +typical[:eps], "
                         "+topk[:k], +bild[:nats] (default: plain, hybrid/goodput, their strict versions and the "
                         "three lossy rules)")
    ev.add_argument("--limit", type=int, default=None, help="prompts per task (default: all: 82 / 600)")
    ev.add_argument("--max-new-tokens", type=int, default=256)
    ev.add_argument("--out", default="results/eval", help="results folder (reruns resume; scores are cached)")
    ev.add_argument("--time-limit", type=float, default=None, metavar="MIN",
                    help="start no new prompt after MIN minutes (rerun to continue), then score and report")
    ev.add_argument("--report-only", action="store_true", help="score and report the folder's generations only")
    ev.add_argument("--exec-timeout", type=float, default=10.0, help="seconds per HumanEval completion's tests")
    ev.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from adaspec.quality.evaluate import DEFAULT_METHODS, run_eval

    out = Path(args.out)
    results, meta, ok = run_eval(
        target=args.target, draft=args.draft, tasks=args.tasks.split(","),
        methods=args.methods.split(",") if args.methods else list(DEFAULT_METHODS), limit=args.limit,
        max_new_tokens=args.max_new_tokens, out_dir=out, dtype=args.dtype, threads=args.threads,
        backend=args.backend, device=args.device, time_limit_s=args.time_limit * 60 if args.time_limit else None,
        timeout_s=args.exec_timeout, generate=not args.report_only)
    print((out / "report.md").read_text(encoding="utf-8"))
    if not ok:
        print("adaspec eval: a lossless method diverged from its reference at a margin above the threshold "
              f"({meta['threshold']:.3g} logits): that is a bug, not rounding (see the divergence table)",
              file=sys.stderr)
        return 1
    return 0
