"""adaspec's default configuration, importable without loading PyTorch (the CLI reads it to build its help)."""

DEFAULT_DRAFTER = "hybrid"
"""The default drafter: n-gram prompt lookup when the text repeats (free), else the default draft model."""

DEFAULT_CONTROLLER = "goodput"
"""The default controller: measured-cost goodput maximisation, K = 0 (plain decoding) when nothing pays."""
