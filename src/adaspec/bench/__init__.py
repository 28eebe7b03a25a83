"""The performance-boundary study: sweeps (``adaspec bench``), the cost model, maps and report (``adaspec map``),
and deployment advice (``adaspec profile``). One module per job:

| module | job |
|---|---|
| ``grid.py`` | presets, TOML/YAML configs, overrides, the grid of points and their resume keys |
| ``prompts.py`` | prompts of an exact token length, padded with real text |
| ``micro.py`` | micro-measurements: verify time vs (tokens, context), draft time per token, overhead |
| ``measure.py`` | energy (RAPL), CPU time, RSS and model bytes |
| ``costmodel.py`` | fit the cost curves; closed-form speedup(α, K, context); boundaries |
| ``sweep.py`` | run the grid against interleaved plain baselines; JSONL records; resume |
| ``report.py`` | maps (PNG) and the Markdown/HTML report |
| ``profile.py`` | ``adaspec profile``: sample a workload and recommend whether and how to speculate |
| ``advise.py`` | ``adaspec advise``: a speculative configuration for a serving engine from endpoint measurements |
"""
