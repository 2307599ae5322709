"""A finished job's rows to its reply, one function per op (numpy, no model calls)."""

from __future__ import annotations

import time

import numpy as np

from ...queue.messages import (
    ClassifyJob,
    ClassifyResult,
    EmbedJob,
    EmbedResult,
    LabelScore,
    MultiVectorJob,
    MultiVectorResult,
    NerJob,
    NerResult,
    RerankJob,
    Result,
    ScoresResult,
    SparseJob,
    SparseResult,
)
from ..adapters.base import EncoderAdapter
from ..ner import Window, entities_for_text
from .held import EncoderHeld

__all__ = ["build_result"]


def build_result(held: EncoderHeld, adapter: EncoderAdapter) -> Result:
    job = held.job
    timing = _timing(held)
    match job:
        case EmbedJob():
            return _embed(held, adapter, timing)
        case MultiVectorJob():
            return _multivector(held, adapter, timing)
        case NerJob():
            return _ner(held, adapter, timing)
        case ClassifyJob():
            return _classify(held, adapter, timing)
        case SparseJob():
            return _sparse(held, timing)
        case RerankJob():
            return ScoresResult(
                request_id=job.request_id,
                part=job.part,
                scores=_relevance(np.stack(held.outputs), adapter).tolist(),
                **timing,
            )
    raise TypeError(f"no result for {type(job).__name__}")


def _sparse(held: EncoderHeld, timing: dict) -> SparseResult:
    """Each row's nonzero weights (over `threshold`; the `top_k` largest), by index."""
    job: SparseJob = held.job
    ids, values, counts = [], [], []
    for row in held.outputs:
        kept = np.flatnonzero(row > max(job.threshold, 0.0))
        if job.top_k and len(kept) > job.top_k:
            kept = np.sort(kept[np.argpartition(-row[kept], job.top_k - 1)[: job.top_k]])
        ids.append(kept.astype("<i4"))
        values.append(row[kept].astype("<f4"))
        counts.append(len(kept))
    return SparseResult(
        request_id=job.request_id,
        part=job.part,
        indices=np.concatenate(ids).tobytes() if ids else b"",
        values=np.concatenate(values).tobytes() if values else b"",
        counts=counts,
        **timing,
    )


def _timing(held: EncoderHeld) -> dict:
    now = time.time()
    return {
        "prompt_tokens": held.prompt_tokens,
        "queue_ms": max(0.0, (held.pulled_at - held.delivery.published_at) * 1000),
        "inference_ms": (now - held.pulled_at) * 1000,
    }


def _as_dtype(array: np.ndarray, dtype: str) -> bytes:
    return np.ascontiguousarray(array, dtype="<f2" if dtype == "float16" else "<f4").tobytes()


def _normalized(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-12)


def _embed(held: EncoderHeld, adapter: EncoderAdapter, timing: dict) -> EmbedResult:
    """`dimensions` applied (re-normalized), cast to the asked dtype."""
    job = held.job
    vectors = np.stack(held.outputs)
    if job.dimensions and job.dimensions < vectors.shape[1]:
        vectors = vectors[:, : job.dimensions]
        if adapter.spec.normalize:
            vectors = _normalized(vectors)
    return EmbedResult(
        request_id=job.request_id,
        part=job.part,
        data=_as_dtype(vectors, job.dtype),
        rows=vectors.shape[0],
        dims=vectors.shape[1],
        dtype=job.dtype,
        row_tokens=[len(tok.ids) for tok in held.tokens],
        **timing,
    )


def _multivector(held: EncoderHeld, adapter: EncoderAdapter, timing: dict) -> MultiVectorResult:
    job: MultiVectorJob = held.job
    punctuation = getattr(adapter, "punctuation", None)
    kept = []
    for tok, matrix in zip(held.tokens, held.outputs, strict=True):
        keep = np.ones(len(tok.ids), dtype=bool)
        if job.skip_special and tok.special is not None:
            keep &= ~tok.special
        if job.skip_punctuation and punctuation is not None:
            keep &= ~punctuation[tok.ids]
        rows = matrix[keep]
        kept.append(_normalized(rows) if job.normalize else rows)
    dims = held.outputs[0].shape[1]
    data = np.concatenate(kept) if kept else np.zeros((0, dims), np.float32)
    return MultiVectorResult(
        request_id=job.request_id,
        part=job.part,
        data=_as_dtype(data, job.dtype),
        counts=[len(k) for k in kept],
        dims=dims,
        dtype=job.dtype,
        **timing,
    )


def _ner(held: EncoderHeld, adapter, timing: dict) -> NerResult:
    job: NerJob = held.job
    table = adapter.label_table
    windows: list[list[Window]] = [[] for _ in job.texts]
    for tok, logits in zip(held.tokens, held.outputs, strict=True):
        windows[tok.source].append(Window(logits, tok.ids, tok.offsets, tok.special))
    tokenizer = adapter.tokenizer
    entities = [
        entities_for_text(
            text,
            text_windows,
            table,
            job.aggregation,
            adapter.token_lengths,
            tokenizer.continuing_subword_prefix is not None,
            tokenizer.unk_id,
            job.labels,
            job.threshold,
        )
        for text, text_windows in zip(job.texts, windows, strict=True)
    ]
    return NerResult(request_id=job.request_id, part=job.part, entities=entities, **timing)


def _probabilities(logits: np.ndarray, adapter) -> np.ndarray:
    """As transformers' text-classification pipeline: sigmoid for one label or multi-label
    models, softmax otherwise."""
    if logits.shape[-1] == 1 or adapter.problem_type == "multi_label_classification":
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _classify(held: EncoderHeld, adapter, timing: dict) -> ClassifyResult:
    job: ClassifyJob = held.job
    probs = _probabilities(np.stack(held.outputs), adapter)
    order = np.argsort(-probs, axis=1, kind="stable")
    if job.top_k:
        order = order[:, : job.top_k]
    labels = [
        [LabelScore(label=adapter.labels[k], score=float(row[k])) for k in ranks]
        for row, ranks in zip(probs, order, strict=True)
    ]
    return ClassifyResult(request_id=job.request_id, part=job.part, labels=labels, **timing)


def _relevance(logits: np.ndarray, adapter) -> np.ndarray:
    """A cross-encoder's relevance: the sigmoid of its one logit (as sentence-transformers'
    CrossEncoder), or the last class's probability for a two-class head."""
    probs = _probabilities(logits, adapter)
    return probs[:, -1]
