"""``adaspec compare``'s rows aggregated: per (category, temperature) and method, tokens/s, speedup over plain
decoding, α, τ, identity to plain and the time split; the oracle (the best fixed K in hindsight) and the target check.
"""

from __future__ import annotations

from collections import defaultdict

from adaspec.compare.methods import DEFAULT_METHOD, SPECBENCH
from adaspec.spec_setting import reference_method


def summarize(rows: list[dict]) -> dict[tuple[str, float], dict[str, dict]]:
    """Aggregate rows per (category, temperature) and method into tokens/s, speedup, α, τ, identity and time split.

    tokens/s is decoding throughput (Σ decode_tokens / Σ decode_ms) when the rows time decoding apart from prefills
    (see :func:`_run_engine`), end to end (Σ new tokens / Σ total time) for older rows. Only prompts that every
    method of the group has finished are counted, so partial results compare like with like. Values a method does
    not report (a transformers peer's α, τ and time split) are None. Rows of peers that did not answer (``error``)
    are left out (:mod:`adaspec.peers.report` lists them).
    """
    groups: dict[tuple[str, float], list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("error"):
            continue
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
            decode = all(r.get("decode_ms") is not None for r in rs)
            decode_ms = sum(r["decode_ms"] for r in rs) if decode else 0.0
            tokens_per_s = (sum(r["decode_tokens"] for r in rs) / (decode_ms / 1e3) if decode and decode_ms > 0
                            else sum(r["new_tokens"] for r in rs) / (total_ms / 1e3))
            counted = all(r.get("draft_tokens") is not None for r in rs)
            stepped = counted and all(r.get("speculation_steps") is not None for r in rs)  # peers count no steps
            drafted = sum(r["draft_tokens"] for r in rs) if counted else 0
            spec_steps = sum(r["speculation_steps"] for r in rs) if stepped else 0
            accepted = sum(r["accepted_tokens"] for r in rs) if counted else 0
            ref = reference_method(m)
            same = [ms[m]["token_ids"] == ms[ref]["token_ids"] for ms in complete.values() if ref in ms]
            stats[m] = {
                "prompts": len(rs),
                "tokens_per_s": tokens_per_s,
                "decode": decode,
                "alpha": (accepted / drafted if drafted else 0.0) if counted else None,
                "tau": ((accepted + spec_steps) / spec_steps if spec_steps else 0.0) if stepped else None,
                "identical": sum(same) / len(same) if same else float("nan"),
                **{f"{part}_share": (sum(r[f"{part}_ms"] for r in rs) / total_ms
                                     if all(r.get(f"{part}_ms") is not None for r in rs) else None)
                   for part in ("prefill", "draft", "verify", "other")},
            }
        if "plain" in stats:
            for s in stats.values():
                s["speedup"] = s["tokens_per_s"] / stats["plain"]["tokens_per_s"]
        table[key] = stats
    return table


def step_table(rows: list[dict]) -> dict[tuple[str, float], dict[int, dict[str, dict]]]:
    """Per (category, temperature) of session workloads (rows with a ``step``: :attr:`Prompt.step
    <adaspec.workloads.Prompt.step>`), per step index and method: ``speedup`` (decode tokens/s over plain's on the
    same prompts of that step), ``alpha`` and ``identical`` (to plain, the fraction of prompts). How fast a cache of
    earlier answers (the suffix drafter's) warms up along a session."""
    out: dict[tuple[str, float], dict[int, dict[str, dict]]] = {}
    for (category, temp), _ in summarize([r for r in rows if r.get("step") is not None]).items():
        group = [r for r in rows if r.get("step") is not None and r["category"] == category
                 and r["temperature"] == temp]
        for step in sorted({r["step"] for r in group}):
            at = [dict(r, category=f"{category}#{step}") for r in group if r["step"] == step]
            stats = next(iter(summarize(at).values()), {})
            out.setdefault((category, temp), {})[step] = {
                m: {"speedup": v.get("speedup"), "alpha": v["alpha"], "identical": v["identical"]}
                for m, v in stats.items()}
    return out


def oracle(stats: dict[str, dict]) -> str | None:
    """The best fixed K > 0 (default drafter) of one group, in hindsight: its method label, or None."""
    fixed = [m for m in stats if m.startswith("fixed:") and m[6:].isdigit() and int(m[6:]) > 0]
    return max(fixed, key=lambda m: stats[m]["tokens_per_s"]) if fixed else None


def best_peer(stats: dict[str, dict], *, lookup: bool = False) -> str | None:
    """The fastest transformers assisted-generation peer of a group (``lookup``: prompt lookup instead)."""
    peers = [m for m in stats if m.startswith("hf:") and (m.startswith("hf:pld") == lookup)]
    return max(peers, key=lambda m: stats[m]["tokens_per_s"]) if peers else None


def target_check(rows: list[dict], default_method: str = DEFAULT_METHOD) -> list[dict]:
    """Per (category, temperature), and for the Spec-Bench average, the default method's ratios to the oracle,
    to plain decoding and to the best transformers assisted-generation peer (None where a method is missing)."""
    table = summarize(rows)
    specbench = {r["category"] for r in rows if str(r.get("workload", "")).startswith(SPECBENCH)}
    out = []

    def ratio(a, b):
        return a / b if a is not None and b else None

    def tps(stats, m):
        return stats[m]["tokens_per_s"] if m in stats else None

    for (category, temp), stats in table.items():
        o, hf = oracle(stats), best_peer(stats)
        d = tps(stats, default_method)
        out.append({"category": category, "temperature": temp, "prompts": stats.get("plain", {}).get("prompts"),
                    "plain": tps(stats, "plain"), "oracle": o, "oracle_tps": tps(stats, o),
                    "default": d, "vs_oracle": ratio(d, tps(stats, o)), "vs_plain": ratio(d, tps(stats, "plain")),
                    "hf": hf, "hf_tps": tps(stats, hf), "vs_hf": ratio(d, tps(stats, hf)),
                    "identical": stats[default_method]["identical"] if default_method in stats else None})
    for temp in sorted({t for _, t in table}):
        cats = [c for c, t in table if t == temp and c in specbench]
        if not cats:
            continue
        groups = [table[(c, temp)] for c in cats]

        def mean_speedup(pick):
            values = [g[m]["speedup"] for g in groups if (m := pick(g)) and "speedup" in g.get(m, {})]
            return sum(values) / len(values) if len(values) == len(groups) else None

        d = mean_speedup(lambda g: default_method)
        o = mean_speedup(oracle)
        hf = mean_speedup(best_peer)
        out.append({"category": f"Spec-Bench average ({len(cats)} categories, mean speedup)", "temperature": temp,
                    "prompts": None, "plain": 1.0, "oracle": "per category", "oracle_tps": o, "default": d,
                    "vs_oracle": ratio(d, o), "vs_plain": d, "hf": "best per category", "hf_tps": hf,
                    "vs_hf": ratio(d, hf), "identical": None})
    return out
