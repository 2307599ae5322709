"""`shoal tune MODEL`: measure batching profiles on a live worker and keep the best.

A private stack on loopback (nats-server, one worker for MODEL, one gateway) serves the
model the way production does. Each candidate profile is set through the live registry,
so the same encoder worker picks it up without a restart (a dtype or engine change
restarts it: both are fixed at load), and is measured with the knee method (`knee.find_knee`):
throughput where the worker stops keeping up, and latency there. `search.search` chooses
which candidates to spend the budget on. bf16 is a candidate only where it is fast (a
GPU, or a CPU with native bf16) and keeps every vector within `QUALITY_FLOOR` of float32
in every engine searched; the OpenVINO engine is a candidate on a CPU where it is
installed.

Generation models are tuned on the sequences decoded together (`max_batch_items`, the
continuous batch): the generation worker sizes its runtime at load, so each candidate
restarts it. Their unit is generated tokens, their load short chat turns.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..config import Settings
from ..model_registry import BatchProfile, LiveRegistry, ModelRegistry, ModelSpec
from ..model_registry.sources import SourceResolver, resolve_source
from ..queue.errors import QueueUnavailableError
from ..queue.nats import Bus
from . import texts
from .knee import Knee, find_knee
from .progress import duration
from .search import Knob, Trial, confirm, mean_scores, search
from .stack import TuneStack, chat_load, embed_load

__all__ = ["TuneResult", "knobs_for", "tune"]

log = logging.getLogger("shoal.tune")

WORKLOADS = {"short": 8, "passages": 2, "mixed": 8}
"""Text set: texts per request (a file's texts go 8 to a request); chat sends one."""
CONFIRM_SHARE = 0.2
"""Of the search's budget, what is kept to measure the best candidates again."""
FRACTIONS = (0.6, 0.8, 1.0, 1.15)
"""Offered load per step, as a share of the probed capacity: fewer and shorter steps than
`perf knee`, since a tune measures many candidates of one server."""


@dataclass
class TuneResult:
    model: str
    trials: list[Trial]
    """Every measurement, in order: the search's, then the `confirm` runs."""
    winner: dict[str, Any]
    """The candidate with the best mean score over its runs."""
    profile: BatchProfile
    """The winning profile, complete."""
    quality: dict[str, float] | None
    """Worst and mean cosine to float32 torch over the dtypes and engines checked (bf16,
    OpenVINO) before the search, when any was."""
    elapsed_s: float
    unit: str
    """What the score counts per second: texts (embeddings) or tokens (generation)."""
    search_budget_s: float = 0.0
    """What the search had of the budget, after start-up and less the confirm share."""

    def score(self, candidate: dict[str, Any]) -> float:
        """The mean score of `candidate`'s runs."""
        key = sorted(candidate.items())
        return next(m for c, m in mean_scores(self.trials) if sorted(c.items()) == key)

    @property
    def default(self) -> dict[str, Any]:
        return self.trials[0].candidate

    @property
    def gain(self) -> float:
        """The winner's throughput over the default profile's (1.0: no better)."""
        default = self.score(self.default)
        return self.score(self.winner) / default if default else 0.0


def knobs_for(
    profile: BatchProfile,
    cores: int,
    dtypes: tuple[str, ...],
    engines: tuple[str, ...] = ("torch",),
) -> list[Knob]:
    """The encoder knobs worth searching, around `profile`."""
    threads = sorted({1, max(1, cores // 2), cores} | ({profile.threads} - {0}))
    return [
        Knob("max_batch_tokens", (2048, 4096, 8192, 16384, 32768)),
        Knob("max_batch_items", (16, 32, 64, 128, 256)),
        Knob("max_wait_ms", (0.0, 1.0, 2.0, 5.0, 10.0)),
        Knob("threads", tuple(threads)),
        Knob("dtype", dtypes, restart=True),
        Knob("engine", engines, restart=True),
    ]


GENERATION_KNOBS = [Knob("max_batch_items", (2, 4, 8, 16, 32, 64, 128), restart=True)]


def _profile(base: BatchProfile, candidate: dict[str, Any]) -> BatchProfile:
    return msgspec.structs.replace(base, **candidate)


def _candidate(profile: BatchProfile, cores: int, generate: bool) -> dict[str, Any]:
    if generate:
        return {"max_batch_items": profile.max_batch_items}
    return {
        "max_batch_tokens": profile.max_batch_tokens,
        "max_batch_items": profile.max_batch_items,
        "max_wait_ms": profile.max_wait_ms,
        "threads": profile.threads or cores,
        "dtype": profile.dtype,
        "engine": profile.engine,
    }


def _fast_dtypes(device: str) -> tuple[str, ...]:
    """bf16 joins float32 where the worker would serve it as asked (a GPU, or a CPU with
    native bf16)."""
    from ..workers.adapters.cpu import runs_natively

    return tuple(d for d in ("float32", "bfloat16") if runs_natively(d, device))


def _engines(device: str) -> tuple[str, ...]:
    """OpenVINO joins torch on a CPU where it is installed."""
    from ..workers.adapters import _openvino

    return ("torch", "openvino") if device == "cpu" and _openvino.available() else ("torch",)


def _guarded(
    settings: Settings,
    spec: ModelSpec,
    sample: list[str],
    dtypes: tuple[str, ...],
    engines: tuple[str, ...],
    say: Callable[[str], None],
) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, float] | None]:
    """The dtypes and engines whose vectors stay within `QUALITY_FLOOR` of float32 torch
    (the spec's own always stay), and the worst and mean cosine of those checked."""
    from ..workers.quality import QUALITY_FLOOR, cosine_to, float32_vectors

    @functools.cache
    def reference() -> tuple[str, np.ndarray]:
        """The model's files and its float32 vectors: found and computed once, and only
        when something is checked."""
        cache = SourceResolver(settings.cache_path, settings.s3)
        path = resolve_source(spec, cache)
        return path, float32_vectors(spec, path, sample)

    def quality(dtype: str, engine: str) -> tuple[float, float]:
        say(f"checking {dtype} on {engine} against float32 torch ({len(sample)} texts)")
        path, vectors = reference()
        profile = msgspec.structs.replace(spec.profile, dtype=dtype, engine=engine)
        checked = msgspec.structs.replace(spec, profile=profile)
        return cosine_to(vectors, checked, path, sample, cache_dir=settings.cache_path)

    checked = []
    for engine in engines:
        if engine != spec.profile.engine:
            checked.append(score := quality("float32", engine))
            if score[0] < QUALITY_FLOOR:
                engines = tuple(e for e in engines if e != engine)
    if "bfloat16" in dtypes and spec.profile.dtype != "bfloat16":
        scores = [quality("bfloat16", engine) for engine in engines]
        checked += scores
        if min(scores)[0] < QUALITY_FLOOR:
            dtypes = tuple(d for d in dtypes if d != "bfloat16")
    if not checked:
        return dtypes, engines, None
    worst, mean = min(checked)
    return dtypes, engines, {"worst": worst, "mean": mean}


async def tune(
    settings: Settings,
    model: str,
    *,
    workload: str = "short",
    budget_s: float = 600.0,
    p99_ms: float = 0.0,
    step_seconds: float = 0.0,
    keep_dtype: bool = False,
    on_trial: Callable[[Trial], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> TuneResult:
    """Search `model`'s batching profile for `budget_s` seconds (everything included).

    Raises:
        UnknownModelError: no such model.
        ValueError: a model `shoal tune` cannot tune (neither `embed` nor `generate`), or a
            workload file without text.

    `p99_ms` bounds the knee's latency; 0: 1 s for embeddings, 10 s for generation.
    `step_seconds` is each load step's length (0: 2 s, chat 10 s). `keep_dtype` searches
    with the spec's dtype only (its vectors stay as they are). `on_phase` hears of each
    phase as it starts (a line of text), `on_trial` of each trial as it ends.
    """
    started = time.monotonic()
    say = on_phase or (lambda text: None)
    spec = ModelRegistry.from_files(*settings.spec_files).resolve(model)
    generate = "generate" in spec.tasks
    if not generate and "embed" not in spec.tasks:
        raise ValueError(f"{spec.id} serves neither embed nor generate: nothing to measure")
    say(f"tuning {spec.id} on the {workload} workload")
    if workload in WORKLOADS:
        sample, per_request = texts.generate(workload), WORKLOADS[workload]
    else:
        sample, per_request = texts.from_file(workload), 8
    cores = os.cpu_count() or 1
    quality = None
    if generate:
        knobs = GENERATION_KNOBS
    else:
        from ..workers.adapters.sentence_transformers import pick_device

        device = pick_device(settings.worker.device)
        dtypes = (spec.profile.dtype,) if keep_dtype else _fast_dtypes(device)
        installed = _engines(device)
        # `auto` serves the last installed engine (OpenVINO on a CPU) unless its guard
        # fails at load; the search starts from what is served.
        current = installed[-1] if spec.profile.engine == "auto" else spec.profile.engine
        engines = tuple(dict.fromkeys((current, *installed)))
        dtypes, engines, quality = _guarded(settings, spec, sample[:128], dtypes, engines, say)
        if spec.profile.dtype not in dtypes:
            dtypes = (*dtypes, spec.profile.dtype)
        knobs = knobs_for(spec.profile, cores, dtypes, engines)

    run_dir = Path(tempfile.mkdtemp(prefix="shoal-tune-"))
    stack = TuneStack(settings, spec, run_dir)
    try:
        say(f"starting nats-server, a gateway and a worker for {spec.id}")
        await stack.start()
        if generate:
            load = chat_load(stack.base, spec.id, sample)
        else:
            load = embed_load(stack.base, spec.id, sample, per_request)
        async with load.client() as client:
            say(f"loading {spec.id} in the worker (until it answers)")
            await stack.wait_served(load, client)
            default = _candidate(spec.profile, cores, generate)
            served = dict(default)

            async def measure(candidate: dict[str, Any]) -> tuple[float, Knee]:
                profile = _profile(spec.profile, candidate)
                # Restart for what a worker fixes at load: the dtype of its weights, its
                # engine, the slots of a generation runtime.
                restart = any(candidate[k.name] != served[k.name] for k in knobs if k.restart)
                if restart:
                    changed = (
                        f"{k.name}={candidate[k.name]}"
                        for k in knobs
                        if k.restart and candidate[k.name] != served[k.name]
                    )
                    say(f"restarting the worker for {' '.join(changed)}")
                await stack.apply(profile, restart)
                served.update(candidate)
                if restart:
                    await stack.wait_served(load, client)
                # A chat answer takes seconds: a short step would count only a few, and
                # its late backlog would pass for throughput.
                step_s = step_seconds or (10.0 if generate else 2.0)
                knee = await find_knee(
                    load,
                    fractions=FRACTIONS,
                    step_seconds=step_s,
                    p99_bound=(p99_ms or (10_000.0 if generate else 1000.0)) / 1000,
                    # The capacity probe of chat: as long as a step, 8 s at most.
                    probe_seconds=min(8.0, step_s) if generate else 2.0,
                    warmup_seconds=1.0,
                    half_knee=False,
                )
                return knee.knee_tps, knee

            search_budget_s = (budget_s - (time.monotonic() - started)) * (1 - CONFIRM_SHARE)
            names = ", ".join(k.name for k in knobs if len(k.values) > 1)
            say(f"searching {names} for {duration(search_budget_s)} (the default first)")
            trials = await search(
                knobs,
                default,
                measure,
                budget_s=search_budget_s,
                on_trial=on_trial,
            )
            confirming = False

            async def again(candidate: dict[str, Any]) -> tuple[float, Knee]:
                nonlocal confirming
                if not confirming:  # said only when a candidate still fits the budget
                    confirming = True
                    say("measuring the best candidates again")
                return await measure(candidate)

            trials += await confirm(trials, again, deadline=started + budget_s, on_trial=on_trial)
    finally:
        await stack.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    winner = mean_scores(trials)[0][0]
    return TuneResult(
        model=spec.id,
        trials=trials,
        winner=winner,
        profile=_profile(spec.profile, winner),
        quality=quality,
        elapsed_s=time.monotonic() - started,
        unit="tokens" if generate else "texts",
        search_budget_s=search_budget_s,
    )


async def publish_profile(settings: Settings, model_id: str, profile: BatchProfile) -> bool:
    """Make `profile` live for every worker on the settings' NATS server; False when that
    server does not answer within a few seconds (the spec file still has it)."""
    try:
        bus = await asyncio.wait_for(Bus.connect(settings.nats, "shoal-tune"), 5.0)
    except (TimeoutError, OSError, QueueUnavailableError) as exc:
        log.info("profile not published: NATS at %s: %r", settings.nats.display_url, exc)
        return False
    try:
        kv = await bus.key_value(settings.nats.registry_bucket)
        registry = LiveRegistry(ModelRegistry.from_files(*settings.spec_files), kv)
        await registry.set_profile(model_id, profile)
        await kv.close()
    finally:
        await bus.close()
    return True
