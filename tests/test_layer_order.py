"""The adaspec package imports only downwards: every module sits in one layer, and no import (module-level or inside a
function) reaches a higher layer.

Layers, lowest first (:data:`LAYERS`); a module may import its own layer and every layer below it:

1. foundations: errors, defaults, sampling math, token trees, statistics, text and logit helpers, grammars;
2. model files: the zoo (``adaspec.models``: what a model name means, fetching and converting it);
3. backends: a model with a KV cache behind one interface, choosing one, measuring its cost curves;
4. drafting and control: drafters, controllers, verification, grammar-constrained drafting;
5. requests and engines: what a request is, the accept step, the single-request and batch engines;
6. speculation setting: the one parser of "target/drafter/controller/K/tree/lossy rule/strict";
7. api: ``adaspec.load`` and the package's lazy exports;
8. applications: the CLI, the server, benchmarks, ``compare``, quality evaluation, peers, external engines and the
   workloads they read.

The import graph is :func:`test_import_layers.import_graph`'s (``ast`` over src/adaspec/**/*.py).
"""

from __future__ import annotations

import pytest
from test_import_layers import PACKAGE, SRC, import_sites, module_names

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations", ("errors", "defaults", "sampling", "tree", "stats", "text", "logprobs", "processors",
                     "chunking", "structured", "toolcalls")),
    ("model files", ("models",)),
    ("backends", ("backends",)),
    ("drafting and control", ("drafters", "controllers", "verify", "constrained")),
    ("requests and engines", ("request", "request_state", "engine", "batch")),
    ("speculation setting", ("spec_setting",)),
    ("api", ("", "api")),  # "": the package itself (its lazy exports name the API's modules)
    ("applications", ("__main__", "cli", "server", "bench", "compare", "quality", "peers", "engines", "models.cli",
                      "workloads", "workload_data", "agentic", "structured_workload")),
)

# Upward imports known and accepted, as (importer, imported) with the reason; any other one fails.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


def layer_of(module: str, layers=LAYERS) -> int | None:
    """Index in ``layers`` of the longest prefix (``adaspec.`` + entry, or the entry's subpackage) naming ``module``;
    None when no entry does."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            name = f"{PACKAGE}.{prefix}" if prefix else PACKAGE
            if (module == name or (prefix and module.startswith(name + "."))) and len(name) > best_len:
                best, best_len = i, len(name)
    return best


def upward_imports(src=SRC, layers=LAYERS) -> list[str]:
    """One line per import from a lower layer to a higher one: ``importer:line (layer) imports target (layer)``."""
    modules = module_names(src)
    found = []
    for module, path in modules.items():
        own = layer_of(module, layers)
        for target, line in import_sites(module, path, modules):
            theirs = layer_of(target, layers)
            if own is not None and theirs is not None and theirs > own and (module, target) not in ALLOWED_UPWARD:
                found.append(f"{module}:{line} ({layers[own][0]}) imports {target} ({layers[theirs][0]})")
    return found


def test_every_module_has_a_layer():
    unplaced = [m for m in module_names() if layer_of(m) is None]
    assert not unplaced, f"modules in no layer of LAYERS (add each where it belongs): {unplaced}"


@pytest.mark.parametrize("module, layer", [
    ("adaspec", "api"), ("adaspec.api", "api"), ("adaspec.errors", "foundations"),
    ("adaspec.models.resolve", "model files"), ("adaspec.models.cli", "applications"),
    ("adaspec.backends.costcurve", "backends"), ("adaspec.controllers.goodput", "drafting and control"),
    ("adaspec.request", "requests and engines"), ("adaspec.request_state", "requests and engines"),
    ("adaspec.structured_workload", "applications"), ("adaspec.server.host", "applications"),
])
def test_layer_of_takes_the_longest_prefix(module, layer):
    assert LAYERS[layer_of(module)][0] == layer


def test_no_import_reaches_a_higher_layer():
    found = upward_imports()
    assert not found, "imports from a lower layer to a higher one:\n  " + "\n  ".join(found)


def test_allowed_upward_imports_still_exist():
    modules = module_names()
    for importer, target in ALLOWED_UPWARD:
        assert target in {t for t, _ in import_sites(importer, modules[importer], modules)}, (importer, target)


def test_layer_check_on_a_made_up_package(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("import os\n\n\ndef f():\n    from ..high import h\n")  # upward, in a function
    (pkg / "low" / "b.py").write_text("from . import a\n")  # same layer
    (pkg / "high.py").write_text("from adaspec.low.b import x\n")  # downward
    layers = (("low", ("low",)), ("high", ("high",)))
    assert upward_imports(tmp_path, layers) == ["adaspec.low.a:5 (low) imports adaspec.high (high)"]
    assert layer_of("adaspec.low.b", layers) == 0 and layer_of("adaspec.lowish", layers) is None
