import json, sys, statistics, collections
rows = [json.loads(l) for f in sys.argv[1:] for l in open(f)]
plain = {(r["prompt"]): r["tokens"] / r["decode_ms"] for r in rows if r["variant"] == "plain"}
d = collections.defaultdict(lambda: collections.defaultdict(list))
pre = collections.defaultdict(list)
for r in rows:
    if r["variant"] == "plain": continue
    s = r["tokens"] / r["decode_ms"] / plain[r["prompt"]]
    d[r["variant"]][r["workload"]].append(s); d[r["variant"]]["all"].append(s)
    pre[r["variant"]].append(r["prefill_ms"])
ws = ["humaneval", "gsm8k", "specbench:coding", "specbench:writing", "all"]
print("variant".ljust(9), " ".join(w[-10:].rjust(10) for w in ws), "prefill_ms")
for v in d:
    print(v.ljust(9), " ".join(f"{statistics.fmean(d[v][w]):10.3f}" for w in ws), f"{statistics.fmean(pre[v]):.0f}")
