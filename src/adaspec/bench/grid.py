"""Sweep configuration: presets, TOML/YAML files, command-line overrides, and the grid of points they expand to.

A configuration has three parts (see ``presets/quick.toml`` for a commented example):

* ``[bench]`` — what is held fixed within a run, plus the hardware axes: ``dtype``, ``threads``, ``backend``
  (``torch``, ``llamacpp`` or ``ik`` = ik_llama.cpp) and ``batch`` (lists; every sweep runs under each combination). A llama.cpp setting
  runs the target's and drafts' GGUF files as they are: its dtype is recorded as ``gguf`` whatever the list says.
* ``[micro]`` — the micro-measurements the cost model is fitted to: context lengths, verify widths n = K + 1,
  repeats, and the draft models to time.
* ``[[sweep]]`` — named grids. Each axis is a list and a sweep is the Cartesian product of its axes:
  ``drafter`` (``calibrated``, ``ngram``, a model spec, ``layerskip:N``), ``alpha`` and ``cost`` (calibrated only;
  cost = a draft model measured in ``[micro]``, ``ratio:C`` for C target steps, or milliseconds), ``k``,
  ``controller`` (``fixed``, ``adaptive``, ``heuristic``), ``context`` (tokens), ``temperature`` and ``tree``
  (0 = chains; N = a full-width token tree of at most N draft nodes every speculation step, K its depth;
  ``"goodput:N"`` = the engine's chain-or-tree chooser with that budget, as ``generate --tree-budget N``). Trees need
  a drafter that branches (``ngram-tree`` or a draft model) and a backend that verifies them (PyTorch, ik_llama.cpp,
  up to its tree capacity); calibrated, ``ngram``, batched and llama.cpp points keep chains only.

Every point is measured against plain decoding on the same prompt, interleaved (see :mod:`adaspec.bench.sweep`).
Each point has a resume key built from every setting that affects its measurement.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from adaspec.errors import ConfigError

PRESETS = ("quick", "full")
AXES = ("drafter", "alpha", "cost", "k", "controller", "context", "temperature", "tree")
HARDWARE_AXES = ("dtype", "threads", "backend", "batch")
BACKENDS = ("torch", "llamacpp", "ik")
GGUF_DTYPE = "gguf"  # the dtype of a GGUF-runtime setting: the file's own quantisation (the dtype axis does not apply)

DEFAULTS: dict = {
    "bench": {
        "target": "qwen2.5-coder-1.5b-instruct",
        "dtype": ["bfloat16"], "threads": [2], "backend": ["torch"], "batch": [1],
        "workload": "humaneval", "prompts": 1, "max_new_tokens": 32, "seed": 0,
        "plain_every": 4, "prefix_cache": True, "chat": True, "device": "auto",
    },
    "micro": {"contexts": [256, 1024], "verify_tokens": [1, 2, 3, 5, 9], "repeats": 3, "drafts": []},
    "sweep": [],
}
SWEEP_DEFAULTS: dict = {"drafter": ["calibrated"], "alpha": [0.8], "cost": ["ratio:0.4"], "k": [4],
                        "controller": ["fixed"], "context": [256], "temperature": [0.0], "tree": [0]}


def preset(name: str) -> dict:
    """A built-in preset (``quick`` or ``full``) as a config dict."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    text = resources.files("adaspec.bench").joinpath(f"presets/{name}.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def read_config_file(path: str | Path) -> dict:
    """Read a TOML (``.toml``) or YAML (``.yaml``/``.yml``) config file. A top-level ``preset = "quick"`` starts
    from that preset; the file's tables then override it (sweeps replace the preset's sweeps when given)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text) or {}
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table at the top level")
    base = data.pop("preset", None)
    return merge(preset(base), data) if base else data


def merge(base: dict, over: dict) -> dict:
    """Deep-merge ``over`` into a copy of ``base`` (tables merge, everything else — lists too — replaces)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_value(text: str):
    """A command-line value: TOML syntax when it parses (``[1, 2]``, ``0.7``, ``true``, ``"x"``), else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(config: dict, assignment: str) -> dict:
    """Apply ``section.key=value`` (e.g. ``bench.dtype=["float32"]``, ``micro.repeats=5``,
    ``sweep.alpha-k.k=[2,4]``) to a copy of ``config``."""
    path, sep, raw = assignment.partition("=")
    if not sep:
        raise ConfigError(f"bad override {assignment!r}: expected KEY=VALUE")
    parts = path.strip().split(".")
    value = parse_value(raw.strip())
    out = copy.deepcopy(config)
    if parts[0] == "sweep":
        if len(parts) != 3:
            raise ConfigError(f"bad override {assignment!r}: use sweep.NAME.AXIS=VALUE")
        for s in out.get("sweep", []):
            if s.get("name") == parts[1]:
                s[parts[2]] = value
                return out
        raise ConfigError(f"bad override {assignment!r}: no sweep named {parts[1]!r}")
    if len(parts) != 2 or parts[0] not in ("bench", "micro"):
        raise ConfigError(f"bad override {assignment!r}: use bench.KEY, micro.KEY or sweep.NAME.AXIS")
    out.setdefault(parts[0], {})[parts[1]] = value
    return out


def normalize(config: dict) -> dict:
    """Fill defaults, turn scalars on list axes into one-element lists, and validate."""
    cfg = merge(DEFAULTS, {k: v for k, v in config.items() if k != "sweep"})
    cfg["sweep"] = []
    for key in HARDWARE_AXES:
        cfg["bench"][key] = _as_list(cfg["bench"][key])
    for key in ("contexts", "verify_tokens", "drafts"):
        cfg["micro"][key] = _as_list(cfg["micro"][key])
    for b in cfg["bench"]["backend"]:
        if b not in BACKENDS:
            raise ConfigError(f"unknown backend {b!r}; available: {', '.join(BACKENDS)}")
    if cfg["bench"]["device"] not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"unknown device {cfg['bench']['device']!r}; choose one of: auto, cpu, cuda")
    if cfg["bench"]["device"] == "cuda" and set(cfg["bench"]["backend"]) - {"torch"}:
        raise ConfigError("bench.device = cuda: only the torch backend runs on CUDA here; the GGUF runtimes run on "
                          "the CPU (drop them from bench.backend, or use device auto)")
    for b in cfg["bench"]["batch"]:
        if not isinstance(b, int) or not 1 <= b <= 64:
            raise ConfigError(f"batch size {b!r}: expected an integer in 1..64")
    if cfg["bench"]["max_new_tokens"] < 2:
        raise ConfigError("max_new_tokens must be >= 2 (one token comes from the prefill)")
    if 1 not in cfg["micro"]["verify_tokens"]:
        cfg["micro"]["verify_tokens"] = [1] + cfg["micro"]["verify_tokens"]
    names = set()
    for i, s in enumerate(config.get("sweep", [])):
        sweep = {**SWEEP_DEFAULTS, "name": f"sweep{i + 1}", **s}
        if sweep["name"] in names:
            raise ConfigError(f"two sweeps are named {sweep['name']!r}")
        names.add(sweep["name"])
        unknown = set(sweep) - set(AXES) - {"name"}
        if unknown:
            raise ConfigError(f"sweep {sweep['name']!r}: unknown axes {sorted(unknown)}; axes are {', '.join(AXES)}")
        for axis in AXES:
            sweep[axis] = _as_list(sweep[axis])
        for k in sweep["k"]:
            if int(k) < 1:
                raise ConfigError(f"sweep {sweep['name']!r}: K must be >= 1 (plain decoding is the baseline)")
        for a in sweep["alpha"]:
            if not 0 <= float(a) <= 1:
                raise ConfigError(f"sweep {sweep['name']!r}: alpha must be in [0, 1], got {a}")
        for t in sweep["tree"]:
            parse_tree(t, sweep["name"])
        cfg["sweep"].append(sweep)
    return cfg


def parse_tree(value, sweep: str = "") -> tuple[int, str]:
    """A ``tree`` axis value as ``(budget, choice)``: ``0`` → ``(0, "")`` (chains), ``N`` → ``(N, "always")``,
    ``"goodput:N"`` → ``(N, "goodput")``.

    Raises:
        ConfigError: anything else, or a budget outside what :func:`adaspec.tree.check_budget` accepts (or 1: a
            one-node tree is a chain).
    """
    from adaspec.tree import check_budget

    text = str(value).strip().lower()
    choice, _, n = text.rpartition(":")
    if choice not in ("", "always", "goodput") or not n.isdigit():
        raise ConfigError(f"sweep {sweep!r}: tree values are 0 (chains), N (a tree of at most N draft nodes) or "
                          f"'goodput:N' (chain or tree per step), got {value!r}")
    budget = int(n)
    check_budget(budget)
    if budget == 1:
        raise ConfigError(f"sweep {sweep!r}: a tree of 1 draft node is a chain; use 0 or at least 2")
    return (budget, choice or "always") if budget else (0, "")


def _as_list(value) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def build_config(*, config_file: str | None = None, preset_name: str | None = None,
                 overrides: list[str] = (), sweeps: list[str] | None = None) -> dict:
    """Preset, then config file, then ``KEY=VALUE`` overrides; then keep only the named sweeps; normalised."""
    cfg = preset(preset_name) if preset_name else {}
    if config_file:
        cfg = merge(cfg, read_config_file(config_file))
    if not cfg:
        raise ConfigError("give a config file, --quick or --full")
    for o in overrides:
        cfg = apply_override(cfg, o)
    if sweeps:
        known = {s.get("name") for s in cfg.get("sweep", [])}
        missing = set(sweeps) - known
        if missing:
            raise ConfigError(f"no sweeps named {sorted(missing)}; have {sorted(n for n in known if n)}")
        cfg["sweep"] = [s for s in cfg["sweep"] if s.get("name") in sweeps]
    return normalize(cfg)


# Points ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """Hardware/backend setting shared by a block of points (one model load per (dtype, backend); the thread
    counts share it)."""

    target: str
    dtype: str
    threads: int
    backend: str
    batch: int


@dataclass(frozen=True)
class Point:
    """One speculative configuration on one prompt. ``alpha``/``cost`` are None except for the calibrated drafter."""

    sweep: str
    setting: Setting
    context: int
    prompt_index: int
    temperature: float
    drafter: str
    k: int
    controller: str
    alpha: float | None
    cost: str | None
    tree: int = 0
    tree_choice: str = ""

    @property
    def group(self) -> tuple:
        """Points sharing a prompt and a plain baseline."""
        return self.setting, self.context, self.prompt_index, self.temperature

    def fields(self) -> dict:
        d = asdict(self)
        d.update(d.pop("setting"))
        return d


def point_key(point: Point, bench: dict) -> str:
    """Resume key: a short hash of every setting that changes the measurement (the sweep's name excluded, so the
    same point in two sweeps is measured once)."""
    fields = point.fields()
    fields.pop("sweep")
    if not point.tree:  # chains keep the keys they had before the tree axis existed
        fields.pop("tree")
        fields.pop("tree_choice")
    fields.update(workload=bench["workload"], max_new_tokens=bench["max_new_tokens"], seed=bench["seed"],
                  chat=bench["chat"])
    return "p-" + hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def expand(cfg: dict) -> list[Point]:
    """Every point of every sweep under every hardware setting, deduplicated, in run order (setting, then
    groups from the longest context down, so each prompt reuses the cached prefix of the one before; then prompt,
    temperature and sweep order). Calibrated points at temperature > 0 are dropped
    (the calibrated drafter is greedy-only), and ``layerskip:N`` points on llama.cpp (it needs a PyTorch target);
    tree points are dropped where nothing would branch (the calibrated and ``ngram`` drafters propose one chain,
    the batched engine and llama.cpp mainline verify chains)."""
    bench = cfg["bench"]
    points: dict[str, Point] = {}
    settings = list(dict.fromkeys(
        Setting(bench["target"], GGUF_DTYPE if b != "torch" else d, int(t), b, int(n))
        for b in bench["backend"] for d in bench["dtype"] for t in bench["threads"] for n in bench["batch"]))
    for setting in settings:
        for sweep in cfg["sweep"]:
            for drafter in sweep["drafter"]:
                if str(drafter).startswith("layerskip:") and setting.backend != "torch":
                    continue  # self-drafting runs a truncated PyTorch model
                calibrated = drafter == "calibrated"
                alphas = [float(a) for a in sweep["alpha"]] if calibrated else [None]
                costs = [str(c) for c in sweep["cost"]] if calibrated else [None]
                for alpha in alphas:
                    for cost in costs:
                        for k in sweep["k"]:
                            for controller in sweep["controller"]:
                                for context in sweep["context"]:
                                    for temp in sweep["temperature"]:
                                        if calibrated and float(temp) > 0:
                                            continue
                                        for tree in sweep["tree"]:
                                            budget, choice = parse_tree(tree, sweep["name"])
                                            if budget and (calibrated or drafter == "ngram" or setting.batch > 1
                                                           or setting.backend == "llamacpp"):
                                                continue  # nothing would branch: the chain again
                                            for p in range(int(bench["prompts"])):
                                                pt = Point(sweep["name"], setting, int(context), p, float(temp),
                                                           str(drafter), int(k), str(controller), alpha, cost,
                                                           budget, choice)
                                                points.setdefault(point_key(pt, bench), pt)
    order = {s: i for i, s in enumerate(settings)}
    return sorted(points.values(), key=lambda p: (order[p.setting], -p.context, p.prompt_index, p.temperature))
