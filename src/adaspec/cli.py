"""Command line: ``adaspec generate``, ``adaspec models``.

Errors that adaspec raises on purpose (:class:`~adaspec.errors.AdaspecError`) are printed as one line naming the
problem, with exit code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from adaspec.controllers import CONTROLLERS
from adaspec.errors import AdaspecError
from adaspec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from adaspec.models.cli import add_models_parser


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help="target model: zoo name, .gguf file, HF folder or hub id (default: %(default)s)")
    p.add_argument("--draft", default=DEFAULT_DRAFT,
                   help="drafter: model spec, 'ngram', 'layerskip:N' or 'none' (default: %(default)s)")
    p.add_argument("--controller", default="adaptive", choices=CONTROLLERS, help="draft-length controller")
    p.add_argument("--k", type=int, default=None, help="draft length K (fixed), or the initial K of adaptive")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="PyTorch dtype")
    p.add_argument("--threads", type=int, default=None, help="PyTorch threads (default: all cores)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adaspec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text with speculative decoding")
    gen.add_argument("prompt", nargs="?", help="the prompt (or use --prompt-file)")
    gen.add_argument("--prompt-file", help="read the prompt from this file ('-' = stdin)")
    _add_model_args(gen)
    _add_sampling_args(gen)
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="apply the model's chat template (default: on when the model has one)")
    gen.add_argument("--compare", action="store_true",
                     help="also run plain decoding on the same prompt; print the speedup and output identity")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of text and a table")
    gen.set_defaults(func=cmd_generate)

    cmp = sub.add_parser("compare", help="compare decoding methods on workloads (interleaved, resumable)")
    _add_model_args(cmp)
    cmp.add_argument("--methods", default="plain,adaptive,fixed:2,fixed:4,fixed:8",
                     help="comma-separated methods: plain, fixed:K, adaptive, heuristic, DRAFTER/CONTROLLER[:K]")
    cmp.add_argument("--workloads", default="humaneval",
                     help="comma-separated: humaneval, gsm8k, specbench, specbench:<category>, or JSONL paths")
    cmp.add_argument("--limit", type=int, default=10, help="prompts per workload (per category for specbench)")
    cmp.add_argument("--max-new-tokens", type=int, default=128)
    cmp.add_argument("--temperatures", default="0", help="comma-separated, e.g. 0,1.0")
    cmp.add_argument("--seed", type=int, default=0)
    cmp.add_argument("--out", default="results/compare.jsonl", help="results file (appended; reruns resume)")
    cmp.add_argument("--report", default=None, help="also write the Markdown summary here")
    cmp.set_defaults(func=cmd_compare)

    add_models_parser(sub)
    return parser


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file:
        if args.prompt_file == "-":
            return sys.stdin.read()
        with open(args.prompt_file, encoding="utf-8") as f:
            return f.read()
    if args.prompt is None:
        raise AdaspecError("give a prompt, or --prompt-file")
    return args.prompt


def cmd_generate(args: argparse.Namespace) -> int:
    from adaspec.api import load
    from adaspec.engine import GenerationConfig

    prompt = _read_prompt(args)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k, seed=args.seed, stop=tuple(args.stop))
    lm = load(args.target, args.draft, controller=args.controller, k=args.k, dtype=args.dtype,
              threads=args.threads)
    prompt_ids = lm.encode(prompt, args.chat)
    lm.engine.warmup()
    result = None
    for chunk in lm.engine.stream(prompt_ids, config):
        if not args.json:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        result = chunk.result or result
    out = {"text": result.text, "finish_reason": result.finish_reason, "stats": result.stats.summary()}
    if args.compare:
        plain_engine = lm.plain()
        plain = plain_engine.generate(prompt_ids, config)
        out["compare"] = {
            "plain_tokens_per_s": round(plain.stats.tokens_per_s, 3),
            "speculative_tokens_per_s": round(result.stats.tokens_per_s, 3),
            "speedup": round(result.stats.tokens_per_s / plain.stats.tokens_per_s, 3),
            "identical": plain.token_ids == result.token_ids,
            "plain_new_tokens": plain.stats.new_tokens,
        }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print()
        print(format_stats(out, target=lm.target.name, drafter=args.draft, controller=args.controller))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from adaspec.compare import markdown_report, read_results, run_compare

    out = run_compare(target=args.target, draft=args.draft, methods=args.methods.split(","),
                      workloads=args.workloads.split(","), limit=args.limit, max_new_tokens=args.max_new_tokens,
                      temperatures=[float(t) for t in args.temperatures.split(",")], out=Path(args.out),
                      dtype=args.dtype, threads=args.threads, seed=args.seed)
    report = markdown_report(read_results(out))
    print(report)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(report, encoding="utf-8")
    return 0


def format_stats(out: dict, *, target: str, drafter: str, controller: str) -> str:
    """Human-readable table of a generate result (``out`` as printed by ``--json``)."""
    s = out["stats"]
    rows = [
        ("target / drafter / controller", f"{target} / {drafter} / {controller}"),
        ("new tokens (finish)", f"{s['new_tokens']} ({out['finish_reason']})"),
        ("tokens/s", f"{s['tokens_per_s']:.2f}"),
        ("TTFT / TPOT", f"{s['ttft_ms']:.0f} ms / {s['tpot_ms']:.1f} ms"),
        ("steps (speculative)", f"{s['steps']} ({s['speculation_steps']})"),
        ("draft tokens: proposed / accepted", f"{s['draft_tokens']} / {s['accepted_tokens']}"),
        ("acceptance rate α", f"{s['acceptance_rate']:.3f}"),
        ("mean accepted tokens τ", f"{s['mean_accepted_tokens']:.2f}"),
        ("K per step", _compress(s["k_trace"])),
        ("time: prefill / draft / verify / other",
         f"{s['prefill_ms']:.0f} / {s['draft_ms']:.0f} / {s['verify_ms']:.0f} / {s['other_ms']:.0f} ms"),
        ("peak RSS", f"{s['peak_rss_bytes'] / 2**30:.2f} GiB"),
    ]
    if "compare" in out:
        c = out["compare"]
        rows += [("plain decoding tokens/s", f"{c['plain_tokens_per_s']:.2f}"),
                 ("speedup vs plain", f"{c['speedup']:.2f}x"),
                 ("output identical to plain", "yes" if c["identical"] else "no")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _compress(trace: list[int]) -> str:
    """Run-length encode a K trace: [4, 4, 4, 0] → '4x3 0'."""
    parts, i = [], 0
    while i < len(trace):
        j = i
        while j < len(trace) and trace[j] == trace[i]:
            j += 1
        parts.append(f"{trace[i]}x{j - i}" if j - i > 1 else str(trace[i]))
        i = j
    text = " ".join(parts)
    return text if len(text) <= 80 else text[:77] + "..."


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except AdaspecError as e:
        print(f"adaspec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
