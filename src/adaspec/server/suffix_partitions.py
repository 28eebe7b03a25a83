"""The server's suffix cache: one :class:`~adaspec.drafters.suffix_cache.SuffixCache` behind every suffix drafter
a server runs, with a partition per API key.

* **One cache, one budget.** Every suffix drafter of the server (``--draft suffix``, ``hybrid-suffix``, a
  request's ``{"speculation": {"drafter": "suffix:factor=2"}}``) and every batch row reads and writes the same
  cache, so ``--suffix-cache-tokens`` bounds the memory of them all. Its trie depth is the server's (the default
  drafter's ``depth``, else 24); a request may set the proposal rule (``factor``, ``prob``, ``match``,
  ``context``, ``stop``) but not ``depth`` or ``tokens`` (a 400 naming the option).
* **A partition per API key.** A request reads and writes the partition of the key it authenticated with
  (:func:`suffix_partition` of :func:`adaspec.server.auth.key_id`, a digest: the key itself is never stored), so
  it never drafts from text that another key's requests wrote. A server without keys, or started with
  ``--suffix-share``, has one partition for everyone. Eviction is LRU over partitions, FIFO within one
  (:mod:`adaspec.drafters.suffix_cache`).
* Only finished responses are cached (:meth:`~adaspec.drafters.base.Drafter.finish`): a cancelled request, a
  timeout or a failure leaves nothing in any partition.
"""

from __future__ import annotations

from adaspec.drafters import Drafter
from adaspec.drafters.suffix import SuffixDrafter, is_suffix_spec, suffix_options, suffixes_in
from adaspec.drafters.suffix_cache import SuffixCache
from adaspec.errors import ConfigError

DEFAULT_TOKENS = 100_000
DEFAULT_DEPTH = 24


def suffix_partition(api_key_id: str | None) -> str:
    """The cache partition of a request authenticated with the key whose :func:`~adaspec.server.auth.key_id` is
    ``api_key_id`` (None: no key, or sharing on: the one common partition ``""``)."""
    return "" if api_key_id is None else f"key:{api_key_id}"


class ServerSuffixCache:
    """The suffix cache of a server (see the module docstring).

    Args:
        default_spec: the server's default drafter spec; a suffix spec (``suffix:depth=32``) sets the depth and,
            unless ``max_tokens`` is given, the size.
        default_drafter: the default drafter when it is built already (``hybrid-suffix``, ``suffix+...``): its
            suffix drafter's depth and size are taken the same way.
        max_tokens: ``--suffix-cache-tokens``, the cache size over all partitions (None: as above, else 100,000).

    Raises:
        ConfigError: ``max_tokens`` < 0, or a bad suffix option in ``default_spec``.
    """

    def __init__(self, default_spec: str = "none", default_drafter: Drafter | None = None,
                 max_tokens: int | None = None) -> None:
        depth, tokens = DEFAULT_DEPTH, DEFAULT_TOKENS
        if is_suffix_spec(default_spec):
            opts = suffix_options(default_spec)
            depth, tokens = opts.get("max_depth", depth), opts.get("max_tokens", tokens)
        elif suffixes_in(default_drafter):
            own = suffixes_in(default_drafter)[0].cache
            depth, tokens = own.max_depth, own.max_tokens
        self.cache = SuffixCache(tokens if max_tokens is None else max_tokens, depth)

    def check(self, spec: str) -> None:
        """Refuse a request's suffix spec that sets the cache's depth or size to something else.

        Raises:
            ConfigError: a malformed option or one out of range, or ``depth``/``tokens`` other than the server's (names
            it).
        """
        opts = suffix_options(spec)
        for key, arg, value in (("depth", "max_depth", self.cache.max_depth),
                                ("tokens", "max_tokens", self.cache.max_tokens)):
            if arg in opts and opts[arg] != value:
                raise ConfigError(f"drafter {spec!r}: {key} is the server's suffix cache setting ({value}); a request "
                                  "may set factor, prob, match, context, stop and views")
        SuffixDrafter(self.cache, **{k: v for k, v in opts.items() if k not in ("max_depth", "max_tokens")})

    def adopt(self, drafter: Drafter | None) -> Drafter | None:
        """Put every suffix drafter in ``drafter`` on this cache (in place; returns ``drafter``).

        Raises:
            ConfigError: a suffix drafter of another depth (all of a server's share one trie depth).
        """
        for suffix in suffixes_in(drafter):
            if suffix.cache is self.cache:
                continue
            if suffix.max_depth != self.cache.max_depth:
                raise ConfigError(f"the {drafter.name} drafter's suffix depth is {suffix.max_depth}, but this "
                                  f"server's suffix cache has depth {self.cache.max_depth}: every suffix drafter of "
                                  "a server shares one cache")
            suffix.cache = self.cache
        return drafter
