"""For tests/e2e/test_fuzz.py: the OpenAI error-envelope check, raw HTTP over a socket
(for bodies and headers httpx will not send), schemathesis set up against the gateway's
served OpenAPI document, and the tables of hand-written hostile requests (with BUGS, the
known failures they show)."""

from __future__ import annotations

import copy
import json
import re
import socket
import time
from typing import Any

import httpx
import msgspec
import schemathesis

from tests.helpers import GEN_MODEL, MODEL, raw_status

__all__ = [
    "BUGS",
    "CONTENT_TYPE_CASES",
    "ERROR_KEYS",
    "GENERATION_PATHS",
    "MODEL_BY_PATH",
    "MSGPACK_CASES",
    "NESTED_CASES",
    "NUMBER_CASES",
    "TRUNCATED_CASES",
    "UPLOAD_CASES",
    "UTF8_CASES",
    "assert_error_shape",
    "check_error",
    "content_type_of",
    "load_schema",
    "raw_body",
    "raw_http",
    "raw_status",
]

ERROR_KEYS = {"message", "type", "param", "code"}

# The model each route can really run in the `stack` fixture: the fuzz puts it in about
# half the bodies, or nearly every request would stop at 404 model_not_found and the
# workers would never see a fuzzed input.
MODEL_BY_PATH = {
    "/v1/embeddings": MODEL,
    "/v2/embed": MODEL,
    "/native/v1/embed": MODEL,
    "/v1/multivector": MODEL,
    "/native/v1/multivector": MODEL,
    "/v1/chat/completions": GEN_MODEL,
    "/v1/completions": GEN_MODEL,
    "/v1/responses": GEN_MODEL,
    "/v1/ner": "test-ner",
    "/native/v1/ner": "test-ner",
    "/rerank": "test-reranker",
    "/v1/rerank": "test-reranker",
    "/v2/rerank": "test-reranker",
    "/score": "test-reranker",
    "/v1/score": "test-reranker",
    "/v1/classify": "test-classifier",
    "/v1/sparse": "test-splade",
    "/native/v1/sparse": "test-splade",
}
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


def _packable(value: Any) -> Any:
    """`value` as MessagePack can carry it: ints past 64 bits become floats (the format has
    no bigger int) and lone surrogates U+FFFD (it has no way to send them)."""
    if isinstance(value, bool) or value is None or isinstance(value, float | bytes):
        return value
    if isinstance(value, int):
        if -(2**63) <= value < 2**64:
            return value
        return float("inf") if value > 0 else float("-inf")
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode()
    if isinstance(value, dict):
        return {_packable(k): _packable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_packable(v) for v in value]
    return value


@schemathesis.serializer("application/x-msgpack", "application/msgpack")
def _msgpack(_ctx: Any, value: Any) -> bytes:
    return msgspec.msgpack.encode(_packable(value))


def content_type_of(response: httpx.Response | Any) -> str:
    """The content type of an httpx response or a schemathesis one (lists of values)."""
    for name, value in response.headers.items():
        if name.lower() == "content-type":
            return value[0] if isinstance(value, list) else value
    return ""


def assert_error_shape(response: httpx.Response | Any, where: str = "") -> dict:
    """`response` (httpx or requests) carries exactly OpenAI's error envelope; the error."""
    content_type = content_type_of(response)
    assert content_type.startswith("application/json"), f"{where} {content_type}: {response.text}"
    body = json.loads(response.content)
    assert isinstance(body, dict) and set(body) == {"error"}, f"{where} {body}"
    error = body["error"]
    assert isinstance(error, dict) and set(error) == ERROR_KEYS, f"{where} {body}"
    assert isinstance(error["message"], str) and error["message"], f"{where} {body}"
    assert isinstance(error["type"], str) and error["type"], f"{where} {body}"
    assert error["param"] is None or isinstance(error["param"], str), f"{where} {body}"
    assert error["code"] is None or isinstance(error["code"], str), f"{where} {body}"
    return error


def check_error(
    response: httpx.Response,
    status: int | tuple[int, ...],
    *,
    param: str | None = None,
    code: str | None = None,
    message: str | None = None,
) -> dict:
    """The exact status (one of `status`), OpenAI's envelope, and the given fields."""
    allowed = status if isinstance(status, tuple) else (status,)
    assert response.status_code in allowed, f"{response.status_code}: {response.text[:500]}"
    error = assert_error_shape(response)
    wanted = "server_error" if response.status_code >= 500 else None
    if wanted:
        assert error["type"] == wanted, error
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    if message is not None:
        assert message in error["message"], error
    return error


def raw_http(
    base: str,
    head: bytes,
    body: bytes = b"",
    *,
    half_close: bool = True,
    timeout: float = 15.0,
) -> bytes | None:
    """Send `head` + `body` over a fresh socket and read until the server closes it.

    `half_close` shuts our side for writing after sending, so a server waiting for more
    body sees the end of the stream. Returns everything read, or None if the server neither
    answered nor closed within `timeout` (a hang).
    """
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head + body)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return None
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk
            if _complete(data):
                return data
        return None


def _complete(data: bytes) -> bool:
    """Whether `data` holds a whole response with a Content-Length."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def raw_body(data: bytes) -> bytes:
    return data.partition(b"\r\n\r\n")[2]


def _with_upload_body(document: dict) -> dict:
    """The served document with a multipart body for `POST /v1/files`.

    The upload handler streams the raw request (so an 8 GiB file never sits in memory),
    which Litestar cannot describe; without a body schema schemathesis would only ever
    send empty uploads. This is OpenAI's documented request for the route.
    """
    document = copy.deepcopy(document)
    upload = document["paths"]["/v1/files"]["post"]
    upload.setdefault(
        "requestBody",
        {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["purpose", "file"],
                        "properties": {
                            "purpose": {"type": "string"},
                            "file": {"type": "string", "format": "binary"},
                        },
                    }
                }
            },
        },
    )
    return document


def load_schema(base: str) -> tuple[dict, Any]:
    """The OpenAPI document the gateway serves, and a schemathesis schema built from it."""
    response = httpx.get(f"{base}/docs/openapi.json", timeout=30)
    assert response.status_code == 200, response.text
    document = response.json()
    # Failures print the exact request: no "[Filtered]" in place of max_tokens.
    config = schemathesis.Config.from_dict({"output": {"sanitization": {"enabled": False}}})
    return document, schemathesis.openapi.from_dict(_with_upload_body(document), config=config)


# Hand-written hostile requests -----------------------------------------------------------

JSON = {"content-type": "application/json"}
MSGPACK = {"content-type": "application/msgpack"}
MULTIPART = {"content-type": "multipart/form-data; boundary=xx"}
UNPARSABLE = "could not be parsed"

# Bugs the cases below found; each case that shows one is a strict xfail naming it.
BUGS: dict[str, str] = {}
"""Known failures by name, each pinned by a strict xfail (none open now)."""

EMB, CHAT, COMPL, BATCHES = (
    "/v1/embeddings",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/batches",
)
ROUTE_BODIES = {
    EMB: {"model": MODEL, "input": "hello"},
    CHAT: {"model": GEN_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    COMPL: {"model": GEN_MODEL, "prompt": "hi", "max_tokens": 1},
    BATCHES: {"input_file_id": "file-none", "endpoint": EMB, "completion_window": "24h"},
    "/v1/classify": {"model": "test-classifier", "input": "a"},
    "/v1/sparse": {"model": "test-splade", "input": "a"},
    "/v1/rerank": {"model": "test-reranker", "query": "a", "documents": ["b"]},
    "/v2/rerank": {"model": "test-reranker", "query": "a", "documents": ["b"]},
    "/v1/responses": {"model": GEN_MODEL, "input": "hi", "max_output_tokens": 1},
    "/v1/score": {"model": "test-reranker", "text_1": "a", "text_2": ["b"]},
}
JSON_ROUTES = [EMB, CHAT, COMPL, BATCHES]
NATIVE_MODELS = {"/native/v1/embed": MODEL, "/native/v1/ner": "test-ner"}
NATIVE_MODELS["/native/v1/multivector"] = MODEL
NATIVE_MODELS["/native/v1/sparse"] = "test-splade"
NATIVE_ROUTES = list(NATIVE_MODELS)


def case(
    route: str,
    body: bytes,
    status: int | tuple[int, ...],
    *,
    headers: dict = JSON,
    param: str | None = None,
    code: str | None = None,
    message: str | None = None,
    bug: str | None = None,
    id: str,
) -> Any:
    """One request and what it must get; `bug` (a key of BUGS) marks a known failure."""
    import pytest

    marks = [pytest.mark.xfail(reason=BUGS[bug], strict=True)] if bug else []
    expected = {"param": param, "code": code, "message": message}
    return pytest.param(route, body, headers, status, expected, marks=marks, id=id)


class Raw(str):
    """A JSON number as written (1e400), where json.dumps would refuse or round it."""


def json_body(route: str, **fields: Any) -> bytes:
    """The route's valid body with `fields` set, as raw JSON (ints of any size)."""
    body = {**ROUTE_BODIES[route], **fields}
    text = json.dumps({k: f"\0{v}\0" if isinstance(v, Raw) else v for k, v in body.items()})
    return text.replace('"\\u0000', "").replace('\\u0000"', "").encode()


def num(route: str, status: int, *, param=None, bug=None, **fields) -> Any:
    """`route`'s body with the numbers in `fields`, named by them."""
    name = re.sub(r"\d{16,}", _power, ",".join(f"{k}={v}" for k, v in fields.items()))
    raw = any(isinstance(v, Raw) for v in fields.values())
    message = UNPARSABLE if raw else None
    body = json_body(route, **fields)
    return case(route, body, status, param=param, bug=bug, message=message, id=f"{route}:{name}")


def _power(match: re.Match) -> str:
    n = int(match.group())
    return f"2**{n.bit_length() - 1}" if n & (n - 1) == 0 else f"2**{n.bit_length()}-1"


def pack(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


def _utf8_cases() -> list:
    bad = {
        "value": lambda b: b.replace(b'": "', b'": "\xff\xfe', 1),
        "key": lambda b: b[:1] + b'"\xc3\x28": 1, ' + b[1:],
        "overlong": lambda b: b.replace(b'": "', b'": "\xc0\xaf', 1),
        "surrogate": lambda b: b.replace(b'": "', b'": "\xed\xa0\x80', 1),
        "cut-multibyte": lambda b: b.replace(b'": "', b'": "\xe2\x82', 1),
    }
    cases = [
        case(r, corrupt(json_body(r)), 400, message=UNPARSABLE, id=f"{r}-{name}")
        for r in JSON_ROUTES
        for name, corrupt in bad.items()
    ]
    body = b"\x82\xa5model\xa2\xff\xfe\xa6inputs\x91\xa1a"
    cases += [case(r, body, 400, headers=MSGPACK, message=UNPARSABLE, id=r) for r in NATIVE_ROUTES]
    return cases


UTF8_CASES = _utf8_cases()

BIG = 2**70
NUMBER_CASES = [
    num(EMB, 400, param="dimensions", dimensions=BIG),
    num(EMB, 400, param="dimensions", dimensions=-BIG),
    num(EMB, 400, dimensions=Raw("1e400")),
    # Token ids are bounded in the schema (0 <= id < 2**31): msgspec names the item.
    num(EMB, 400, param="input[0]", input=[2**64 - 1]),
    num(EMB, 400, param="input[0]", input=[BIG]),
    num(EMB, 400, param="input[0][1]", input=[[101, -BIG]]),
    num(CHAT, 400, param="max_tokens", max_tokens=BIG),
    num(CHAT, 400, param="max_completion_tokens", max_completion_tokens=BIG),
    num(CHAT, 400, max_tokens=Raw("1e400")),
    num(CHAT, 400, param="n", n=BIG),
    num(CHAT, 400, param="seed", seed=BIG),
    num(CHAT, 400, param="top_logprobs", logprobs=True, top_logprobs=BIG),
    num(COMPL, 400, param="max_tokens", max_tokens=BIG),
    num(COMPL, 400, param="n", n=BIG),
    num(COMPL, 400, param="seed", seed=-BIG),
    num(COMPL, 400, param="logprobs", logprobs=BIG),
    num(COMPL, 400, temperature=Raw("1e400")),
    num(COMPL, 400, top_p=Raw("-1e400")),
    # In OpenAI's ranges (0 <= temperature <= 2, 0 < top_p <= 1): a tiny value samples
    # near-greedily; it must not crash the worker.
    num(COMPL, 200, temperature=1e-40),
    num(CHAT, 200, top_p=1e-46),
    num(CHAT, 200, temperature=2e-212),  # 0 in float32: greedy, not a refused sampler
    num("/v1/responses", 200, temperature=2e-212, input=""),
    num("/v1/classify", 400, param="top_k", top_k=BIG),
    num("/v1/sparse", 400, param="top_k", top_k=BIG),
    num("/v1/sparse", 200, threshold=1e300),  # above every weight: empty vectors
    num("/v1/rerank", 200, top_n=BIG),  # more than there are documents: all of them
    num("/v2/rerank", 200, top_n=BIG),
    num("/v2/rerank", 200, max_tokens_per_doc=BIG),  # past the model's limit: no cut
    num("/v2/rerank", 400, param="max_tokens_per_doc", max_tokens_per_doc=0),
    num("/v1/score", 200, truncate_prompt_tokens=BIG),
    num(BATCHES, 400, param="input_file_id", input_file_id=BIG),
    num(BATCHES, 400, metadata={"k": BIG}),
]
NUMBER_CASES += [
    case(
        "/native/v1/embed",
        pack({"model": MODEL, "inputs": ["a"], "dimensions": value}),
        400,
        headers=MSGPACK,
        param="dimensions",
        id=f"native:dimensions={value}",
    )
    for value in (2**64 - 1, -(2**63), float("inf"), float("nan"))
]


def _nested_cases() -> list:
    deep = b"[" * 1000 + b"]" * 1000
    cases = []
    for r in JSON_ROUTES:
        cases.append(case(r, b"[" * 100_000, 400, id=f"{r}-100000-open"))
        closed = json_body(r).replace(b"{", b'{"x": ' + deep + b", ", 1)
        cases.append(case(r, closed, 400, id=f"{r}-1000-closed"))
    cases.append(case(EMB, b'{"a":' * 100_000, 400, id="objects"))
    shallow = json_body(EMB, input=[[[[[1]]]]])
    cases.append(case(EMB, shallow, 400, param="input[0][0]", id="embeddings-5-levels"))
    for r in NATIVE_ROUTES:
        arrays = b"\x91" * 100_000 + b"\xc0"
        cases.append(case(r, arrays, 400, headers=MSGPACK, id=f"{r}-arrays"))
    maps = b"\x81\xa1a" * 5000 + b"\xc0"
    cases.append(case("/native/v1/embed", maps, 400, headers=MSGPACK, id="maps"))
    return cases


NESTED_CASES = _nested_cases()


def _msgpack_cases() -> list:
    ext, stamp = msgspec.msgpack.Ext(5, b"abc"), msgspec.msgpack.Ext(-1, b"\x00" * 4)
    cases = []
    for route, model in NATIVE_MODELS.items():
        good = pack({"model": model, "inputs": ["hello", "world"]})
        wrong = {
            "model-int": ({"model": 7}, "model"),
            "model-ext": ({"model": stamp}, "model"),
            "inputs-str": ({"inputs": "a"}, "inputs"),
            "inputs-bin": ({"inputs": [b"a"]}, "inputs[0]"),
            "inputs-int": ({"inputs": [1]}, "inputs[0]"),
            "inputs-map": ({"inputs": {"a": 1}}, "inputs"),
            "inputs-ext": ({"inputs": [ext]}, "inputs[0]"),
        }
        if route != "/native/v1/ner":  # NER takes no `truncate`
            wrong["truncate-str"] = ({"truncate": "yes"}, "truncate")
        if route == "/native/v1/embed":
            wrong["dtype-int"] = ({"dtype": 16}, "dtype")
            wrong["dimensions-list"] = ({"dimensions": [8]}, "dimensions")
        for name, (fields, param) in wrong.items():
            body = pack({"model": model, "inputs": ["a"], **fields})
            cases.append(
                case(
                    route,
                    body,
                    400,
                    headers=MSGPACK,
                    param=param,
                    code="invalid_value",
                    id=f"{route}-{name}",
                )
            )
        rejected = {
            "whole-ext": pack(ext),
            "whole-timestamp": b"\xd6\xff\x00\x00\x00\x00",
            "whole-array": pack([model, ["a"]]),
            "whole-nil": b"\xc0",
            "whole-int": b"\x07",
            "bad-timestamp": b"\x82\xa5model\xc7\x03\xffabc\xa6inputs\x91\xa1a",
        }
        for name, body in rejected.items():
            cases.append(case(route, body, 400, headers=MSGPACK, id=f"{route}-{name}"))
        broken = {
            "never-used-byte": b"\x82\xa5model\xc1",
            "cut-1": good[:1],
            "cut-half": good[: len(good) // 2],
            "cut-last": good[:-1],
            "array32-huge": b"\x82\xa5model" + pack(model) + b"\xa6inputs\xdd\xff\xff\xff\xff",
            "str32-huge": b"\x82\xa5model\xdb\xff\xff\xff\xff",
            "map32-huge": b"\xdf\xff\xff\xff\xff",
            "trailing": good + b"\x00",
        }
        for name, body in broken.items():
            cases.append(
                case(route, body, 400, headers=MSGPACK, message=UNPARSABLE, id=f"{route}-{name}")
            )
    return cases


MSGPACK_CASES = _msgpack_cases()


def _truncated_cases() -> list:
    cases = []
    for r in JSON_ROUTES:
        body = json_body(r)
        for cut in (1, len(body) // 3, len(body) // 2, len(body) - 1):
            cases.append(case(r, body[:cut], 400, message=UNPARSABLE, id=f"{r}-{cut}"))
        cases.append(case(r, b"", 400, message="body is required", id=f"{r}-empty"))
        cases.append(case(r, body + b"{", 400, message=UNPARSABLE, id=f"{r}-trailing"))
    return cases


TRUNCATED_CASES = _truncated_cases()


def _content_type_cases() -> list:
    form = b'--xx\r\nContent-Disposition: form-data; name="model"\r\n\r\nx\r\n--xx--\r\n'
    not_json = {
        "application/xml": b"<request><model>all-MiniLM-L6-v2</model></request>",
        MULTIPART["content-type"]: form,
        "application/x-www-form-urlencoded": b"model=x&input=y",
    }
    cases = []
    # JSON routes take only a JSON content type: a body a web page may post without a
    # CORS preflight (form, multipart, text/plain) is never decoded (the browser guard).
    media = {"code": "unsupported_media_type"}
    for r in JSON_ROUTES:
        for content_type, body in not_json.items():
            headers = {"content-type": content_type}
            cases.append(case(r, body, 415, headers=headers, **media, id=f"{r}-{content_type}"))
        packed = pack(ROUTE_BODIES[r])
        cases.append(case(r, packed, 415, headers=MSGPACK, **media, id=f"{r}-msgpack"))
    for r in (EMB, COMPL):  # even a valid JSON body, as `text/plain`
        text = {"content-type": "text/plain"}
        cases.append(case(r, json_body(r), 415, headers=text, **media, id=f"{r}-text/plain-json"))
    not_msgpack = ["application/json", "text/plain", "application/xml", MULTIPART["content-type"]]
    for r in NATIVE_ROUTES:
        for content_type in [*not_msgpack, ""]:
            headers = {"content-type": content_type}
            wanted = {"headers": headers, "code": "unsupported_media_type"}
            cases.append(case(r, json_body(EMB), 415, **wanted, id=f"{r}-{content_type}"))
    not_multipart = [*not_msgpack[:3], "multipart/form-data", "application/msgpack"]
    for content_type in not_multipart:
        wanted = {"headers": {"content-type": content_type}, "code": "invalid_content_type"}
        cases.append(
            case("/v1/files", b'{"purpose": "batch"}', 400, **wanted, id=f"files-{content_type}")
        )
    return cases


CONTENT_TYPE_CASES = _content_type_cases()


def _upload(*parts: tuple[str, str | None, bytes], end: bool = True) -> bytes:
    body = b""
    for name, filename, value in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += f"--xx\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n"
    return body + (b"--xx--\r\n" if end else b"")


def _upload_cases() -> list:
    purpose, file = ("purpose", None, b"batch"), ("file", "in.jsonl", b'{"custom_id": "a"}\n')
    bodies = {
        "purpose-not-utf8": (_upload(("purpose", None, b"\xff\xfe"), file), "purpose", None),
        "purpose-huge": (_upload(("purpose", None, b"x" * 100_000), file), None, None),
        "purpose-after-file": (_upload(file, ("purpose", None, b"fine-tune")), "purpose", None),
        "no-purpose": (_upload(file), "purpose", "missing"),
        "no-file": (_upload(purpose), "file", "missing"),
        "truncated": (_upload(purpose, file, end=False)[:-20], None, None),
        "wrong-boundary": (b"--yy\r\n\r\n--yy--\r\n", None, None),
        "garbage": (b"\xff" * 64, None, None),
    }
    return [
        case("/v1/files", body, 400, headers=MULTIPART, param=param, code=code, id=name)
        for name, (body, param, code) in bodies.items()
    ]


UPLOAD_CASES = _upload_cases()
