"""Advise again from a scale-out run's recorded derivation rows with today's rule, and check that advice against the
run's recorded held-out rows: what a rule change would have advised, measured by nothing new.

    .venv/bin/python docs/results/scaleout/readvise.py OUT.md RUN_DIR [RUN_DIR ...]

Per run and engine: the advice the run recorded (its own rule, at its commit) and today's
(:func:`adaspec.engines.choose.choose`), each checked with :func:`adaspec.engines.scaleout_report.heldout_check`.
A configuration the run never measured on its held-out prompts cannot be checked (``–``). Where the run measured
the advised and the best configuration again in fresh rounds (``confirm`` rows), the target is checked on that.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from adaspec.engines.choose import choose
from adaspec.engines.scaleout_report import TARGET_RATIO, heldout_check


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line.strip()]


def _cell(h: dict) -> str:
    if h["ratio"] is None:
        return "–"
    label = h["advised_label"].split("/", 1)[1]
    again = f", measured again {h['confirmed']:.3f}" if h["confirmed"] is not None else ""
    return f"{h['ratio']:.3f} ({label}{again})" + ("" if h["final"] >= TARGET_RATIO else " **not met**")


def as_run(advice_rows: list[dict]) -> dict | None:
    """The advice a run was measured with: its first advice row, or the first fallback (an engine that refused the
    advice). A run resumed at a later commit writes that commit's advice after it."""
    fallbacks = [a for a in advice_rows if a.get("fallback_from")]
    return fallbacks[0] if fallbacks else advice_rows[0] if advice_rows else None


def main(out: Path, runs: list[Path]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"# The advice re-derived from recorded runs (today's rule at `{commit}`)", "",
             "Command: `.venv/bin/python docs/results/scaleout/readvise.py " + " ".join([str(out)] + [str(r) for r in runs])
             + "`", "", "Per concurrency: advised ÷ best re-measured on the held-out prompts (the advised "
             "configuration there, `off` from where the advice is to serve without speculation).", "",
             "| run | engine | rule | advised | gain margins | off from | clients: advised ÷ best (held-out) |",
             "|---|---|---|---|---|---:|---|"]
    for run in runs:
        rows = _rows(run)
        scale = [r for r in rows if r.get("kind") == "scaleout"]
        for engine in sorted({r["engine"] for r in scale}):
            recorded = [a for a in rows if a.get("kind") == "advice" and a.get("engine") == engine]
            derive = [r for r in scale if r["engine"] == engine and r["phase"] == "derive"]
            held = [r for r in scale if r["engine"] == engine and r["phase"] in ("heldout", "confirm")]
            new = {k: v for k, v in choose(derive, engine).items() if k != "config"}
            new["engine"] = engine
            for rule, adv in (("recorded", as_run(recorded)), ("today", new)):
                if adv is None:
                    continue
                checks = heldout_check(held, adv)
                margins = ", ".join(f"{c}: {m:.2f}" for c, m in (adv.get("margins") or {}).items()) or "–"
                lines.append(f"| {run.name} | {engine} | {rule} | {adv['label']} | {margins} | "
                             f"{adv.get('off_from') or '–'} | "
                             + "; ".join(f"{h['concurrency']}: {_cell(h)}" for h in checks) + " |")
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
