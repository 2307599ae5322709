"""`python -m perf knee ...` (the knee finder), `python -m perf profile ...` (where the
time goes) and `python -m perf texts` (the text sets)."""

from __future__ import annotations

import sys


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "texts":
        from perf.texts import write_sets

        write_sets()
    elif command == "knee":
        from perf.knee import main as knee

        knee(sys.argv[2:])
    elif command == "profile":
        from perf.profile import main as profile

        profile(sys.argv[2:])
    else:
        sys.exit("usage: python -m perf knee|profile --help | python -m perf texts")


if __name__ == "__main__":
    main()
