"""``adaspec compare``: several decoding methods on the same prompts, interleaved, resumable, summarised.

Every method runs on the same target in the same process, prompt by prompt, with the method order rotated per
prompt so machine drift affects all methods alike. One JSON line per (workload, prompt, method, temperature) is
appended to the results file as soon as it finishes; a rerun skips the lines already there, so a killed run
continues where it stopped. The Markdown summary reports, per workload category and temperature: tokens/s (total
new tokens / total wall time), speedup vs plain decoding, α, τ, the fraction of outputs identical to plain decoding,
and where the time went.

Method syntax: ``plain`` | ``fixed:K`` | ``adaptive`` | ``heuristic`` (with the default drafter), or
``DRAFTER/CONTROLLER[:K]`` with any drafter spec of :func:`adaspec.api.make_drafter`, e.g. ``ngram/fixed:4``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from adaspec.controllers import CONTROLLERS, make_controller
from adaspec.engine import GenerationConfig, SpeculativeEngine
from adaspec.errors import ConfigError


@dataclass(frozen=True)
class Method:
    """A decoding method: drafter spec (None = plain), controller name and K (fixed K or initial K)."""

    label: str
    drafter: str | None
    controller: str
    k: int | None


def parse_method(text: str, default_draft: str) -> Method:
    """Parse a method string (see module docstring). Raises ConfigError on a malformed one."""
    if text == "plain":
        return Method("plain", None, "fixed", 0)
    drafter, _, rest = text.rpartition("/")
    name, _, k = rest.partition(":")
    if name not in CONTROLLERS:
        raise ConfigError(f"bad method {text!r}: controller must be one of {', '.join(CONTROLLERS)}")
    try:
        k_value = int(k) if k else None
    except ValueError:
        raise ConfigError(f"bad method {text!r}: K must be an integer") from None
    if name == "fixed" and k_value is None:
        raise ConfigError(f"bad method {text!r}: use fixed:K")
    make_controller(name, k_value)  # validates K
    return Method(text, drafter or default_draft, name, k_value)


def result_key(row: dict) -> tuple:
    return row["workload"], row["prompt_id"], row["method"], row["temperature"]


def read_results(path: Path) -> list[dict]:
    """Rows of a results file; a truncated last line (killed mid-write) is ignored."""
    if not path.exists():
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def run_compare(*, target: str, draft: str, methods: list[str], workloads: list[str], limit: int | None,
                max_new_tokens: int, temperatures: list[float], out: Path, dtype: str = "bfloat16",
                threads: int | None = None, seed: int = 0, progress: bool = True) -> Path:
    """Run the comparison and append rows to ``out`` (JSONL); returns ``out``. See the module docstring."""
    from tqdm import tqdm

    from adaspec.api import SpeculativeLM, load_model, make_drafter, set_threads
    from adaspec.workloads import load_workload

    parsed = [parse_method(m, draft) for m in methods]
    if not any(m.label == "plain" for m in parsed):
        parsed.insert(0, Method("plain", None, "fixed", 0))
    prompts = [(w, p) for w in workloads for p in load_workload(w, limit)]
    set_threads(threads)
    done = {result_key(r) for r in read_results(out)}
    todo = [(w, p, t) for w, p in prompts for t in temperatures
            if any((w, p.id, m.label, t) not in done for m in parsed)]
    if not todo:
        return out

    tgt = load_model(target, dtype=dtype, progress=progress)
    drafters = {spec: make_drafter(spec, tgt, dtype=dtype, progress=progress)
                for spec in {m.drafter for m in parsed if m.drafter}}
    lm = SpeculativeLM(tgt, None, make_controller("fixed", 0))

    def engine(m: Method) -> SpeculativeEngine:
        drafter = drafters[m.drafter] if m.drafter else None
        return SpeculativeEngine(tgt.backend, drafter, make_controller(m.controller, m.k), tokenizer=tgt.tokenizer)

    engines = {m.label: engine(m) for m in parsed}
    for e in engines.values():
        e.warmup()
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(todo) * len(parsed), desc="compare", unit="run", disable=not progress)
    with open(out, "a", encoding="utf-8") as f:
        for i, (workload, prompt, temp) in enumerate(todo):
            ids = lm.encode(prompt.text)
            order = parsed[i % len(parsed):] + parsed[:i % len(parsed)]
            for m in order:
                bar.update(1)
                if (workload, prompt.id, m.label, temp) in done:
                    continue
                cfg = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temp, seed=seed)
                r = engines[m.label].generate(ids, cfg)
                row = {"workload": workload, "category": prompt.category, "prompt_id": prompt.id,
                       "method": m.label, "temperature": temp, "target": tgt.name, "drafter": m.drafter,
                       "controller": m.controller, "k": m.k, "dtype": dtype, "threads": threads,
                       "finish_reason": r.finish_reason, "token_ids": r.token_ids, **r.stats.summary()}
                f.write(json.dumps(row) + "\n")
                f.flush()
    bar.close()
    return out


def summarize(rows: list[dict]) -> dict[tuple[str, float], dict[str, dict]]:
    """Aggregate rows per (category, temperature) and method into tokens/s, speedup, α, τ, identity and time split.

    Only prompts that every method of the group has finished are counted, so partial results compare like with
    like.
    """
    groups: dict[tuple[str, float], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["category"], r["temperature"])].append(r)
    table: dict[tuple[str, float], dict[str, dict]] = {}
    for key, group in sorted(groups.items()):
        methods = sorted({r["method"] for r in group})
        by_prompt: dict[str, dict[str, dict]] = defaultdict(dict)
        for r in group:
            by_prompt[r["prompt_id"]][r["method"]] = r
        complete = {p: ms for p, ms in by_prompt.items() if len(ms) == len(methods)}
        stats: dict[str, dict] = {}
        for m in methods:
            rs = [ms[m] for ms in complete.values()]
            if not rs:
                continue
            total_ms = sum(r["total_ms"] for r in rs)
            drafted = sum(r["draft_tokens"] for r in rs)
            spec_steps = sum(r["speculation_steps"] for r in rs)
            accepted = sum(r["accepted_tokens"] for r in rs)
            same = [ms[m]["token_ids"] == ms["plain"]["token_ids"] for ms in complete.values() if "plain" in ms]
            stats[m] = {
                "prompts": len(rs),
                "tokens_per_s": sum(r["new_tokens"] for r in rs) / (total_ms / 1e3),
                "alpha": accepted / drafted if drafted else 0.0,
                "tau": (accepted + spec_steps) / spec_steps if spec_steps else 0.0,
                "identical": sum(same) / len(same) if same else float("nan"),
                **{f"{part}_share": sum(r[f"{part}_ms"] for r in rs) / total_ms
                   for part in ("prefill", "draft", "verify", "other")},
            }
        if "plain" in stats:
            for s in stats.values():
                s["speedup"] = s["tokens_per_s"] / stats["plain"]["tokens_per_s"]
        table[key] = stats
    return table


def markdown_report(rows: list[dict]) -> str:
    """The summary as Markdown tables, one per (category, temperature)."""
    lines = []
    for (category, temp), stats in summarize(rows).items():
        n = max((s["prompts"] for s in stats.values()), default=0)
        lines += [f"### {category}, temperature {temp:g} ({n} prompts)", "",
                  "| method | tokens/s | speedup | α | τ | identical to plain | time: prefill / draft / verify / other |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        for m, s in sorted(stats.items(), key=lambda kv: -kv[1]["tokens_per_s"]):
            split = " / ".join(f"{100 * s[f'{p}_share']:.0f}%" for p in ("prefill", "draft", "verify", "other"))
            ident = "n/a" if s["identical"] != s["identical"] or temp > 0 else f"{100 * s['identical']:.0f}%"
            lines.append(f"| {m} | {s['tokens_per_s']:.2f} | {s.get('speedup', float('nan')):.2f}x | "
                         f"{s['alpha']:.3f} | {s['tau']:.2f} | {ident} | {split} |")
        lines.append("")
    return "\n".join(lines)
