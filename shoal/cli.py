"""The `shoal` command: serve | gateway | worker | batch | embed | keys | tune."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from . import __version__
from .batch_cli import add_batch_commands, run_batch_command
from .config import Settings, load_settings
from .embed_cli import add_embed_command
from .keys_cli import add_keys_command, run_keys_command
from .logs import configure_logging
from .tune.cli import add_tune_command

if TYPE_CHECKING:
    from .supervisor import Topology

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shoal", description=__doc__)
    parser.add_argument("--version", action="version", version=f"shoal {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="settings file (TOML or JSON)")
        p.add_argument("--log-level", help="debug, info, warning, error")

    serve = sub.add_parser(
        "serve",
        help="run everything locally: nats-server, workers, gateway",
        description="Run everything locally: an embedded nats-server, one encoder worker"
        " (--workers), one generation worker (SHOAL_SERVE_GENERATION=false leaves it out;"
        " its first start exports the chat model, a minute or more) and the gateway. The"
        " log says 'shoal: ready on URL' for each model as it becomes ready.",
    )
    common(serve)
    serve.add_argument("--host", help="gateway address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="gateway port (default 8000)")
    serve.add_argument("--models", help="comma-separated model ids for the worker")
    serve.add_argument(
        "--demo",
        action="store_true",
        help="also serve tiny demo models (random heads on MiniLM) for NER, rerank, score,"
        " classify, sparse and multi-vector: demo-ner, demo-reranker, demo-classifier,"
        " demo-splade, demo-colbert; built once into the data dir (SHOAL_DEMO=true)",
    )
    serve.add_argument("--workers", type=int, default=1, help="encoder workers (default 1)")
    serve.add_argument(
        "--gateways", type=int, default=1, help="gateways, on --port and the ports after it"
    )
    serve.add_argument(
        "--nats-nodes",
        type=int,
        default=1,
        help="1: one nats-server (default); 3: a local cluster, streams replicated 3 times",
    )

    gateway = sub.add_parser("gateway", help="run the HTTP gateway against a NATS server")
    common(gateway)
    gateway.add_argument("--host")
    gateway.add_argument("--port", type=int)
    gateway.add_argument("--nats-url")

    worker = sub.add_parser("worker", help="run a worker against a NATS server")
    common(worker)
    worker.add_argument(
        "--kind",
        choices=["encode", "generate"],
        default="encode",
        help="encoder tasks (default) or text generation",
    )
    worker.add_argument("--models", help="comma-separated model ids")
    worker.add_argument("--nats-url")
    worker.add_argument("--device", help="auto, cpu, cuda, cuda:N")
    add_batch_commands(sub)
    add_embed_command(sub)
    add_keys_command(sub)
    add_tune_command(sub, common)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    settings = load_settings(args.config)
    if args.log_level:
        settings.log_level = args.log_level
    if getattr(args, "host", None):
        settings.gateway.host = args.host
    if getattr(args, "port", None):
        settings.gateway.port = args.port
    if getattr(args, "nats_url", None):
        settings.nats.url = args.nats_url
    generate = getattr(args, "kind", "encode") == "generate"
    if getattr(args, "models", None):
        models = [m for m in args.models.split(",") if m]
        if generate:
            settings.generator.models = models
        else:
            settings.worker.models = models
    if getattr(args, "demo", False):
        settings.demo = True
    if getattr(args, "device", None):
        settings.worker.device = settings.generator.device = args.device
    return settings


def _topology(args: argparse.Namespace) -> Topology:
    from .supervisor import Topology

    return Topology(workers=args.workers, gateways=args.gateways, nats_nodes=args.nats_nodes)


def _check_exposure(settings: Settings) -> str:
    from .api.keys import check_exposure  # the gateway's code; workers need not load it

    return check_exposure(settings)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "batch":
        return run_batch_command(args)
    if args.command == "keys":
        return run_keys_command(args)
    if args.command == "embed":
        from .embed_cli import run_embed_command

        return run_embed_command(args)
    try:
        settings = _settings(args)
        exposure = _check_exposure(settings) if args.command in ("serve", "gateway") else ""
        topology = _topology(args) if args.command == "serve" else None
    except (ValueError, OSError) as exc:
        print(f"shoal: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    if exposure:
        level = logging.INFO if settings.auth.configured else logging.WARNING
        logging.getLogger("shoal").log(level, exposure)
    if args.command == "tune":
        from .tune.cli import run_tune_command

        return run_tune_command(args, settings)
    if args.command == "serve":
        from .supervisor import serve

        return serve(settings, topology)
    if args.command == "gateway":
        from .api.server import run_gateway

        run_gateway(settings)
        return 0
    if args.kind == "generate":
        from .workers.generation.main import run_generation_worker

        run_generation_worker(settings)
        return 0
    from .workers.main import run_worker

    run_worker(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
