"""OpenVINO GenAI's pipeline in a process of its own, stepped there, spoken to over a pipe.

Why a process: `ContinuousBatchingPipeline.step()` holds the GIL for the whole step
(measured with openvino-genai 2026.4: a thread sleeping 1 ms beside a 24-sequence step woke
once per step, ~50 ms), so in the worker's process every hop of its event loop (a pull, an
ack, a token published) waited for the running step, and a live request behind a batch
job waited several steps before its first token. Here the step runs in a child process;
the worker's process only sends requests and reads token ids.

The protocol (tuples over a `multiprocessing` pipe, one writer each way):
- to the host: `("add", rid, prompt_ids, fields)`, `("cancel", rid)`, `("stop",)`;
- from the host: `("ready",)` once loaded, or `("failed", message)`; after each
  step `("step", [(rid, token_ids, logprobs, state), ...], batch_size)` where state is
  `running`, `done` or `ignored`; `("refused", rid, message)` for a request the pipeline
  would not take; `("failed", message)` when a step raised (every sequence is dropped).
"""

from __future__ import annotations

import signal
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["host"]


def host(conn: Connection, ir: str, scheduler: dict[str, Any], properties: dict) -> None:
    """The child process's whole life: load the pipeline, then step while there is work."""
    from ...lifecycle import die_with_parent

    die_with_parent()  # the worker's last-resort exit must not leave the pipeline running
    # Ctrl-C reaches the whole process group: the worker stops this process itself (a
    # pipeline killed first would be restarted by the worker while it stops).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import numpy as np
        import openvino as ov
        import openvino_genai as og

        config = og.SchedulerConfig()
        for name, value in scheduler.items():
            setattr(config, name, value)
        pipe = og.ContinuousBatchingPipeline(ir, config, "CPU", properties)
    except Exception as exc:  # the parent turns this into the load's error
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready",))
    handles: dict[int, Any] = {}
    states = {og.GenerationStatus.RUNNING: "running", og.GenerationStatus.IGNORED: "ignored"}
    while True:
        # Block for a message while idle; between steps, take whatever has come.
        while not handles or conn.poll(0):
            message = conn.recv()
            if message[0] == "stop":
                for handle in handles.values():
                    handle.cancel()
                return
            if message[0] == "cancel":
                handle = handles.pop(message[1], None)
                if handle is not None:
                    handle.cancel()  # leaves the batch, frees its KV blocks next step
                continue
            _, rid, ids, fields = message
            try:
                tensor = ov.Tensor(np.asarray([ids], dtype=np.int64))
                handles[rid] = pipe.add_request(rid, tensor, _config(og, fields))
            except Exception as exc:  # one request the pipeline refuses fails alone
                conn.send(("refused", rid, str(exc)))
        try:
            pipe.step()
            out = []
            for rid, handle in list(handles.items()):
                status = handle.get_status()
                tokens: list[int] = []
                logprobs: list[float] = []
                if handle.can_read():
                    for output in handle.read().values():
                        tokens += list(output.generated_ids)
                        logprobs += list(output.generated_log_probs or [])
                state = states.get(status, "done")
                if state != "running":
                    del handles[rid]
                out.append((rid, tokens, logprobs, state))
            conn.send(("step", out, len(out)))
        except Exception as exc:
            for handle in handles.values():
                handle.cancel()
            handles.clear()
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))


def _config(og, fields: dict[str, Any]):
    config = og.GenerationConfig()
    for name, value in fields.items():
        if name == "json_schema":
            config.structured_output_config = og.StructuredOutputConfig(json_schema=value)
        else:
            setattr(config, name, value)
    return config
