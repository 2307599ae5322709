"""A TEST DOUBLE of SGLang's native HTTP server, not SGLang.

sglang cannot be installed here (it pins a CUDA torch), so Shoal's SGLang runtime is
tested against this stand-in for the part of SGLang's documented API it uses
(docs.sglang.io basic_usage/native_api and sampling_params; see shoal/workers/generation/
sglang.py): `GET /health` (503 while starting, then 200), `POST /generate` streaming
`data: {text, output_ids, meta_info}` events with cumulative text and a final
`meta_info.finish_reason` of `{"type": "stop"|"length"|"abort"}` then `data: [DONE]`,
`POST /abort_request {"rid"}`, `POST /load_lora_adapter`, `GET /get_model_info`. It
accepts `launch_server`'s flags (`--model-path --host --port --max-running-requests`),
and a test-only `--double-start-seconds` (how long /health answers 503).

It generates no language: each token is a word picked deterministically from the
prompt's ids, the sampling seed and the adapter, so the same request gives the same text
(as SGLang does with `sampling_seed`). Test-only endpoints under `/double/` report what
it saw and let a test crash it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import time

import uvicorn
from litestar import Litestar, Request, Response, get, post
from litestar.response import Stream

WORDS = [
    "tide",
    "reef",
    "shoal",
    "kelp",
    "gull",
    "wave",
    "drift",
    "coral",
    "sand",
    "foam",
    "current",
    "brine",
    "cove",
    "harbor",
    "pearl",
    "lagoon",
]
STARTED = time.monotonic()
STATE = {"requests": [], "aborted": set(), "running": 0, "max_running": 0, "loras": {}}
ABORTS: dict[str, asyncio.Event] = {}
ARGS = argparse.Namespace()


@get("/health")
async def health() -> Response:
    ready = time.monotonic() - STARTED > ARGS.double_start_seconds
    return Response(b"", status_code=200 if ready else 503)


@get("/get_model_info")
async def model_info() -> dict:
    return {"model_path": ARGS.model_path, "is_generation": True}


@post("/load_lora_adapter", status_code=200, sync_to_thread=False)
def load_lora(data: dict) -> Response:
    if not os.path.exists(data.get("lora_path", "")):
        return Response({"success": False, "error_message": "no such path"}, status_code=400)
    STATE["loras"][data["lora_name"]] = data["lora_path"]
    return Response({"success": True, "error_message": None, "loaded_adapters": STATE["loras"]})


@post("/abort_request", status_code=200)
async def abort(data: dict) -> Response:
    rid = data.get("rid", "")
    STATE["aborted"].add(rid)
    for known, event in ABORTS.items():
        if known.startswith(rid) and rid:
            event.set()
    return Response(b"", status_code=200)


@get("/double/stats")
async def stats() -> dict:
    return {
        "requests": STATE["requests"],
        "aborted": sorted(STATE["aborted"]),
        "max_running": STATE["max_running"],
        "loras": STATE["loras"],
        "pid": os.getpid(),
    }


@post("/double/crash")
async def crash() -> None:
    os._exit(3)


def _word(ids: list[int], seed: int, lora: str, step: int) -> int:
    digest = hashlib.sha256(f"{ids}|{seed}|{lora}|{step}".encode()).digest()
    return digest[0] % len(WORDS)


@post("/generate", status_code=200)
async def generate(request: Request) -> Response | Stream:
    body = await request.json()
    ids = body.get("input_ids") or []
    if not ids:
        return Response({"error": {"message": "input_ids is empty"}}, status_code=400)
    lora = body.get("lora_path") or ""
    if lora and lora not in STATE["loras"]:
        return Response(
            {"error": {"message": f"Got LoRA adapter that has never been loaded: {lora}"}},
            status_code=400,
        )
    params = body.get("sampling_params", {})
    rid = body.get("rid", "")
    STATE["requests"].append(
        {
            "rid": rid,
            "sampling_params": params,
            "lora_path": lora,
            "return_logprob": body.get("return_logprob", False),
        }
    )
    abort_event = ABORTS[rid] = asyncio.Event()

    async def events():
        STATE["running"] += 1
        STATE["max_running"] = max(STATE["max_running"], STATE["running"])
        text, out_ids, logprobs = "", [], []
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        finish = None
        try:
            for step in range(params.get("max_new_tokens", 128)):
                await asyncio.sleep(0.015)
                if abort_event.is_set():
                    finish = {"type": "abort", "message": "Abort by user"}
                    break
                token = _word(ids, params.get("sampling_seed") or 0, lora, step)
                text += " " + WORDS[token]
                out_ids.append(token)
                logprobs.append([-0.5, token, " " + WORDS[token]])
                hit = next((s for s in stops if s in text), None)
                if hit is not None:
                    text = text[: text.index(hit)]
                    finish = {"type": "stop", "matched": hit}
                    break
                if step == params.get("max_new_tokens", 128) - 1:
                    finish = {"type": "length", "length": step + 1}
                else:
                    yield _event(text, out_ids, ids, None, logprobs, rid)
            yield _event(text, out_ids, ids, finish, logprobs, rid)
            yield b"data: [DONE]\n\n"
        finally:
            STATE["running"] -= 1
            ABORTS.pop(rid, None)

    return Stream(events(), media_type="text/event-stream")


def _event(text, out_ids, ids, finish, logprobs, rid) -> bytes:
    meta = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": len(ids),
        "completion_tokens": len(out_ids),
        "cached_tokens": 0,
        "output_token_logprobs": logprobs,
        "output_top_logprobs": [[entry] for entry in logprobs],
    }
    return (
        b"data: "
        + json.dumps({"text": text, "output_ids": out_ids, "meta_info": meta}).encode()
        + b"\n\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--max-running-requests", type=int, default=0)
    # Test-only: how long /health answers 503 (a large model loading, say).
    parser.add_argument("--double-start-seconds", type=float, default=0.5)
    known, _ = parser.parse_known_args(namespace=ARGS)
    app = Litestar([health, model_info, load_lora, abort, stats, crash, generate])
    uvicorn.run(app, host=known.host, port=known.port, log_level="warning")


if __name__ == "__main__":
    main()
