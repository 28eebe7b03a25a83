"""A speculation setting — drafter, controller, K, strict mode, lossy rule, tree — and its one parser.

:class:`SpecSetting` is the type every front end builds: the Python API and the CLI from their arguments
(:func:`validate`), ``adaspec compare`` and ``adaspec eval`` from a method string (:func:`parse_method`), the server
from a request's ``speculation`` object (:func:`validate`, with its allow-list on top). The target is not part of a
setting: each front end holds one target and varies the setting over it.

Method strings: ``plain`` | ``CONTROLLER[:K]`` (the default drafter) | ``DRAFTER/CONTROLLER[:K]`` (any drafter spec of
:func:`adaspec.api.make_drafter`), then ``+`` modifiers: ``+strict``, one lossy rule of
:data:`adaspec.verify.LOSSY_RULES` (``+typical[:ε]``, ``+topk[:k]``, ``+bild[:nats]``) and
``+tree:N[:always|:goodput][:expand=E]``. Peers of ``adaspec compare`` (``hf:...``, ``llama-server:...``) are
parsed by :mod:`adaspec.compare`, not here.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaspec.controllers import CONTROLLERS, make_controller
from adaspec.drafters.suffix import is_suffix_spec
from adaspec.errors import ConfigError
from adaspec.tree import MAX_TREE_NODES, check_budget
from adaspec.verify import parse_lossy

BUILTIN_LOOKUPS = ("ngram", "ngram-tree")  # drafters that look text up, with no model and no options


@dataclass(frozen=True)
class SpecSetting:
    """One speculation setting.

    Attributes:
        drafter: a drafter spec (see :func:`adaspec.api.make_drafter`); None: plain decoding.
        controller: a name of :data:`adaspec.controllers.CONTROLLERS` (``adaspec compare`` labels a peer's rows
            with its library here, e.g. ``hf``).
        k: the fixed K, or the controller's initial K; None: the controller's default.
        strict, lossy, tree_budget, tree_choice, tree_expand: the :class:`~adaspec.request.GenerationConfig`
            fields of the same names (strict mode, a lossy acceptance rule, token trees of up to ``tree_budget``
            draft nodes).
        label: the method string this setting was parsed from ("" when built from fields).
    """

    drafter: str | None
    controller: str
    k: int | None
    strict: bool = False
    lossy: str | None = None
    tree_budget: int = 0
    tree_choice: str = "goodput"
    tree_expand: int | None = None
    label: str = ""

    def __post_init__(self) -> None:
        """``"none"`` is plain decoding's drafter as the server reports it: stored as None. K must be an int.

        Raises:
            ConfigError: ``k`` is neither None nor an int (e.g. a label-first positional call of the older
                ``compare.Method(label, drafter, controller, k)``).
        """
        if is_plain_drafter(self.drafter):
            object.__setattr__(self, "drafter", None)
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, int)):
            raise ConfigError(f"SpecSetting k must be an int or None, not {self.k!r} "
                              "(fields: drafter, controller, k, ...; label= by keyword)")

    @property
    def plain(self) -> bool:
        return self.drafter is None

    @property
    def reference(self) -> str:
        """The plain-decoding method whose output this one must reproduce (see :func:`reference_method`)."""
        return reference_method(self.label)

    def as_dict(self) -> dict:
        """``{"drafter", "controller", "k"}`` as the server reports them (plain decoding's drafter is ``"none"``)."""
        return {"drafter": self.drafter or "none", "controller": self.controller, "k": self.k}


def is_plain_drafter(spec: str | None) -> bool:
    """True for the drafter specs that mean plain decoding: None, ``"none"`` (any case) and ``""``."""
    return spec is None or spec.strip().lower() in ("", "none")


PLAIN = SpecSetting(None, "fixed", 0)
"""Plain decoding (K = 0), the one setting every plain request maps to."""


def reference_method(label: str) -> str:
    """The plain method a method's identity is measured against: ``plain+strict`` for a label with ``+strict``,
    else ``plain`` (under ``run_compare(strict=True)`` labels carry no modifier and ``plain`` is strict too)."""
    base, *mods = label.rpartition("/")[2].split("+")
    return "plain+strict" if "strict" in mods else "plain"


def expand_drafter(spec: str, default_draft: str) -> str:
    """``hybrid`` -> ``ngram+DEFAULT``, ``hybrid-suffix`` -> ``suffix+ngram+DEFAULT`` (``default_draft`` the draft
    model spec); any other spec as given."""
    if spec.lower() == "hybrid":
        return f"ngram+{default_draft}"
    if spec.lower() == "hybrid-suffix":  # suffix decoding first, then prompt lookup, then the draft model
        return f"suffix+ngram+{default_draft}"
    return spec


def layerskip_layers(spec: str) -> int | None:
    """N of a ``layerskip:N`` spec (the target's first N layers as the draft model); None for any other spec.

    Raises:
        ConfigError: ``layerskip:`` followed by something other than an integer.
    """
    if not spec.lower().startswith("layerskip:"):
        return None
    try:
        return int(spec.split(":", 1)[1])
    except ValueError:
        raise ConfigError(f"expected layerskip:N with an integer N, got {spec!r}") from None


def builtin_drafter(spec: str) -> bool:
    """True for drafter specs that load no model of their own: ``none``, ``ngram``, ``ngram-tree``,
    ``suffix[:...]`` and ``layerskip:N`` (which shares the target's weights). Everything else (a model spec,
    ``hybrid``, ``A+B``) loads a draft model."""
    low = spec.lower()
    return low in ("none", *BUILTIN_LOOKUPS) or low.startswith("layerskip:") or is_suffix_spec(low)


def check_controller(name: str, k: int | None) -> None:
    """Raise ConfigError for a controller name not in :data:`~adaspec.controllers.CONTROLLERS` (the message lists
    them), then for a K that controller refuses (K < 0)."""
    make_controller(name)  # an unknown name first, whatever K is
    make_controller(name, k)


def validate(drafter: str | None, controller: str, k: int | None, *, strict: bool = False,
             lossy: str | None = None, tree_budget: int = 0, tree_choice: str = "goodput",
             tree_expand: int | None = None, label: str = "") -> SpecSetting:
    """A checked :class:`SpecSetting`; ``drafter`` None or ``"none"`` is plain decoding.

    Raises:
        ConfigError: an unknown controller, a K it refuses, a malformed ``layerskip:N``, an unknown lossy rule, a
            tree budget out of range, or a lossy rule or a tree without a drafter.
    """
    if is_plain_drafter(drafter):
        drafter = None
    if drafter is not None:
        layerskip_layers(drafter)
    check_controller(controller, k)
    if lossy is not None:
        try:
            parse_lossy(lossy)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    check_budget(tree_budget)
    if (lossy is not None or tree_budget) and drafter is None:
        raise ConfigError("a lossy rule or a tree needs a drafter (plain decoding drafts nothing)")
    return SpecSetting(drafter, controller, k, strict, lossy, tree_budget, tree_choice, tree_expand, label)


def split_method(text: str) -> tuple[str, list[str]]:
    """A method string's head (``[DRAFTER/]CONTROLLER[:K]`` or ``plain``) and its ``+`` modifiers."""
    drafter_part, slash, rest = text.rpartition("/")
    base, *mods = rest.split("+")
    return drafter_part + slash + base, mods


def parse_modifiers(text: str, mods: list[str]) -> dict:
    """The :class:`SpecSetting` fields ``+strict``, ``+RULE[:x]`` and ``+tree:N[:always][:expand=E]`` set.

    Raises:
        ConfigError: ``bad method TEXT: ...`` for an unknown modifier, two lossy rules or a malformed tree.
    """
    out: dict = {}
    for mod in mods:
        if mod == "strict":
            out["strict"] = True
            continue
        if mod.startswith("tree:"):
            budget, *opts = mod[5:].split(":")
            try:
                out["tree_budget"] = int(budget)
                check_budget(out["tree_budget"])
                for opt in opts:
                    if opt in ("goodput", "always"):
                        out["tree_choice"] = opt
                    elif opt.startswith("expand="):
                        out["tree_expand"] = int(opt[7:])
                        if out["tree_expand"] < 0:
                            raise ValueError(f"expand must be >= 0, got {out['tree_expand']}")
                    else:
                        raise ValueError(f"unknown choice {opt!r}")
            except (ValueError, ConfigError) as e:
                raise ConfigError(f"bad method {text!r}: {mod!r} needs a node budget "
                                  f"tree:N[:always][:expand=E], 1 <= N <= {MAX_TREE_NODES} ({e})") from None
            if out["tree_budget"] == 0:
                raise ConfigError(f"bad method {text!r}: tree:0 is a chain; drop the modifier")
            continue
        try:
            parse_lossy(mod)
        except ValueError as e:
            raise ConfigError(f"bad method {text!r}: modifier {mod!r} is neither 'strict' nor a lossy rule "
                              f"({e})") from None
        if "lossy" in out:
            raise ConfigError(f"bad method {text!r}: one lossy rule at most")
        out["lossy"] = mod
    return out


def parse_method(text: str, default_draft: str) -> SpecSetting:
    """Parse a method string (see the module docstring) into a setting labelled ``text``; an absent drafter is
    ``default_draft``, ``hybrid`` and ``hybrid-suffix`` expand around it (:func:`expand_drafter`).

    Raises:
        ConfigError: ``bad method TEXT: ...`` naming what is wrong.
    """
    head, mods = split_method(text)
    fields = parse_modifiers(text, mods)
    if head == "plain":
        drafter, name, k_value = None, "fixed", 0
    else:
        drafter, _, rest = head.rpartition("/")
        name, _, k = rest.partition(":")
        if name not in CONTROLLERS:
            raise ConfigError(f"bad method {text!r}: controller must be one of {', '.join(CONTROLLERS)}")
        try:
            k_value = int(k) if k else None
        except ValueError:
            raise ConfigError(f"bad method {text!r}: K must be an integer") from None
        if name == "fixed" and k_value is None:
            raise ConfigError(f"bad method {text!r}: use fixed:K")
        make_controller(name, k_value)  # validates K
        drafter = expand_drafter(drafter, default_draft) if drafter else default_draft
    if (fields.get("lossy") is not None or fields.get("tree_budget")) and drafter is None:
        raise ConfigError(f"bad method {text!r}: a lossy rule or a tree needs a drafter (plain decoding drafts "
                          "nothing)")
    return SpecSetting(drafter, name, k_value, label=text, **fields)
