"""Batched structured-output benchmark (issue 38): constrained requests decoded together by the batch engine.

The structured workload's tasks (adaspec.structured_workload; greedy) go through :class:`adaspec.batch.BatchEngine`
at batch sizes 1, 2 and 4 (``--batches``), every row under its own task's grammar (schema or forced tool call):

* ``plain``: constrained plain decoding, batched;
(prompts prefilled by chunks of ``--prefill-chunk`` tokens per step, as ``adaspec serve`` does):

* ``speculative``: the default drafter (``hybrid``: prompt lookup + the default draft model) per row, a goodput
  controller per row and the batch pricer (calibrated once per batch size), with the grammar's forced tokens
  drafted on top.

Per (method, batch size): throughput (new tokens of all tasks / wall time of the whole run, prefill included),
identity with constrained plain decoding at batch 1 (token for token; a GGUF runtime's batched kernels may flip a
near-tie, see docs/batching.md), schema validity, exact fields, α, and the grammar engine's time. One JSON line per
(method, batch) is appended to --out as it finishes; a rerun skips those already there. --report writes the
markdown table. Timing numbers mean something only on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

METHODS = ("plain", "speculative")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft", default="hybrid", help="drafter of the speculative method (default: hybrid)")
    p.add_argument("--backend", default="ik")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--limit", type=int, default=6, help="tasks (interleaved by category)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prefill-chunk", type=int, default=64, help="as adaspec serve's --prefill-chunk (default 64)")
    p.add_argument("--batches", default="1,2,4")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--out", default="docs/results/structured/batch.jsonl")
    p.add_argument("--report", default="docs/results/structured/batch.md")
    args = p.parse_args(argv)

    from adaspec.api import SpeculativeLM, load_model, make_drafter, set_threads
    from adaspec.batch import BatchEngine
    from adaspec.controllers import make_controller
    from adaspec.engine import GenerationConfig
    from adaspec.structured import GrammarVocab
    from adaspec.structured_workload import load_tasks, score

    methods = ["plain"] + [m for m in args.methods.split(",") if m and m != "plain"]  # plain first: the reference
    batches = sorted({int(b) for b in args.batches.split(",")})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()] if out.is_file() else []
    done = {(r["method"], r["batch"]) for r in rows}
    reference = next((r["token_ids"] for r in rows if r["method"] == "plain" and r["batch"] == 1), None)
    set_threads(args.threads)
    target = load_model(args.target, backend=args.backend, progress=True, max_sequences=max(batches))
    lm = SpeculativeLM(target, None, make_controller("fixed", 0))
    tasks = load_tasks(args.limit)
    prompts = [lm.encode(list(t.messages), chat=True, tools=t.template_tools) for t in tasks]
    configs = [GenerationConfig(max_new_tokens=args.max_new_tokens, response_format=t.constraint) for t in tasks]
    drafter = (make_drafter(args.draft, target, backend=args.backend, progress=True, max_sequences=max(batches))
               if "speculative" in methods else None)
    vocab = None
    with out.open("a") as f:
        for method in methods:
            for batch in batches:
                if (method, batch) in done:
                    continue
                spec = method == "speculative"
                engine = BatchEngine(target.backend, drafter.for_sequence if spec else None,
                                     (lambda: make_controller("goodput", None)) if spec else None,
                                     tokenizer=target.tokenizer, max_batch=batch, prefill_chunk=args.prefill_chunk)
                vocab = vocab or GrammarVocab.from_tokenizer(target.tokenizer, target.backend.vocab_size,
                                                             engine.eos_token_ids)
                engine.grammar_vocab = vocab  # one vocabulary (and grammar cache) per model
                if spec:
                    engine.calibrate()
                engine.generate(prompts[:1], [GenerationConfig(max_new_tokens=4, response_format=tasks[0].constraint)])
                t = time.perf_counter()
                results = engine.generate(prompts, configs)
                wall = time.perf_counter() - t
                ids = [r.token_ids for r in results]
                if method == "plain" and batch == 1:
                    reference = ids
                graded = [score(task, r.text, r.finish_reason) for task, r in zip(tasks, results)]
                new = sum(r.stats.new_tokens for r in results)
                drafted = sum(r.stats.draft_tokens for r in results)
                row = {"method": method, "batch": batch, "tasks": len(tasks), "runtime": args.backend,
                       "threads": args.threads, "max_new_tokens": args.max_new_tokens, "new_tokens": new,
                       "wall_s": round(wall, 3), "tokens_per_s": new / wall,
                       "identical": sum(a == b for a, b in zip(ids, reference)) if reference else None,
                       "valid": sum(g["valid"] for g in graded), "exact": statistics.mean(g["exact"] for g in graded),
                       "draft_tokens": drafted, "accepted_tokens": sum(r.stats.accepted_tokens for r in results),
                       "grammar_ms": round(sum(r.stats.grammar_ms for r in results), 3),
                       "finish_reasons": [r.finish_reason for r in results], "token_ids": ids}
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{method:12s} batch {batch}: {new} tokens in {wall:.1f} s = {new / wall:.2f} tok/s, "
                      f"valid {row['valid']}/{len(tasks)}, identical {row['identical']}/{len(tasks)}", file=sys.stderr)
    report(out, Path(args.report))
    return 0


def report(results: Path, path: Path) -> None:
    rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
    base = {r["batch"]: r["tokens_per_s"] for r in rows if r["method"] == "plain"}
    lines = ["| method | batch | tasks | tokens/s (all rows, prefill included) | vs plain batch 1 | vs plain same batch "
             "| identical to plain batch 1 | schema-valid | exact fields | α | grammar time / wall time |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (METHODS.index(r["method"]), r["batch"])):
        def ratio(x):
            return f"{r['tokens_per_s'] / x:.2f}x" if x else "–"
        alpha = f"{r['accepted_tokens'] / r['draft_tokens']:.2f}" if r["draft_tokens"] else "–"
        lines.append(f"| {r['method']} | {r['batch']} | {r['tasks']} | {r['tokens_per_s']:.2f} | {ratio(base.get(1))} "
                     f"| {ratio(base.get(r['batch']))} | {r['identical']}/{r['tasks']} | {r['valid']}/{r['tasks']} | "
                     f"{r['exact']:.2f} | {alpha} | {r['grammar_ms'] / 10 / r['wall_s']:.1f} % |")
    meta = rows[0] if rows else {}
    path.write_text(f"# Batched structured output ({meta.get('runtime')}, {meta.get('threads')} threads, at most "
                    f"{meta.get('max_new_tokens')} new tokens)\n\nWritten by docs/results/structured/batch.py from "
                    f"{results.name}.\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
