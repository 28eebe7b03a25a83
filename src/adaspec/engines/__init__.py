"""Peer serving engines (vLLM, llama.cpp's llama-server) started and stopped from Python for live measurements.

One file per job: :mod:`.process` runs any server as a child process (readiness, log capture, faults with the
log's tail), :mod:`.vllm_server` and :mod:`.llama_server` turn an :class:`~adaspec.engines.config.EngineConfig` into each
engine's command line, :mod:`.acceptance` reads what each engine says it accepted, and :mod:`.scaleout` runs the
whole loop (measure → advise → restart with the advice → re-measure on held-out prompts). The engines are installed
separately (``docs/guide/scaleout.md``); nothing here is imported by the rest of adaspec.
"""
