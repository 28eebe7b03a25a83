"""``adaspec generate``: one prompt through the speculative engine, with a table of its statistics."""

from __future__ import annotations

import argparse
import json
import sys

from adaspec.cli.options import (add_catch_up_arg, add_model_args, add_sampling_args, add_structured_args, sampling_kwargs,
                                 structured_kwargs)
from adaspec.errors import AdaspecError
from adaspec.stats import compress_trace


def add_generate_parser(sub) -> None:
    gen = sub.add_parser("generate", help="generate text with speculative decoding")
    gen.add_argument("prompt", nargs="?", help="the prompt (or use --prompt-file)")
    gen.add_argument("--prompt-file", help="read the prompt from this file ('-' = stdin)")
    add_model_args(gen)
    add_catch_up_arg(gen)
    add_sampling_args(gen)
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="apply the model's chat template (default: on when the model has one)")
    gen.add_argument("--compare", action="store_true",
                     help="also run plain decoding on the same prompt; print the speedup and output identity")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of text and a table")
    gen.add_argument("--num-return-sequences", type=int, default=1, metavar="N",
                     help="N generations of the prompt (sampling: generation i uses seed + i)")
    gen.add_argument("--logprobs", type=int, default=None, metavar="N",
                     help="with --json: each token's log-probability and its N most likely alternatives")
    gen.add_argument("--tree-budget", type=int, default=0, metavar="N",
                     help="verify token trees of up to N draft nodes per step (--draft ngram-tree, or a draft model; "
                          "PyTorch or ik_llama.cpp target; 0 = chains)")
    gen.add_argument("--tree-choice", default="goodput", choices=("goodput", "always"),
                     help="with --tree-budget: chain or tree, and the tree's width, per step from measured goodput; "
                          "or always a full-width tree")
    gen.add_argument("--tree-expand", type=int, default=None, metavar="E",
                     help="with --tree-budget and a draft model: grow its tree level by level, expanding the E most "
                          "likely nodes per level with one draft forward (EAGLE-2; default 4 where the draft backend "
                          "can: PyTorch, ik_llama.cpp); 0 = its chain plus sibling leaves")
    add_structured_args(gen)
    gen.set_defaults(func=cmd_generate)


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
    config = GenerationConfig(**sampling_kwargs(args), logprobs=args.logprobs, tree_budget=args.tree_budget,
                              tree_choice=args.tree_choice, tree_expand=args.tree_expand, **structured_kwargs(args))
    lm = load(args.target, args.draft, controller=args.controller, k=args.k, backend=args.backend,
              device=args.device, dtype=args.dtype, threads=args.threads, draft_catch_up=args.draft_catch_up)
    if lm.target.runtime_reason:
        print(f"target runtime: {lm.target.runtime_reason}", file=sys.stderr)
    prompt_ids = lm.encode(prompt, args.chat)
    lm.engine.warmup(steps=12)  # also lets the default controller measure the draft's costs on this machine
    if args.num_return_sequences != 1:
        results = lm.generate_n(prompt, args.num_return_sequences, chat=args.chat, config=config)
        if args.json:
            print(json.dumps({"choices": [{"text": r.text, "finish_reason": r.finish_reason,
                                           "stats": r.stats.summary()} for r in results]}, indent=2))
        else:
            for i, r in enumerate(results):
                print(f"--- sequence {i} ({r.finish_reason}) ---\n{r.text}")
        return 0
    result = None
    for chunk in lm.engine.stream(prompt_ids, config):
        if not args.json:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        result = chunk.result or result
    out = {"text": result.text, "finish_reason": result.finish_reason, "stats": result.stats.summary()}
    if result.logprobs is not None:
        out["logprobs"] = [{"token_id": t.token_id, "token": lm.tokenizer.decode([t.token_id]),
                            "logprob": round(t.logprob, 6),
                            "top": [[i, round(v, 6)] for i, v in t.top]} for t in result.logprobs]
    if args.compare:
        plain_engine = lm.plain()
        plain = plain_engine.generate(prompt_ids, config)
        out["compare"] = {
            "plain_tokens_per_s": round(plain.stats.tokens_per_s, 3),
            "speculative_tokens_per_s": round(result.stats.tokens_per_s, 3),
            "speedup": round(result.stats.tokens_per_s / plain.stats.tokens_per_s, 3),
            "identical": plain.token_ids == result.token_ids,
            "plain_new_tokens": plain.stats.new_tokens,
            "runtime": _runtime_of(lm.target.backend),
            "other_runtimes_plain_tokens_per_s": _other_runtimes_plain(lm, prompt_ids, config),
        }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print()
        print(format_stats(out, target=lm.target.name, drafter=args.draft, controller=args.controller))
    return 0


def _runtime_of(backend) -> str:
    from adaspec.backends.gguf import GgufBackend

    return backend.runtime if isinstance(backend, GgufBackend) else "PyTorch"


def _other_runtimes_plain(lm, prompt_ids: list[int], config) -> dict[str, float]:
    """Plain decoding of the same GGUF and request on every other installed GGUF runtime (tokens/s, end to end
    like the main run), so ``--compare`` also shows the fastest plain path this machine has. Empty for a PyTorch
    target or when no other runtime is installed."""
    from adaspec.backends.gguf import GgufBackend
    from adaspec.backends.select import RUNTIME_LABELS, installed_runtimes, make_gguf_backend
    from adaspec.engine import SpeculativeEngine

    backend = lm.target.backend
    if not isinstance(backend, GgufBackend):
        return {}
    out = {}
    for name in installed_runtimes():
        if RUNTIME_LABELS[name] == backend.runtime:
            continue
        try:
            other = make_gguf_backend(name, backend.path, threads=backend.threads, max_context=backend.max_context)
        except AdaspecError as e:  # this runtime cannot run the file: say so, keep the main result
            print(f"plain decoding on {RUNTIME_LABELS[name]} skipped: {e}", file=sys.stderr)
            continue
        try:
            engine = SpeculativeEngine(other, None, None, tokenizer=lm.tokenizer)
            engine.warmup(steps=12)
            out[RUNTIME_LABELS[name]] = round(engine.generate(prompt_ids, config).stats.tokens_per_s, 3)
        except (AdaspecError, RuntimeError) as e:
            print(f"plain decoding on {RUNTIME_LABELS[name]} failed: {e}", file=sys.stderr)
        finally:
            other.close()
    return out


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
        ("K per step", compress_trace(s["k_trace"], limit=80)),
        ("time: prefill / draft / verify / other",
         f"{s['prefill_ms']:.0f} / {s['draft_ms']:.0f} / {s['verify_ms']:.0f} / {s['other_ms']:.0f} ms"),
        ("peak RSS", f"{s['peak_rss_bytes'] / 2**30:.2f} GiB"),
    ]
    if "compare" in out:
        c = out["compare"]
        rows += [(f"plain decoding tokens/s ({c.get('runtime', 'same runtime')})", f"{c['plain_tokens_per_s']:.2f}"),
                 ("speedup vs plain", f"{c['speedup']:.2f}x"),
                 ("output identical to plain", "yes" if c["identical"] else "no")]
        others = c.get("other_runtimes_plain_tokens_per_s") or {}
        for name, tps in others.items():
            rows.append((f"plain decoding tokens/s ({name})", f"{tps:.2f}"))
        plains = {c.get("runtime", "same runtime"): c["plain_tokens_per_s"], **others}
        fastest = max(plains, key=plains.get)
        rows.append(("fastest plain path known", f"{fastest} {plains[fastest]:.2f} tokens/s; speculative "
                                                 f"{c['speculative_tokens_per_s'] / plains[fastest]:.2f}x"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
