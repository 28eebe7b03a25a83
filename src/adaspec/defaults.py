"""adaspec's default configuration, importable without loading PyTorch (the CLI reads it to build its help)."""

DEFAULT_DRAFTER = "hybrid-suffix"
"""The default drafter: suffix decoding over this request and earlier answers, n-gram prompt lookup when the text
repeats (both free), else the default draft model (``hybrid`` is the same without suffix decoding)."""

DEFAULT_DRAFT_CATCH_UP: int | None = None
"""The most tokens a draft model feeds at once to catch up with the sequence (``--draft-catch-up N``): one that lags
further (a lazily prefilled prompt, a stretch the lookups or plain steps wrote) restarts from the sequence's last N
tokens. None (the default): the draft model always sees the whole sequence. A bound of 32-128 was measured to gain
on GSM8K and lose more on code, where the draft needs the whole context (docs/findings/new-text.md, "A bounded
catch-up")."""

DEFAULT_CONTROLLER = "goodput"
"""The default controller: measured-cost goodput maximisation, K = 0 (plain decoding) when nothing pays."""

BACKEND_CHOICES = ("auto", "torch", "llamacpp", "ik")
"""``--backend`` values: ``auto`` (the fastest path measured on this machine), PyTorch, llama.cpp (llama-cpp-python)
or ik_llama.cpp (ik-llama-cpp-python)."""

DEVICE_CHOICES = ("auto", "cpu", "cuda")
"""``--device`` values: ``auto`` is CUDA when PyTorch sees a GPU, else the CPU."""
