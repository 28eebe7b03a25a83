"""``adaspec compare``: several decoding methods on the same prompts, interleaved, resumable, summarised.

* :mod:`.methods`: method strings (``plain``, ``ngram/fixed:4``, ``hybrid/goodput+strict``, peers such as
  ``hf:pld``), the presets and their parser;
* :mod:`.run`: the run loop, every method on the same target, prompt by prompt, rotated per prompt;
* :mod:`.peer_runners`: transformers peers on adaspec's own models, other engines in their own processes;
* :mod:`.results`: the resumable results file (one JSON line per row);
* :mod:`.summary`: tokens/s, speedup, α, τ, identity to plain and the time split per (category, temperature); the
  oracle (best fixed K in hindsight) and the target check (the default method against the oracle, plain decoding
  and the best transformers peer, plus the Spec-Bench average);
* :mod:`.report`: the Markdown report.
"""

from adaspec.compare.methods import (CONTROLLER_METHODS, DEFAULT_METHOD, FIXED_KS, PEER_METHODS, PRESETS, SPECBENCH,
                                     STRUCTURED, Method, parse_method)
from adaspec.compare.report import markdown_report
from adaspec.compare.results import read_results, result_key
from adaspec.compare.run import run_compare, stopping
from adaspec.compare.summary import best_peer, oracle, step_table, summarize, target_check
from adaspec.spec_setting import reference_method

__all__ = ["CONTROLLER_METHODS", "DEFAULT_METHOD", "FIXED_KS", "Method", "PEER_METHODS", "PRESETS", "SPECBENCH",
           "STRUCTURED", "best_peer", "markdown_report", "oracle", "parse_method", "read_results",
           "reference_method", "result_key", "run_compare", "step_table", "stopping", "summarize", "target_check"]
