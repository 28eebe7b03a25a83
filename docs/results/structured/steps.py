"""Where the time of structured speculation goes: every step of two goodput controllers, per class of step.

    python docs/results/structured/steps.py --limit 18 --out steps.jsonl   # then: --summary steps.jsonl

Two engines share the default drafter (each with its own partition of the suffix cache) and take turns leading each
task of the structured workload: ``priced`` (today's controller: K priced behind the grammar's forced tokens,
acceptance behind them counted apart) and ``unpriced`` (``GoodputConfig(price_forced=False)``: K planned and
steps booked as if nothing were forced; the lookups are routed after the forced tokens in both). One JSON line per request holds its steps: ``f`` (forced tokens told to the controller before
the step), the wrapped drafter's ``drafted``/``acc``, ``v``/``d``/``t`` (verify, draft and step ms), ``emitted``
and ``drafter``. ``--summary`` prints, per controller, category and class of step (forced or free, with or without
a draft of the wrapped drafter), and per drafter and draft length on the free steps, steps, ms per step and tokens
per second of step time (prefill and time between steps left out).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys


def run(limit: int, out: str, threads: int) -> None:
    from adaspec.api import SpeculativeLM, load_model, make_drafter, set_threads
    from adaspec.controllers import GoodputController
    from adaspec.defaults import DEFAULT_DRAFTER
    from adaspec.engine import GenerationConfig, SpeculativeEngine
    from adaspec.structured_workload import load_tasks

    class Logged(GoodputController):
        def __init__(self, **overrides) -> None:
            super().__init__(**overrides)
            self.log: list[dict] = []
            self.told = 0

        def set_forced(self, n: int) -> None:
            super().set_forced(n)
            self.told = n

        def update(self, step) -> None:
            super().update(step)
            self.log.append(dict(f=self.told, drafted=step.drafted, acc=step.accepted, v=step.verify_ms,
                                 d=step.draft_ms, t=step.total_ms, emitted=step.emitted, drafter=step.drafter))

    set_threads(threads)
    target = load_model("qwen2.5-coder-1.5b-instruct", backend="ik")
    lm = SpeculativeLM(target, None, None)
    drafter = make_drafter(DEFAULT_DRAFTER, target, backend="ik")
    engines = {name: SpeculativeEngine(target.backend, drafter, Logged(**kw), tokenizer=target.tokenizer)
               for name, kw in (("priced", {}), ("unpriced", {"price_forced": False}))}
    for engine in engines.values():
        engine.warmup()
    with open(out, "a") as f:
        for i, task in enumerate(load_tasks(limit)):
            ids = lm.encode(list(task.messages), chat=True, tools=task.template_tools)
            for name in (("priced", "unpriced") if i % 2 == 0 else ("unpriced", "priced")):
                engine = engines[name]
                engine.controller.log = []
                r = engine.generate(ids, GenerationConfig(max_new_tokens=160, response_format=task.constraint,
                                                          cache_partition=name))
                f.write(json.dumps(dict(task=task.id, category=task.category, controller=name,
                                        new_tokens=r.stats.new_tokens, steps=engine.controller.log)) + "\n")
                f.flush()


def summary(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    by_class: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    by_drafter: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        for s in r["steps"]:
            kind = ("forced" if s["f"] else "free") + ("+draft" if s["drafted"] else "")
            for table, key in ((by_class, (r["controller"], r["category"], kind)),
                               (by_drafter, (r["controller"], r["category"], s["drafter"] or "plain", s["drafted"]))):
                if table is by_drafter and s["f"]:
                    continue
                c = table[key]
                c["steps"] += 1
                c["ms"] += s["t"]
                c["tokens"] += s["emitted"]
    for title, table in (("per class of step", by_class), ("free steps, per drafter and draft length", by_drafter)):
        print(f"## {title}\n\n| controller | category | class | steps | ms per step | tokens per step | tokens/s |")
        print("|---|---|---|---:|---:|---:|---:|")
        for key in sorted(table, key=str):
            c = table[key]
            print(f"| {' | '.join(map(str, key[:2]))} | {' '.join(map(str, key[2:]))} | {c['steps']} | "
                  f"{c['ms'] / c['steps']:.1f} | {c['tokens'] / c['steps']:.2f} | {c['tokens'] / c['ms'] * 1e3:.1f} |")
        print()
    for name in sorted({r["controller"] for r in rows}):
        ms = sum(s["t"] for r in rows if r["controller"] == name for s in r["steps"])
        tokens = sum(s["emitted"] for r in rows if r["controller"] == name for s in r["steps"])
        print(f"{name}: {tokens} tokens in {ms / 1e3:.1f} s of steps, {tokens / ms * 1e3:.1f} tokens/s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=18)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="append the steps of each request here")
    p.add_argument("--summary", help="print the tables of a steps file")
    args = p.parse_args(argv)
    if args.out:
        run(args.limit, args.out, args.threads)
    if args.summary:
        summary(args.summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
