"""Command line: ``adaspec generate``, ``adaspec models``.

Errors that adaspec raises on purpose (:class:`~adaspec.errors.AdaspecError`) are printed as one line naming the
problem, with exit code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from adaspec.defaults import BACKEND_CHOICES, DEFAULT_CONTROLLER, DEFAULT_DRAFTER, DEVICE_CHOICES
from adaspec.errors import AdaspecError, ConfigError
from adaspec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from adaspec.models.cli import add_models_parser

MAP_TITLE = "Where speculative decoding pays on this machine"


def _add_model_args(p: argparse.ArgumentParser, draft_default: str = DEFAULT_DRAFTER) -> None:
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
    _add_runtime_args(p)


def _add_runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="auto", choices=BACKEND_CHOICES,
                   help="where models run: auto = the fastest path measured on this machine (a GGUF runtime on a "
                        "CPU, PyTorch on CUDA), torch, llamacpp or ik (ik_llama.cpp) (default: %(default)s)")
    p.add_argument("--device", default="auto", choices=DEVICE_CHOICES,
                   help="auto = CUDA when PyTorch sees a GPU, else the CPU (default: %(default)s)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                   help="PyTorch dtype (default bfloat16); giving one makes --backend auto choose PyTorch")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for PyTorch and the GGUF runtimes (default: all cores)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
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
    _add_strict_arg(p)


def _logit_bias(items: list[str]) -> dict[int, float] | None:
    out = {}
    for item in items:
        token, _, bias = item.partition(":")
        try:
            out[int(token)] = float(bias)
        except ValueError:
            raise AdaspecError(f"--logit-bias expects ID:BIAS (e.g. 42:-100), got {item!r}") from None
    return out or None


def _sampling_kwargs(args: argparse.Namespace) -> dict:
    """The GenerationConfig fields of _add_sampling_args."""
    return dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                top_k=args.top_k, seed=args.seed, stop=tuple(args.stop), strict=args.strict or None,
                min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                logit_bias=_logit_bias(args.logit_bias))


def _add_structured_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("structured output (docs/guide/structured.md)").add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="FILE", help="the output is JSON following this JSON schema (strict)")
    g.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    g.add_argument("--regex", help="the output matches this regular expression")
    g.add_argument("--grammar", metavar="FILE", help="the output follows this Lark grammar")
    p.add_argument("--no-forced-drafts", action="store_true",
                   help="under a grammar, do not propose the tokens it forces as drafts")


def _structured_kwargs(args: argparse.Namespace) -> dict:
    """The GenerationConfig fields of _add_structured_args (files read here)."""
    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError as e:
            raise AdaspecError(f"cannot read {path}: {e.strerror}") from None

    return dict(json_schema=read(args.json_schema) if args.json_schema else None,
                response_format="json_object" if args.json_object else None, regex=args.regex,
                grammar=read(args.grammar) if args.grammar else None, forced_drafts=not args.no_forced_drafts)


def _add_strict_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="strict mode: a batch-invariant target, so greedy output equals plain (strict) decoding "
                        "token for token and a repeated request gives the same text (costs a wider forward per "
                        "plain step)")


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
    _add_structured_args(gen)
    gen.set_defaults(func=cmd_generate)

    cmp = sub.add_parser("compare", help="compare decoding methods on workloads (interleaved, resumable)")
    _add_model_args(cmp, DEFAULT_DRAFT)  # the draft model of DRAFTER-less methods (fixed:K, goodput, hf:...)
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
                          "(default: plain,hybrid/goodput,goodput,fixed:2,fixed:4)")
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
    _add_strict_arg(cmp)
    cmp.add_argument("--default-method", default=None,
                     help="the method the target check is about (default: adaspec's default configuration)")
    cmp.set_defaults(func=cmd_compare)

    ev = sub.add_parser("eval", help="task accuracy of plain vs speculative (and strict, lossy) decoding: HumanEval "
                                     "pass@1, GSM8K; paired tests, identity, divergence margins")
    _add_model_args(ev, DEFAULT_DRAFT)
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

    srv = sub.add_parser("serve", help="OpenAI-compatible HTTP server with speculative-decoding metrics")
    _add_model_args(srv)
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
    _add_strict_arg(srv)
    srv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    srv.set_defaults(func=cmd_serve)

    _add_bench_parsers(sub)
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
    config = GenerationConfig(**_sampling_kwargs(args), logprobs=args.logprobs, tree_budget=args.tree_budget,
                              tree_choice=args.tree_choice, tree_expand=args.tree_expand, **_structured_kwargs(args))
    lm = load(args.target, args.draft, controller=args.controller, k=args.k, backend=args.backend,
              device=args.device, dtype=args.dtype, threads=args.threads)
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


def cmd_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from adaspec.compare import DEFAULT_METHOD, PRESETS, markdown_report, read_results, run_compare

    preset = PRESETS.get(args.preset, {})

    def pick(value, key, legacy):
        return value.split(",") if isinstance(value, str) else value if value is not None else preset.get(key, legacy)

    out = run_compare(target=args.target, draft=args.draft,
                      methods=pick(args.methods, "methods",
                                   ["plain", "hybrid/goodput", "goodput", "fixed:2", "fixed:4"]),
                      workloads=pick(args.workloads, "workloads", ["humaneval"]),
                      limit=pick(args.limit, "limit", 10),
                      max_new_tokens=pick(args.max_new_tokens, "max_new_tokens", 128),
                      temperatures=[float(t) for t in pick(args.temperatures, "temperatures", [0.0])],
                      out=Path(args.out), dtype=args.dtype, threads=args.threads, seed=args.seed,
                      backend=args.backend, device=args.device,
                      time_limit_s=args.time_limit * 60 if args.time_limit else None, prompt_cache=args.prompt_cache,
                      strict=args.strict)
    report = markdown_report(read_results(out), args.default_method or DEFAULT_METHOD)
    print(report)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(report, encoding="utf-8")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

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


def cmd_serve(args: argparse.Namespace) -> int:
    from adaspec.server.main import serve

    return serve(args)


def _add_bench_parsers(sub) -> None:
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
                    help="a workload name (humaneval, gsm8k, specbench[:<category>], code-edit, ...) or a JSONL of "
                         "prompts (default: %(default)s)")
    ep.add_argument("--prompts", type=int, default=8, help="prompts taken from the workload (default: %(default)s)")
    ep.add_argument("--max-tokens", type=int, default=128)
    ep.add_argument("--temperature", type=float, default=0.0)
    ep.add_argument("--concurrency", default=None,
                    help="closed-loop client counts, comma-separated (default: 1 unless --rate is given)")
    ep.add_argument("--rate", default=None, help="open-loop Poisson arrival rates in requests/s, comma-separated")
    ep.add_argument("--requests", type=int, default=None,
                    help="requests per configuration (default: the prompt count, at least 2 per client)")
    ep.add_argument("--rounds", type=int, default=1, help="repeat every configuration (arms alternate)")
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
    _add_runtime_args(prof)
    prof.add_argument("--seed", type=int, default=0)
    prof.add_argument("--json", action="store_true", help="print one JSON object")
    pe = prof.add_argument_group("a serving endpoint instead of adaspec's engine")
    pe.add_argument("--endpoint", default=None, metavar="URL", help="measure this OpenAI-compatible server")
    pe.add_argument("--baseline", default=None, metavar="URL", help="the same model without speculation")
    pe.add_argument("--baseline-body", default=None, metavar="JSON",
                    help="request fields that turn speculation off on --endpoint itself (adaspec serve: "
                         "'{\"speculation\": {\"drafter\": \"none\"}}')")
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
    from pathlib import Path

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
                         slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms)
    out = Path(args.out or "results/endpoint.jsonl")
    argv = ["adaspec", "bench"]
    for flag in ("endpoint", "baseline", "body", "baseline_body", "model", "api", "workload", "prompts", "max_tokens",
                 "temperature", "concurrency", "rate", "requests", "rounds", "slo_ttft_ms", "slo_tpot_ms", "out"):
        value = getattr(args, flag)
        if value is not None and not (flag == "body" and value == "{}"):
            argv += [f"--{flag.replace('_', '-')}", f"'{value}'" if flag.endswith("body") else str(value)]
    result = run_endpoint_bench(cfg, out, log=lambda msg: print(msg, file=sys.stderr),
                                time_limit_s=args.time_limit * 60 if args.time_limit else None, argv=argv)
    print(f"{result['run']} configurations measured, {result['done']} already in {out}"
          + (", stopped at the time limit (rerun to continue)" if result["stopped"] else "")
          + f". Next: adaspec map {out} --report results/endpoint.md")
    return 0


def cmd_advise(args: argparse.Namespace) -> int:
    from pathlib import Path

    from adaspec.bench.advise import advise_files, format_advice

    out = advise_files([Path(p) for p in args.results], args.engine, method=args.method, draft=args.draft_model,
                       model=args.model, max_k=args.max_k)
    print(json.dumps(out, indent=2) if args.json else format_advice(args.engine, out, out["config"]))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from adaspec.bench.grid import build_config, expand
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
    from pathlib import Path

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
        from pathlib import Path

        from adaspec.bench.endpoint import EndpointConfig, read_rows, run_endpoint_bench
        from adaspec.bench.advise import format_profile, profile_endpoint

        if not args.baseline and args.baseline_body is None:
            raise ConfigError("profile --endpoint needs a baseline: --baseline URL or --baseline-body JSON")
        cfg = EndpointConfig(url=args.endpoint, baseline=args.baseline,
                             baseline_body=_json_object(args.baseline_body, "--baseline-body"),
                             workload=args.workload, prompts=args.sample,
                             max_tokens=args.confirm_tokens or args.max_new_tokens,
                             temperature=args.temperature, seed=args.seed, requests=args.sample)
        out = Path(args.out)
        key = run_endpoint_bench(cfg, out, log=lambda msg: print(msg, file=sys.stderr))["key"]
        rows = [r for r in read_rows([out]) if r.get("run") == key]
        p = profile_endpoint(rows)
        print(json.dumps(p, indent=2) if args.json else format_profile(p, out))
        return 0

    advice = profile_workload(args.workload, target=args.target, drafts=args.drafts.split(","),
                              sample=args.sample, max_new_tokens=args.max_new_tokens,
                              temperature=args.temperature, dtype=args.dtype, threads=args.threads, seed=args.seed,
                              backend=args.backend, device=args.device, confirm_tokens=args.confirm_tokens)
    print(json.dumps(advice, indent=2) if args.json else format_advice(advice))
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


def _compress(trace: list[int]) -> str:
    from adaspec.stats import compress_trace

    return compress_trace(trace, limit=80)


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
