"""Evidence at cluster scale (perf/scale/README.md): `python -m perf scale calibrate`
(measure the forward curve, load and queue costs here), `... simulate` (pull against push
routers, W workers x M models), `... validate` (the real gateway, nats-server and sleeping
dummy workers, pull against a real push router, beside the simulator's prediction)."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    command = argv[0] if argv else ""
    if command == "calibrate":
        from perf.scale.calibrate import main as run
    elif command == "simulate":
        from perf.scale.simulate import main as run
    elif command == "validate":
        from perf.scale.validate import main as run
    else:
        sys.exit("usage: python -m perf scale calibrate|simulate|validate --help")
    run(argv[1:])
