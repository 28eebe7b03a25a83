"""The performance-boundary study: sweeps (``adaspec bench``), the cost model, maps and report (``adaspec map``),
and deployment advice (``adaspec profile``). One module per job:

| module | job |
|---|---|
| ``grid.py`` | presets, TOML/YAML configs, overrides, the grid of points and their resume keys |
| ``prompts.py`` | prompts of an exact token length, padded with real text |
| ``micro.py`` | micro-measurements: verify time vs (tokens, context), draft time per token, overhead |
| ``measure.py`` | energy (RAPL), CPU time, RSS and model bytes; the machine's facts for a results file |
| ``costmodel.py`` | fit the cost curves of :mod:`adaspec.controllers.costmodel` to micro-measurements |
| ``loading.py`` | the models a sweep loads for one hardware setting |
| ``sweep.py`` | run the grid setting by setting (load, micro-measurements, groups); resume |
| ``groups.py`` | one group: its plain reference, its points, plain baselines interleaved (batch 1 or B) |
| ``metrics.py`` | one run's metrics (decode time per token, acceptance, time split, memory, energy) |
| ``results.py`` | the JSONL results file: reading it, invocations, speedups against plain baselines |
| ``predict.py`` | the fitted cost model applied to records: predicted speedup of a measured point |
| ``analysis.py`` | ``adaspec map``'s conclusions per setting: cost model scored, operating points, boundaries |
| ``maps.py`` | the boundary maps (PNG) of one setting |
| ``report.py`` | the Markdown/HTML report |
| ``profile.py`` | ``adaspec profile``: sample a workload and recommend whether and how to speculate |
| ``advise.py`` | ``adaspec advise``: a speculative configuration for a serving engine from endpoint measurements |
"""
