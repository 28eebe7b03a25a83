"""llama-cpp-python's prompt lookup decoding (``llamacpp:pld[:N]``) as a peer worker, in its own process.

``Llama(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=N))`` (n-grams up to 2, llama-cpp-python's default)
on the target's GGUF; llama-cpp-python forces ``logits_all=True`` with a draft model. Timed here: ``decode_ms`` from
the first generated token to the last (after its own prefill), ``decode_tokens`` the tokens after the first.
Load request: ``gguf``, ``k``, ``threads``, ``n_ctx``, ``eos_token_ids``.
"""

import time

from adaspec_worker_loop import serve

state = {}


def load(req):
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    state["eos"] = set(req.get("eos_token_ids") or ())
    state["llm"] = llama_cpp.Llama(model_path=req["gguf"], n_ctx=req.get("n_ctx", 4096), n_threads=req["threads"],
                                   n_threads_batch=req["threads"], verbose=False,
                                   draft_model=LlamaPromptLookupDecoding(num_pred_tokens=req["k"]))
    return {"engine": f"llama-cpp-python {llama_cpp.__version__}",
            "note": "logits_all=True (forced by llama-cpp-python with a draft model)"}


def generate(req):
    llm, eos = state["llm"], state["eos"]
    llm.set_seed(req.get("seed", 0))
    new = []
    start = time.perf_counter()
    first = start
    for token in llm.generate(req["ids"], temp=req.get("temperature", 0.0), top_k=0, top_p=1.0, min_p=0.0,
                              repeat_penalty=1.0, reset=True):
        if not new:
            first = time.perf_counter()  # after its own prefill
        new.append(int(token))
        if token in eos or len(new) >= req["max_new_tokens"]:
            break
    end = time.perf_counter()
    llm.reset()
    return {"token_ids": new, "finish_reason": "stop" if new and new[-1] in eos else "length",
            "total_ms": (end - start) * 1e3, "decode_ms": (end - first) * 1e3, "decode_tokens": max(len(new) - 1, 0),
            "prefill_ms": (first - start) * 1e3,
            "timing_source": "timed in the worker: first generated token to last"}


if __name__ == "__main__":
    serve(load, generate)
