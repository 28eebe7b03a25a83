"""Issue 15 probe: server-side step times vs client-side TPOT, streamed vs non-streamed, plain decoding."""
import json, sys, time, httpx
from adaspec.workloads import load_workload
URL = sys.argv[1]
prompts = load_workload("humaneval", limit=4)
def msgs(p):
    return [{"role": "user", "content": p.text}]
def one(p, stream, spec):
    body = {"messages": msgs(p), "max_tokens": 128, "temperature": 0, "stream": stream}
    if not spec:
        body["speculation"] = {"drafter": "none"}
    t0 = time.perf_counter(); times = []; summ = None
    with httpx.Client(timeout=300) as c:
        if stream:
            with c.stream("POST", URL + "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    o = json.loads(line[6:])
                    if o.get("choices") and o["choices"][0].get("delta", {}).get("content"):
                        times.append(time.perf_counter())
                    if o.get("choices") and o["choices"][0].get("finish_reason"):
                        summ = o.get("speculation")
        else:
            o = c.post(URL + "/v1/chat/completions", json=body).json()
            summ = o["speculation"]
    e2e = time.perf_counter() - t0
    client_tpot = (times[-1] - times[0]) / (len(times) - 1) * 1e3 if len(times) > 2 else None
    tm = summ["time_ms"]
    return dict(stream=stream, spec=spec, e2e_s=round(e2e, 2), client_tpot=client_tpot and round(client_tpot, 1),
                server_tpot=summ["tpot_ms"], steps=summ["steps"], verify_ms=tm["verify"], other=tm["other"],
                total=tm["total"], prefill=tm["prefill"], per_step=round((tm["total"] - tm["prefill"]) / summ["steps"], 1))
for rnd in range(1):
    for p in prompts[:2]:
        for stream in (True, False):
            print(p.id if hasattr(p, "id") else "", json.dumps(one(p, stream, False)), flush=True)
