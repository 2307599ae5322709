"""The wire contract between gateways and workers: msgpack-encoded msgspec Structs.

Jobs travel on JetStream work subjects; replies on core NATS to the job's `reply_to`;
heartbeats on the heartbeat subject. Every family is a tagged union so a decoder can tell
what it got. Evolution rules (msgspec schema evolution): new fields are added last with a
default, no field is removed or renamed, no tag changes; then old and new processes read
each other's messages (tests/contract/test_wire_evolution.py).

Vectors are raw little-endian bytes (`data`), `rows x dims` of `dtype`, never lists of
floats.
"""

from __future__ import annotations

import enum
from typing import Literal

import msgspec

__all__ = [
    "OP_OF_JOB",
    "ChatTurn",
    "ChoiceDelta",
    "ClassifyJob",
    "ClassifyResult",
    "EmbedJob",
    "EmbedResult",
    "Entity",
    "ErrorKind",
    "GenerateChunk",
    "GenerateJob",
    "Job",
    "JobFailed",
    "JobHeader",
    "LabelScore",
    "MultiVectorJob",
    "MultiVectorResult",
    "NerJob",
    "NerResult",
    "Reply",
    "RerankJob",
    "Result",
    "Sampling",
    "ScoresResult",
    "TokenLogprob",
    "WorkerHeartbeat",
    "decode_heartbeat",
    "decode_job",
    "decode_job_header",
    "decode_reply",
    "encode",
]

Dtype = Literal["float32", "float16"]


class ErrorKind(enum.StrEnum):
    INVALID_INPUT = "invalid_input"
    """The request can never succeed as sent (e.g. too long with truncation off)."""
    DEADLINE_EXCEEDED = "deadline_exceeded"
    """The job's deadline passed before it ran; it was dropped, not run."""
    NOT_FOUND = "not_found"
    """The job names something the worker's registry does not have (an adapter)."""
    UNAVAILABLE = "unavailable"
    """The worker cannot serve the model now (failed to load)."""
    INTERNAL = "internal"
    """The worker failed running it; the message says no more than the kind of failure."""


class _Wire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


class EmbedJob(_Wire, tag="embed"):
    request_id: str
    part: int
    """Position of this item among the request's items; replies are reassembled by it."""
    model: str
    reply_to: str
    deadline: float
    """Unix time after which nobody waits for the answer."""
    texts: list[str] = []
    token_ids: list[list[int]] = []
    """Pre-tokenized inputs (the model's own vocabulary), instead of `texts`."""
    dimensions: int = 0
    """Keep the first `dimensions` components and re-normalize; 0 keeps all."""
    truncate: bool = True
    """Cut inputs longer than the model's max length; False makes them an error."""
    dtype: Dtype = "float32"
    first_index: int = 0
    """Position of this item's first input in the request, for error messages."""
    adapter: str = ""
    """A LoRA adapter of the model to run with; empty: the base model."""


class MultiVectorJob(_Wire, tag="multivector"):
    request_id: str
    part: int
    model: str
    reply_to: str
    deadline: float
    texts: list[str]
    truncate: bool = True
    normalize: bool = True
    skip_special: bool = True
    """Leave out special tokens ([CLS], [SEP], ...)."""
    skip_punctuation: bool = False
    dtype: Dtype = "float32"
    first_index: int = 0
    adapter: str = ""
    """A LoRA adapter of the model to run with; empty: the base model."""


class NerJob(_Wire, tag="ner"):
    request_id: str
    part: int
    model: str
    reply_to: str
    deadline: float
    texts: list[str]
    aggregation: Literal["none", "simple", "first", "max", "average"] = "simple"
    labels: list[str] = []
    """Keep only entities with these labels; empty keeps all but `O`."""
    threshold: float = 0.0
    first_index: int = 0
    adapter: str = ""
    """A LoRA adapter of the model to run with; empty: the base model."""


class ClassifyJob(_Wire, tag="classify"):
    request_id: str
    part: int
    model: str
    reply_to: str
    deadline: float
    texts: list[str]
    top_k: int = 0
    """Labels per text, best first; 0 keeps all."""
    truncate: bool = True
    first_index: int = 0
    adapter: str = ""
    """A LoRA adapter of the model to run with; empty: the base model."""


class RerankJob(_Wire, tag="rerank"):
    request_id: str
    part: int
    model: str
    reply_to: str
    deadline: float
    query: str
    documents: list[str]
    truncate: bool = True
    first_index: int = 0
    adapter: str = ""
    """A LoRA adapter of the model to run with; empty: the base model."""


class ChatTurn(_Wire, tag="turn"):
    role: Literal["system", "developer", "user", "assistant"]
    content: str


class Sampling(_Wire, tag="sampling"):
    """How to sample, as the OpenAI parameters say it (the gateway has validated them)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    """Always set: the gateway picks one when the request has none, so a redelivered job
    regenerates the text already streamed (the gateway checks that it does)."""
    stop: list[str] = []
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0
    json_schema: str = ""
    """A JSON schema (JSON text) the output must match; `{"type": "object"}` for json_object."""


class GenerateJob(_Wire, tag="generate"):
    request_id: str
    part: int
    model: str
    reply_to: str
    deadline: float
    messages: list[ChatTurn] = []
    """A chat: the worker applies the model's chat template."""
    prompt: str = ""
    """A completion prompt, used as is."""
    n: int = 1
    """Choices to generate from this prompt; their indexes start at `first_index`."""
    sampling: Sampling = Sampling()
    echo: bool = False
    first_index: int = 0
    adapter: str = ""
    """A LoRA adapter of the model to run with; empty: the base model."""


Job = EmbedJob | MultiVectorJob | NerJob | ClassifyJob | RerankJob | GenerateJob

OP_OF_JOB: dict[type, str] = {
    EmbedJob: "embed",
    MultiVectorJob: "multivector",
    NerJob: "ner",
    ClassifyJob: "classify",
    RerankJob: "rerank",
    GenerateJob: "generate",
}
"""The op (subject token, batcher key) each job type is."""


class EmbedResult(_Wire, tag="embed_result"):
    request_id: str
    part: int
    data: bytes
    rows: int
    dims: int
    dtype: Dtype = "float32"
    prompt_tokens: int = 0
    queue_ms: float = 0.0
    """From publish to the worker's pull."""
    inference_ms: float = 0.0
    """From the pull to the result (batching, forward pass, post-processing)."""


class MultiVectorResult(_Wire, tag="multivector_result"):
    """Each text's token vectors, concatenated: `counts[i]` rows for text i, `dims` wide."""

    request_id: str
    part: int
    data: bytes
    counts: list[int]
    dims: int
    dtype: Dtype = "float32"
    prompt_tokens: int = 0
    queue_ms: float = 0.0
    inference_ms: float = 0.0


class Entity(_Wire, tag="entity"):
    label: str
    start: int
    """Character offsets into the original text: `text[start:end]` is the entity."""
    end: int
    score: float


class NerResult(_Wire, tag="ner_result"):
    request_id: str
    part: int
    entities: list[list[Entity]]
    prompt_tokens: int = 0
    queue_ms: float = 0.0
    inference_ms: float = 0.0


class LabelScore(_Wire, tag="label"):
    label: str
    score: float


class ClassifyResult(_Wire, tag="classify_result"):
    request_id: str
    part: int
    labels: list[list[LabelScore]]
    prompt_tokens: int = 0
    queue_ms: float = 0.0
    inference_ms: float = 0.0


class ScoresResult(_Wire, tag="scores_result"):
    """One relevance score per document of a rerank item, in the item's order."""

    request_id: str
    part: int
    scores: list[float]
    prompt_tokens: int = 0
    queue_ms: float = 0.0
    inference_ms: float = 0.0


class TokenLogprob(_Wire, tag="logprob"):
    token: str
    logprob: float
    bytes: list[int]
    top: list[tuple[str, float, list[int]]] = []
    """The most likely tokens at this position: (token, logprob, UTF-8 bytes)."""


class ChoiceDelta(_Wire, tag="delta"):
    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = []
    finish_reason: str = ""
    """Set on a choice's last delta: `stop` or `length`."""


class GenerateChunk(_Wire, tag="gen_chunk"):
    """Part of a generation, in order: `seq` counts an attempt's chunks from 0. A job
    redelivered after a crash starts a new `attempt`; the gateway forwards only text
    past what it already sent, after checking the new attempt reproduces it."""

    request_id: str
    part: int
    attempt: str
    seq: int
    deltas: list[ChoiceDelta] = []
    done: bool = False
    """The last chunk of the job: usage is final."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt: str = ""
    """The prompt as the model saw it, on the first chunk when the job asked to echo."""


class JobFailed(_Wire, tag="failed"):
    request_id: str
    part: int
    kind: ErrorKind
    message: str
    param: str = ""


Result = EmbedResult | MultiVectorResult | NerResult | ClassifyResult | ScoresResult
Reply = (
    EmbedResult
    | MultiVectorResult
    | NerResult
    | ClassifyResult
    | ScoresResult
    | GenerateChunk
    | JobFailed
)


class WorkerHeartbeat(_Wire, tag="heartbeat"):
    worker_id: str
    models: list[str]
    """What the worker serves: model ids, or `*` for every registered model."""
    state: Literal["loading", "ready", "stopping"]
    sent_at: float
    resident: list[str] = []
    """Models loaded in memory now."""
    resident_bytes: int = 0
    memory_budget: int = 0
    loads: int = 0
    evictions: int = 0
    batch_max: int = 0
    """Generation: the largest batch one decode step has run."""
    active: int = 0
    """Generation: sequences running or waiting for a slot now."""


class JobHeader(msgspec.Struct):
    """The fields every job has: enough to answer one that cannot be decoded in full
    (an unknown tag from a newer gateway, a corrupt field) instead of leaving its
    request to time out."""

    request_id: str
    part: int
    reply_to: str


_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode
decode_job = msgspec.msgpack.Decoder(Job).decode
decode_job_header = msgspec.msgpack.Decoder(JobHeader).decode
decode_reply = msgspec.msgpack.Decoder(Reply).decode
decode_heartbeat = msgspec.msgpack.Decoder(WorkerHeartbeat).decode
