"""OpenVINO GenAI (``openvino:plain|draft[:K]|lookup[:K]``) as a peer worker, run by the OpenVINO environment's
Python (``ADASPEC_OPENVINO_PYTHON``).

``LLMPipeline(target_ir, "CPU", INFERENCE_NUM_THREADS=threads)``; ``draft``: ``draft_model=draft_model(draft_ir,
"CPU")`` with ``num_assistant_tokens = K``; ``lookup``: ``prompt_lookup=True`` with ``num_assistant_tokens = K``
and ``max_ngram_size`` 3. The prompt goes in as token ids (``TokenizedInputs``), greedy, stopping at the
comparison's stop tokens. Timing from the pipeline's own ``perf_metrics``: ``decode_ms`` = generate duration − TTFT,
``decode_tokens`` = tokens − 1. Load request: ``target``, ``draft`` (IR folders), ``kind``, ``k``, ``threads``,
``eos_token_ids``.
"""

import time

from adaspec_worker_loop import serve

state = {}
MAX_NGRAM = 3


def load(req):
    import openvino_genai as ov_genai

    kind = req["kind"]
    kwargs = {"INFERENCE_NUM_THREADS": req["threads"]}
    if kind == "draft":
        kwargs["draft_model"] = ov_genai.draft_model(req["draft"], "CPU", INFERENCE_NUM_THREADS=req["threads"])
    elif kind == "lookup":
        kwargs["prompt_lookup"] = True
    state.update(pipe=ov_genai.LLMPipeline(req["target"], "CPU", **kwargs), kind=kind, k=req.get("k"),
                 eos=list(req.get("eos_token_ids") or ()))
    return {"engine": f"openvino-genai {getattr(ov_genai, '__version__', '?')}"}


def generate(req):
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    cfg = ov_genai.GenerationConfig()
    cfg.max_new_tokens = req["max_new_tokens"]
    if req.get("temperature", 0.0) > 0:
        cfg.do_sample, cfg.temperature, cfg.top_k, cfg.top_p = True, req["temperature"], 0, 1.0
        cfg.rng_seed = req.get("seed", 0)
    else:
        cfg.do_sample = False
    if state["eos"]:
        cfg.stop_token_ids = set(state["eos"])
    if state["kind"] in ("draft", "lookup"):
        cfg.num_assistant_tokens = state["k"]
    if state["kind"] == "lookup":
        cfg.max_ngram_size = MAX_NGRAM
    ids = np.array([req["ids"]], dtype=np.int64)
    inputs = ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
    start = time.perf_counter()
    result = state["pipe"].generate(inputs, cfg)
    total_ms = (time.perf_counter() - start) * 1e3
    tokens = [int(t) for t in result.tokens[0]]
    metrics = result.perf_metrics
    ttft, duration = metrics.get_ttft().mean, metrics.get_generate_duration().mean
    return {"token_ids": tokens, "finish_reason": "stop" if tokens and tokens[-1] in state["eos"] else "length",
            "total_ms": total_ms, "decode_ms": duration - ttft, "decode_tokens": max(len(tokens) - 1, 0),
            "prefill_ms": ttft, "timing_source": "OpenVINO perf_metrics: generate duration - TTFT",
            **draft_counts(result)}


def draft_counts(result):
    """Drafted and accepted tokens from a speculative pipeline's extended metrics (``SDPerModelsPerfMetrics``);
    nothing for a pipeline without them."""
    extended = getattr(result, "extended_perf_metrics", None)
    try:
        return {"draft_tokens": int(extended.get_num_draft_tokens()),
                "accepted_tokens": int(extended.get_num_accepted_tokens())}
    except (AttributeError, TypeError, RuntimeError):
        return {}


if __name__ == "__main__":
    serve(load, generate)
