"""Shoal: an OpenAI-compatible server for fleets of small models, over NATS JetStream."""

__version__ = "0.1.0"
