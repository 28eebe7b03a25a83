"""Command line: ``adaspec generate``, ``adaspec models``.

Errors that adaspec raises on purpose (:class:`~adaspec.errors.AdaspecError`) are printed as one line naming the
problem, with exit code 2; anything else is a bug and keeps its traceback.

Each command imports what it runs (PyTorch, transformers, the bench, the server's stack) inside its ``cmd_*``
function, so parsing, ``--help`` and argument errors stay fast.
"""

from __future__ import annotations

import argparse
import sys

from adaspec.cli.bench import add_bench_parsers
from adaspec.cli.compare import add_compare_parser
from adaspec.cli.eval import add_eval_parser
from adaspec.cli.generate import add_generate_parser
from adaspec.cli.serve import add_serve_parser
from adaspec.errors import AdaspecError
from adaspec.models.cli import add_models_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adaspec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    add_generate_parser(sub)
    add_compare_parser(sub)
    add_eval_parser(sub)
    add_serve_parser(sub)
    add_bench_parsers(sub)
    add_models_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except AdaspecError as e:
        print(f"adaspec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
