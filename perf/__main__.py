"""`python -m perf knee ...` (the knee finder), `python -m perf bakeoff ...` (generation
engines side by side), `python -m perf chat-batch ...` (a chat batch job against the
engine, live latency under it), `python -m perf profile ...` (where the time goes),
`python -m perf latency ...` (a low-load request's time against the forward pass),
`python -m perf ttft ...` (one stream's first token, split by its trace),
`python -m perf packed-rows` (packed rows against padded batches, in process),
`python -m perf engine-ops` (the engine's time by operator, and its arithmetic rate),
`python -m perf weight-quality` (each generation weight tier against float32),
`python -m perf kv-cache` (the generation KV cache's precision: quality and speed),
`python -m perf precision-plot POINTS` (those tiers' quality against their speed),
`python -m perf scale ...` (pull against push routers at cluster scale: perf/scale/),
`python -m perf soak ...` (hours under mixed load with faults),
`python -m perf slow-clients ...` (idle and slow clients beside live traffic),
`python -m perf compact-recall` (what int8 and binary vectors lose in a search) and
`python -m perf texts` (the text sets)."""

from __future__ import annotations

import sys


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "texts":
        from perf.texts import write_sets

        write_sets()
    elif command == "soak":
        from perf.soak import main as soak

        soak(sys.argv[2:])
    elif command == "compact-recall":
        from perf.compact_recall import main as compact_recall

        compact_recall(sys.argv[2:])
    elif command == "slow-clients":
        from perf.slow_clients import main as slow_clients

        slow_clients(sys.argv[2:])
    elif command == "precision-plot":
        from perf.precision_plot import main as precision_plot

        precision_plot(sys.argv[2:])
    elif command == "knee":
        from perf.knee import main as knee

        knee(sys.argv[2:])
    elif command == "bakeoff":
        from perf.bakeoff import main as bakeoff

        bakeoff(sys.argv[2:])
    elif command == "chat-batch":
        from perf.chat_batch import main as chat_batch

        chat_batch(sys.argv[2:])
    elif command == "latency":
        from perf.latency import main as latency

        latency(sys.argv[2:])
    elif command == "ttft":
        from perf.ttft import main as ttft

        ttft(sys.argv[2:])
    elif command == "scale":
        from perf.scale import main as scale

        scale(sys.argv[2:])
    elif command == "packed-rows":
        from perf.packed_rows import main as packed_rows

        packed_rows(sys.argv[2:])
    elif command == "engine-ops":
        from perf.engine_ops import main as engine_ops

        engine_ops(sys.argv[2:])
    elif command == "kv-cache":
        from perf.kv_cache import main as kv_cache

        kv_cache(sys.argv[2:])
    elif command == "weight-quality":
        from perf.weight_quality import main as weight_quality

        weight_quality(sys.argv[2:])
    elif command == "profile":
        from perf.profiling import main as profile

        profile(sys.argv[2:])
    else:
        sys.exit(
            "usage: python -m perf knee|bakeoff|chat-batch|profile|latency|packed-rows"
            "|engine-ops|weight-quality|kv-cache|scale --help"
            " | python -m perf texts"
        )


if __name__ == "__main__":
    main()
