"""OpenVINO GenAI's pipeline in a process of its own, stepped there, spoken to over a pipe.

Why a process: `ContinuousBatchingPipeline.step()` holds the GIL for the whole step (a
thread sleeping beside a step wakes only when the step ends: perf/results/README.md), so
in the worker's process every hop of its event loop (a pull, an ack, a token published)
waited for the running step, and a live request behind a batch job waited several steps
before its first token. Here the step runs in a child process; the worker's process only
sends requests and reads token ids.

Speculative decoding for a lone sequence: one sequence reads every weight per token, so
a single stream is bound by memory bandwidth. Where the runtime gives a draft (the same
model with int8 weights), a second pipeline runs it as GenAI's assisted generation: the
draft proposes `tokens` tokens, the full model checks them in one pass and keeps the ones
it would have picked itself, so a greedy answer is the full model's (its gain on one
stream: perf/results/README.md). Checking drafts costs compute a batch needs,
and that pipeline takes only assisted requests, so it serves a sequence only while it is
the only one: a request that may be assisted (greedy, no penalties, no schema: the
runtime decides) goes there when nothing else runs, and as soon as any other sequence
arrives the assisted one moves to the main pipeline, continuing from its prompt and the
tokens it has so far (a greedy continuation of the same text is the same answer).

The messages each way are openvino_protocol.py's.
"""

from __future__ import annotations

import signal
from multiprocessing.connection import Connection
from typing import Any

from .openvino_protocol import (
    Add,
    Cancel,
    Failed,
    Notice,
    Ready,
    Refused,
    SequenceStep,
    Stepped,
    Stop,
    receive_in_host,
    send,
)

__all__ = ["host"]


class _Sequence:
    """A sequence in one of the pipelines: enough to move it to the other."""

    __slots__ = ("assisted", "fields", "generated", "handle", "ids")

    def __init__(self, handle: Any, ids: list[int], fields: dict, assisted: bool) -> None:
        self.handle = handle
        self.ids = ids
        self.fields = fields
        self.assisted = assisted
        self.generated: list[int] = []


def host(
    conn: Connection,
    ir: str,
    scheduler: dict[str, Any],
    properties: dict,
    assist: dict[str, Any] | None = None,
) -> None:
    """The child process's whole life: load the pipelines, then step while there is work.

    `assist`: `{"draft": IR path, "scheduler": {...}, "tokens": n, "properties": {...}}`
    (the draft's compile properties) for the lone-sequence speculative pipeline, or None."""
    from ...lifecycle import die_with_parent

    die_with_parent()  # the worker's last-resort exit must not leave the pipeline running
    # Ctrl-C reaches the whole process group: the worker stops this process itself (a
    # pipeline killed first would be restarted by the worker while it stops).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import numpy as np
        import openvino as ov
        import openvino_genai as og

        pipe = og.ContinuousBatchingPipeline(ir, _scheduler(og, scheduler), "CPU", properties)
    except Exception as exc:  # the parent turns this into the load's error
        send(conn, Failed(f"{type(exc).__name__}: {exc}"))
        return
    assisted = None
    if assist is not None:
        try:
            draft = og.draft_model(assist["draft"], "CPU", **assist["properties"])
            assisted = og.ContinuousBatchingPipeline(
                ir, _scheduler(og, assist["scheduler"]), "CPU", properties | {"draft_model": draft}
            )
        except Exception as exc:  # the main pipeline serves alone
            send(conn, Notice(f"no speculative decoding: {type(exc).__name__}: {exc}"))
    send(conn, Ready(assisted is not None))
    seqs: dict[int, _Sequence] = {}
    drafted = moved = 0  # sequences sent to the draft, and moved from it, since last told
    states = {og.GenerationStatus.RUNNING: "running", og.GenerationStatus.IGNORED: "ignored"}

    def add(rid: int, ids: list[int], fields: dict, to_assisted: bool) -> _Sequence:
        config = _config(og, fields)
        if to_assisted:
            config.num_assistant_tokens = assist["tokens"]
        target = assisted if to_assisted else pipe
        tensor = ov.Tensor(np.asarray([ids], dtype=np.int64))
        return _Sequence(target.add_request(rid, tensor, config), ids, fields, to_assisted)

    def move_assisted() -> None:
        """Another sequence arrived: the assisted one continues in the main pipeline."""
        nonlocal moved
        for rid, seq in list(seqs.items()):
            if not seq.assisted:
                continue
            seq.handle.cancel()
            fields = dict(seq.fields)
            fields["max_new_tokens"] -= len(seq.generated)
            if fields["max_new_tokens"] <= 0:  # all its tokens are out: the runtime ends it
                del seqs[rid]
                continue
            try:
                seqs[rid] = add(rid, seq.ids + seq.generated, fields, False)
            except Exception as exc:  # it fails alone, as a refused request would
                del seqs[rid]
                send(conn, Refused(rid, str(exc)))
                continue
            seqs[rid].generated = seq.generated
            moved += 1
            assisted.step()  # drops the cancelled request, freeing its KV blocks

    while True:
        # Block for a message while idle; between steps, take whatever has come.
        while not seqs or conn.poll(0):
            message = receive_in_host(conn)
            if isinstance(message, Stop):
                for seq in seqs.values():
                    seq.handle.cancel()
                return
            if isinstance(message, Cancel):
                seq = seqs.pop(message.rid, None)
                if seq is not None:
                    seq.handle.cancel()  # leaves the batch, frees its KV blocks next step
                    if seq.assisted:  # that pipeline steps again only for the next one
                        assisted.step()
                continue
            assert isinstance(message, Add)
            try:
                alone = assisted is not None and message.may_assist and not seqs
                if not alone:
                    move_assisted()
                seqs[message.rid] = add(message.rid, message.prompt_ids, message.fields, alone)
                drafted += alone
            except Exception as exc:  # one request the pipeline refuses fails alone
                send(conn, Refused(message.rid, str(exc)))
        try:
            # A drafted sequence only ever runs alone (an arrival moves it): one pipeline.
            drafting = any(s.assisted for s in seqs.values())
            (assisted if drafting else pipe).step()
            out: list[SequenceStep] = []
            for rid, seq in list(seqs.items()):
                status = seq.handle.get_status()
                tokens: list[int] = []
                logprobs: list[float] = []
                if seq.handle.can_read():
                    for output in seq.handle.read().values():
                        tokens += list(output.generated_ids)
                        logprobs += list(output.generated_log_probs or [])
                seq.generated += tokens
                state = states.get(status, "done")
                if state != "running":
                    del seqs[rid]
                out.append(SequenceStep(rid, tokens, logprobs, state))
            send(conn, Stepped(out, drafted, moved))
            drafted = moved = 0
        except Exception as exc:
            for seq in seqs.values():
                seq.handle.cancel()
            seqs.clear()
            send(conn, Failed(f"{type(exc).__name__}: {exc}"))


def _filled(config: Any, fields: dict[str, Any]) -> Any:
    """`config` (one of GenAI's config objects, set by attribute) with `fields` set."""
    for name, value in fields.items():
        setattr(config, name, value)
    return config


def _scheduler(og, fields: dict[str, Any]):
    return _filled(og.SchedulerConfig(), fields)


def _config(og, fields: dict[str, Any]):
    fields = dict(fields)
    schema = fields.pop("json_schema", None)
    config = _filled(og.GenerationConfig(), fields)
    if schema is not None:
        config.structured_output_config = og.StructuredOutputConfig(json_schema=schema)
    return config
