"""The wire contract between gateways and workers: msgpack-encoded msgspec Structs.

Jobs travel on JetStream work subjects; replies on core NATS to the job's `reply_to`
(heartbeats, on the heartbeat subject, are heartbeat.py's). Every family is a tagged
union so a decoder can tell what it got. Evolution rules (msgspec schema evolution): new
fields are added last with a default, no field is removed or renamed, no tag changes;
then old and new processes read each other's messages (tests/contract/test_wire_evolution.py).

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
    "FailureCode",
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
    "PayloadRef",
    "Reply",
    "RerankJob",
    "Result",
    "Sampling",
    "ScoresResult",
    "SparseJob",
    "SparseResult",
    "TokenLogprob",
    "TokenizeJob",
    "TokensResult",
    "decode_job",
    "decode_job_header",
    "decode_job_message",
    "decode_reply",
    "encode",
]

Dtype = Literal["float32", "float16"]


class FailureCode(enum.StrEnum):
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


class _JobCommon(_Wire):
    """Fields every job has."""

    request_id: str
    part: int
    """Position of this item among the request's items; replies are reassembled by it."""
    model: str
    reply_to: str
    deadline: float
    """Unix time after which nobody waits for the answer."""
    first_index: int = 0
    """Position of this item's first input in the request (error messages, choice
    indexes)."""
    adapter: str = ""
    """A LoRA adapter of the model to run with; empty: the base model."""


class _ResultCommon(_Wire):
    """Fields every result has."""

    request_id: str
    part: int
    prompt_tokens: int = 0
    queue_ms: float = 0.0
    """From publish to the worker's pull."""
    inference_ms: float = 0.0
    """From the pull to the result (batching, forward pass, post-processing)."""


class EmbedJob(_JobCommon, tag="embed", kw_only=True):
    texts: list[str] = []
    token_ids: list[list[int]] = []
    """Pre-tokenized inputs (the model's own vocabulary), instead of `texts`."""
    dimensions: int = 0
    """Keep the first `dimensions` components and re-normalize; 0 keeps all."""
    truncate: bool = True
    """Cut inputs longer than the model's max length; False makes them an error."""
    dtype: Dtype = "float32"


class MultiVectorJob(_JobCommon, tag="multivector", kw_only=True):
    texts: list[str]
    truncate: bool = True
    normalize: bool = True
    skip_special: bool = True
    """Leave out special tokens ([CLS], [SEP], ...)."""
    skip_punctuation: bool = False
    dtype: Dtype = "float32"


class NerJob(_JobCommon, tag="ner", kw_only=True):
    texts: list[str]
    aggregation: Literal["none", "simple", "first", "max", "average"] = "simple"
    labels: list[str] = []
    """Keep only entities with these labels; empty keeps all but `O`."""
    threshold: float = 0.0


class ClassifyJob(_JobCommon, tag="classify", kw_only=True):
    texts: list[str]
    top_k: int = 0
    """Labels per text, best first; 0 keeps all."""
    truncate: bool = True


class RerankJob(_JobCommon, tag="rerank", kw_only=True):
    query: str
    documents: list[str]
    truncate: bool = True
    doc_tokens: int = 0
    """Cut each document to this many tokens before pairing it with the query (Cohere
    v2's `max_tokens_per_doc`); 0: only the model's length limit cuts."""


class SparseJob(_JobCommon, tag="sparse", kw_only=True):
    texts: list[str]
    top_k: int = 0
    """Weights kept per text, the largest; 0 keeps every nonzero one."""
    threshold: float = 0.0
    """Weights at or below this are dropped."""
    truncate: bool = True


class ChatTurn(_Wire, tag="turn", kw_only=True):
    role: Literal["system", "developer", "user", "assistant"]
    content: str


class Sampling(_Wire, tag="sampling", kw_only=True):
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


class GenerateJob(_JobCommon, tag="generate", kw_only=True):
    messages: list[ChatTurn] = []
    """A chat: the worker applies the model's chat template."""
    prompt: str = ""
    """A completion prompt, used as is."""
    n: int = 1
    """Choices to generate from this prompt; their indexes start at `first_index`."""
    sampling: Sampling = Sampling()
    echo: bool = False


class TokenizeJob(_JobCommon, tag="tokenize", kw_only=True):
    """The model's own tokens of `texts` (or of `messages` through its chat template);
    with `ids` instead, the texts of those tokens. Any model serves it: its worker holds
    the tokenizer, the gateway never does."""

    texts: list[str] = []
    messages: list[ChatTurn] = []
    add_special_tokens: bool = True
    ids: list[list[int]] = []
    """Token ids to decode, one list per text."""
    skip_special_tokens: bool = True


_EncoderJob = EmbedJob | MultiVectorJob | NerJob | ClassifyJob | RerankJob | SparseJob
Job = _EncoderJob | GenerateJob | TokenizeJob

OP_OF_JOB: dict[type, str] = {
    EmbedJob: "embed",
    MultiVectorJob: "multivector",
    NerJob: "ner",
    ClassifyJob: "classify",
    RerankJob: "rerank",
    SparseJob: "sparse",
    GenerateJob: "generate",
    TokenizeJob: "tokenize",
}
"""The op (subject token, batcher key) each job type is."""


class EmbedResult(_ResultCommon, tag="embed_result", kw_only=True):
    data: bytes
    rows: int
    dims: int
    dtype: Dtype = "float32"
    row_tokens: list[int] = []
    """Tokens of each row's input (their sum is `prompt_tokens`), so a request that
    carries several callers' inputs can give each its own usage."""


class MultiVectorResult(_ResultCommon, tag="multivector_result", kw_only=True):
    """Each text's token vectors, concatenated: `counts[i]` rows for text i, `dims` wide."""

    data: bytes
    counts: list[int]
    dims: int
    dtype: Dtype = "float32"


class Entity(_Wire, tag="entity", kw_only=True):
    label: str
    start: int
    """Character offsets into the original text: `text[start:end]` is the entity."""
    end: int
    score: float


class NerResult(_ResultCommon, tag="ner_result", kw_only=True):
    entities: list[list[Entity]]


class LabelScore(_Wire, tag="label", kw_only=True):
    label: str
    score: float


class ClassifyResult(_ResultCommon, tag="classify_result", kw_only=True):
    labels: list[list[LabelScore]]


class ScoresResult(_ResultCommon, tag="scores_result", kw_only=True):
    """One relevance score per document of a rerank item, in the item's order."""

    scores: list[float]


class SparseResult(_ResultCommon, tag="sparse_result", kw_only=True):
    """Each text's nonzero weights, concatenated: `counts[i]` (index, value) pairs for
    text i, indices ascending; `indices` little-endian int32, `values` float32."""

    indices: bytes
    values: bytes
    counts: list[int]


class TokensResult(_ResultCommon, tag="tokens_result", kw_only=True):
    """A `TokenizeJob`'s answer: per text its ids, vocabulary strings, character spans
    into the text (`(0, 0)` for a special token or a chat) and special-token flags; or,
    for ids, the decoded `texts`."""

    ids: list[list[int]] = []
    tokens: list[list[str]] = []
    spans: list[list[tuple[int, int]]] = []
    special: list[list[bool]] = []
    texts: list[str] = []
    max_length: int = 0
    """The longest input the model takes, in tokens."""


class TokenLogprob(_Wire, tag="logprob", kw_only=True):
    token: str
    logprob: float
    bytes: list[int]
    top: list[tuple[str, float, list[int]]] = []
    """The most likely tokens at this position: (token, logprob, UTF-8 bytes)."""


class ChoiceDelta(_Wire, tag="delta", kw_only=True):
    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = []
    finish_reason: str = ""
    """Set on a choice's last delta: `stop` or `length`."""


class GenerateChunk(_Wire, tag="gen_chunk", kw_only=True):
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


class JobFailed(_Wire, tag="failed", kw_only=True):
    request_id: str
    part: int
    code: FailureCode = msgspec.field(name="kind")
    """Which failure; "kind" on the wire, as older gateways and workers read it."""
    message: str
    param: str = ""


class PayloadRef(_Wire, tag="payload_ref", kw_only=True):
    """Stands for a job or a reply too large for one NATS message: its encoded bytes
    are in the payload store under `key` (see payloads.py). Carries the fields of
    `JobHeader`, so a worker that cannot fetch it can still answer its request."""

    request_id: str
    part: int
    reply_to: str
    key: str
    size: int


_EncoderResult = EmbedResult | MultiVectorResult | NerResult | ClassifyResult | ScoresResult
Result = _EncoderResult | SparseResult | TokensResult
Reply = Result | GenerateChunk | JobFailed | PayloadRef


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
decode_job_message = msgspec.msgpack.Decoder(Job | PayloadRef).decode
"""What a work item's body holds: the job, or a reference to it in the payload store."""
decode_job_header = msgspec.msgpack.Decoder(JobHeader).decode
decode_reply = msgspec.msgpack.Decoder(Reply).decode
