"""The peer sections of compare's Markdown report: peers that did not answer (with their log tails) and greedy
answers that differ from adaspec's plain decoding (with the position of the first difference)."""

from __future__ import annotations

from adaspec.peers.base import first_difference

SNIPPET = 40  # characters of each text shown around a first difference


def failed_rows(rows: list[dict]) -> list[dict]:
    """Rows of peers that did not answer, less those a later run of the same (workload, prompt, method,
    temperature) answered."""
    answered = {_key(r) for r in rows if not r.get("error")}
    return [r for r in rows if r.get("error") and _key(r) not in answered]


def _key(r: dict) -> tuple:
    return r["workload"], r["prompt_id"], r["method"], r["temperature"]


def failure_lines(rows: list[dict]) -> list[str]:
    """A table of the peers that did not answer, per method: status, the first error, how many prompts; then each
    method's log tail."""
    failed = failed_rows(rows)
    if not failed:
        return []
    by_method: dict[str, list[dict]] = {}
    for r in failed:
        by_method.setdefault(r["method"], []).append(r)
    lines = ["## Peers that did not answer", "", "Left out of every table above; rerun the comparison to retry them.",
             "", "| method | status | prompts | error |", "|---|---|---:|---|"]
    for method, rs in by_method.items():
        error = rs[-1]["error"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {method} | {rs[-1].get('peer_status', 'failed')} | {len(rs)} | {error} |")
    lines.append("")
    for method, rs in by_method.items():
        tail = rs[-1].get("log_tail")
        if tail:
            lines += [f"Log tail of `{method}`:", "", "```", tail, "```", ""]
    return lines


def difference_lines(rows: list[dict]) -> list[str]:
    """Greedy peer answers that differ from ``plain`` on the same prompt: the first differing token's index and
    both texts from a little before it."""
    plain = {(r["workload"], r["prompt_id"]): r for r in rows
             if r["method"] == "plain" and r["temperature"] == 0 and r.get("token_ids") is not None}
    lines = []
    for r in rows:
        if not r.get("peer") or r.get("error") or r["temperature"] != 0 or r.get("token_ids") is None:
            continue
        ref = plain.get((r["workload"], r["prompt_id"]))
        if ref is None:
            continue
        at = first_difference(r["token_ids"], ref["token_ids"])
        if at is None:
            continue
        where = f"token {at}"
        if r.get("text") is not None and ref.get("text") is not None:
            c = first_difference(r["text"], ref["text"])
            if c is not None:
                where += (f", character {c}: peer `{_snip(r['text'], c)}` / plain `{_snip(ref['text'], c)}`")
        lines.append(f"| {r['method']} | {r['prompt_id']} | {where} |")
    if not lines:
        return []
    return ["## Greedy peer answers that differ from adaspec's plain decoding", "",
            "(First difference, token index from 0; the texts from a little before it.)", "",
            "| method | prompt | first difference |", "|---|---|---|", *lines, ""]


def _snip(text: str, at: int) -> str:
    part = text[max(0, at - 10):at + SNIPPET - 10]
    return part.replace("\n", "⏎").replace("|", "\\|").replace("`", "'")


def info_lines(rows: list[dict]) -> list[str]:
    """Per out-of-process peer that answered: its weights and where its decode timing comes from."""
    seen: dict[str, dict] = {}
    for r in rows:
        if r.get("peer") and not r.get("error") and r.get("timing_source"):
            seen[r["method"]] = r
    if not seen:
        return []
    lines = ["## Peers: weights and timing", "", "| method | weights | decode timing from | note |",
             "|---|---|---|---|"]
    for method, r in seen.items():
        lines.append(f"| {method} | {r.get('weights') or '—'} | {r['timing_source']} | {r.get('peer_note') or ''} |")
    return lines + [""]


def peer_lines(rows: list[dict]) -> list[str]:
    """Every peer section of the report (empty without peers)."""
    return info_lines(rows) + difference_lines(rows) + failure_lines(rows)


def failed_in(rows: list[dict], category: str, temperature: float) -> dict[str, str]:
    """``{method: status}`` of the peers that did not answer on any prompt of one category and temperature."""
    return {r["method"]: r.get("peer_status", "failed") for r in failed_rows(rows)
            if r["category"] == category and r["temperature"] == temperature}
