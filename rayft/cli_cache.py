"""``rayft cache list`` and ``rayft cache prune``: the dataset and model caches of this node (or an S3 root).

rayft cache list [--root DIR|s3://...]
rayft cache prune --max-size 50G [--dry-run]     # least recently used entries go first
"""

from __future__ import annotations

import argparse
import datetime
import re
from typing import Any

from rayft_contract.spec import SpecError

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def add_commands(sub: Any) -> None:
    p = sub.add_parser("cache", help="list or prune the dataset and model caches")
    verbs = p.add_subparsers(required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="entries, size, last use and hits, most recent first")
    listing.set_defaults(command=cmd_list)
    prune = verbs.add_parser("prune", help="delete least recently used entries until the cache fits")
    prune.add_argument("--max-size", required=True, type=parse_size, help="e.g. 500M, 50G, 2T, or 0 for everything")
    prune.add_argument("--dry-run", action="store_true", help="only list what would go")
    prune.set_defaults(command=cmd_prune)
    for q in (listing, prune):
        q.add_argument("--root", help="cache root (default: $RAYFT_CACHE_DIR or ~/.cache/rayft); an s3:// prefix too")


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)I?B?\s*", text.upper())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use e.g. 500M, 50G or 2T")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def cmd_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ray_jobs.cache.entries import default_root, list_entries

    entries = _entries(list_entries, args.root)
    table = Table(title=f"rayft cache: {args.root or default_root()}")
    for column in ("kind", "key", "size", "last use", "hits", "what"):
        table.add_column(column, justify="right" if column in ("size", "hits") else "left")
    for e in entries:
        table.add_row(e.kind, e.key, human(e.size_bytes), _when(e.last_used), str(e.hits), e.description)
    Console().print(table)
    Console().print(f"{len(entries)} entries, {human(sum(e.size_bytes for e in entries))}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from ray_jobs.cache.entries import prune

    removed = _entries(lambda root: prune(args.max_size, root, dry_run=args.dry_run), args.root)
    verb = "would delete" if args.dry_run else "deleted"
    for e in removed:
        print(f"{verb} {e.kind}/{e.key} ({human(e.size_bytes)}, last used {_when(e.last_used)}): {e.description}")
    print(f"{verb} {len(removed)} entries, {human(sum(e.size_bytes for e in removed))}")
    return 0


def _entries(fn: Any, root: str | None) -> Any:
    try:
        return fn(root)
    except OSError as exc:
        raise SpecError("--root", f"cannot read the cache at {root!r}: {exc}") from None


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _when(stamp: float) -> str:
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M") if stamp else "-"
