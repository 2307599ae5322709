"""NATS for Shoal: the only package that imports nats-py (an import-linter contract
holds it). `Bus` is a connection; `JetStreamPuller` pulls a durable consumer;
`NatsKeyValue` is a key-value bucket."""

from .bus import Bus, ConsumerState, StoredMessage
from .connect import wait_jetstream
from .kv import NatsKeyValue
from .pull import JetStreamPuller, NatsDelivery

__all__ = [
    "Bus",
    "ConsumerState",
    "JetStreamPuller",
    "NatsDelivery",
    "NatsKeyValue",
    "StoredMessage",
    "wait_jetstream",
]
