"""adaspec's default configuration, importable without loading PyTorch (the CLI reads it to build its help)."""

DEFAULT_DRAFTER = "hybrid-suffix"
"""The default drafter: suffix decoding over this request and earlier answers, n-gram prompt lookup when the text
repeats (both free), else the default draft model (``hybrid`` is the same without suffix decoding)."""

DEFAULT_CONTROLLER = "goodput"
"""The default controller: measured-cost goodput maximisation, K = 0 (plain decoding) when nothing pays."""

BACKEND_CHOICES = ("auto", "torch", "llamacpp", "ik")
"""``--backend`` values: ``auto`` (the fastest path measured on this machine), PyTorch, llama.cpp (llama-cpp-python)
or ik_llama.cpp (ik-llama-cpp-python)."""

DEVICE_CHOICES = ("auto", "cpu", "cuda")
"""``--device`` values: ``auto`` is CUDA when PyTorch sees a GPU, else the CPU."""
