"""`shoal keys new`: make an API key and the settings entry that lets it in.

The key is printed once; settings keep only its SHA-256, so a lost key is replaced, not
recovered.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .api.endpoints import ROUTE_GROUPS
from .api.keys import hash_key, new_key

__all__ = ["add_keys_command", "run_keys_command"]


def add_keys_command(sub: Any) -> None:
    keys = sub.add_parser("keys", help="make API keys for the gateway")
    actions = keys.add_subparsers(dest="action", required=True)
    new = actions.add_parser("new", help="print a new key and its [[auth.keys]] entry")
    new.add_argument("--name", required=True, help="who holds it (logs name keys by this)")
    new.add_argument("--models", default="", help="comma-separated models it may use (all)")
    new.add_argument(
        "--routes",
        default="",
        help=f"comma-separated route groups it may call (all): {', '.join(ROUTE_GROUPS)}",
    )
    new.add_argument("--admin", action="store_true", help="may call the admin API")
    new.add_argument("--rpm", type=int, default=0, help="requests per minute (0: default)")
    new.add_argument("--tpm", type=int, default=0, help="tokens per minute (0: default)")


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def run_keys_command(args: argparse.Namespace) -> int:
    routes = _split(args.routes)
    unknown = sorted(set(routes) - set(ROUTE_GROUPS))
    if unknown:
        print(f"shoal keys: unknown routes {unknown}; known: {', '.join(ROUTE_GROUPS)}")
        return 2
    key = new_key()
    entry: dict[str, Any] = {"name": args.name, "sha256": hash_key(key)}
    if models := _split(args.models):
        entry["models"] = models
    if routes:
        entry["routes"] = routes
    if args.admin:
        entry["admin"] = True
    for limit in ("rpm", "tpm"):
        if getattr(args, limit):
            entry[limit] = getattr(args, limit)
    lines = ["[[auth.keys]]", *(f"{k} = {json.dumps(v)}" for k, v in entry.items())]
    print(f"API key (shown once; give it to {args.name}):\n\n    {key}\n")
    print("Add to the settings file (or to a keys file as [[keys]]):\n")
    print("\n".join(lines))
    return 0
