"""Options that several commands share: model and runtime choice, sampling, structured output, strict mode."""

from __future__ import annotations

import argparse
from pathlib import Path

from adaspec.defaults import BACKEND_CHOICES, DEFAULT_CONTROLLER, DEFAULT_DRAFT_CATCH_UP, DEFAULT_DRAFTER, DEVICE_CHOICES
from adaspec.errors import AdaspecError
from adaspec.models import DEFAULT_TARGET


def add_model_args(p: argparse.ArgumentParser, draft_default: str = DEFAULT_DRAFTER) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help="target model: zoo name, .gguf file, HF folder or hub id; append @torch, @llamacpp or @ik "
                        "to pin its backend; synthetic:<shape> (e.g. synthetic:qwen2.5-7b) is random weights in a "
                        "real shape, for timing only (default: %(default)s)")
    p.add_argument("--draft", default=draft_default,
                   help="drafter: model spec (NAME@ik etc. pins a backend), 'ngram', 'suffix[:KEY=VALUE,...]' (suffix "
                        "decoding, docs/guide/suffix.md), 'layerskip:N', 'A+B', 'hybrid', 'hybrid-suffix' or 'none' "
                        "(default: %(default)s)")
    p.add_argument("--controller", default=DEFAULT_CONTROLLER,
                   help="draft-length controller: goodput, adaptive, heuristic, fixed, confidence, entropy or bandit "
                        "(default: %(default)s)")
    p.add_argument("--k", type=int, default=None, help="draft length K (fixed), or the initial K (adaptive, heuristic)")
    add_runtime_args(p)


def add_runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="auto", choices=BACKEND_CHOICES,
                   help="where models run: auto = the fastest path measured on this machine (a GGUF runtime on a "
                        "CPU, PyTorch on CUDA), torch, llamacpp or ik (ik_llama.cpp) (default: %(default)s)")
    p.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                   help="auto = CUDA when PyTorch sees a GPU, else the CPU (default: %(default)s)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                   help="PyTorch dtype (default bfloat16); giving one makes --backend auto choose PyTorch")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for PyTorch and the GGUF runtimes (default: all cores)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--min-p", type=float, default=0.0, help="min-p sampling (0 = off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="Hugging Face repetition penalty (1 = off)")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="OpenAI presence penalty, in [-2, 2]")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI frequency penalty, in [-2, 2]")
    p.add_argument("--logit-bias", action="append", default=[], metavar="ID:BIAS",
                   help="add BIAS (in [-100, 100]) to token ID's logit (repeatable)")
    add_strict_arg(p)


def _logit_bias(items: list[str]) -> dict[int, float] | None:
    out = {}
    for item in items:
        token, _, bias = item.partition(":")
        try:
            out[int(token)] = float(bias)
        except ValueError:
            raise AdaspecError(f"--logit-bias expects ID:BIAS (e.g. 42:-100), got {item!r}") from None
    return out or None


def sampling_kwargs(args: argparse.Namespace) -> dict:
    """The GenerationConfig fields of add_sampling_args."""
    return dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                top_k=args.top_k, seed=args.seed, stop=tuple(args.stop), strict=args.strict or None,
                min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                logit_bias=_logit_bias(args.logit_bias))


def add_structured_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("structured output (docs/guide/structured.md)").add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="FILE", help="the output is JSON following this JSON schema (strict)")
    g.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    g.add_argument("--regex", help="the output matches this regular expression")
    g.add_argument("--grammar", metavar="FILE", help="the output follows this Lark grammar")
    p.add_argument("--no-forced-drafts", action="store_true",
                   help="under a grammar, do not propose the tokens it forces as drafts")


def structured_kwargs(args: argparse.Namespace) -> dict:
    """The GenerationConfig fields of add_structured_args (files read here)."""
    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError as e:
            raise AdaspecError(f"cannot read {path}: {e.strerror}") from None

    return dict(json_schema=read(args.json_schema) if args.json_schema else None,
                response_format="json_object" if args.json_object else None, regex=args.regex,
                grammar=read(args.grammar) if args.grammar else None, forced_drafts=not args.no_forced_drafts)


def add_catch_up_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-catch-up", type=_catch_up, default=DEFAULT_DRAFT_CATCH_UP, metavar="N",
                   help="a draft model feeds at most N tokens at once to catch up with the sequence; lagging further, "
                        f"it restarts from the last N (0 = always the whole sequence) (default: "
                        f"{DEFAULT_DRAFT_CATCH_UP or 0})")


def _catch_up(text: str) -> int | None:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens, got {text!r}") from None
    if n != 0 and n < 2:
        raise argparse.ArgumentTypeError(f"0 (no bound) or at least 2 tokens, got {n}")
    return n or None


def add_strict_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="strict mode: a batch-invariant target, so greedy output equals plain (strict) decoding "
                        "token for token and a repeated request gives the same text (costs a wider forward per "
                        "plain step)")
