"""Where the command-line clients take their gateway and key from."""

from __future__ import annotations

import pytest

from shoal.cli import _parser


@pytest.mark.parametrize(
    "argv",
    [
        ["batch", "--url", "http://10.0.0.2:9000", "status", "batch_1"],
        ["batch", "status", "batch_1", "--url", "http://10.0.0.2:9000"],
    ],
)
def test_batch_takes_the_url_before_or_after_its_action(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    assert (args.url, args.action, args.batch_id) == ("http://10.0.0.2:9000", "status", "batch_1")


def test_the_clients_send_shoal_api_key_unless_given_one(monkeypatch) -> None:
    monkeypatch.setenv("SHOAL_API_KEY", "sk-shoal-from-env")
    parse = _parser().parse_args
    assert parse(["batch", "list"]).api_key == "sk-shoal-from-env"
    assert parse(["embed", "in.jsonl", "--model", "m", "-o", "out.npy"]).api_key == (
        "sk-shoal-from-env"
    )
    assert parse(["batch", "list", "--api-key", "sk-given"]).api_key == "sk-given"
    monkeypatch.delenv("SHOAL_API_KEY")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    unset = _parser().parse_args(["batch", "list"])
    assert (unset.api_key, unset.url) == ("", "http://127.0.0.1:8000")


def test_batch_also_reads_openai_api_key_as_the_sdk_does(monkeypatch) -> None:
    monkeypatch.delenv("SHOAL_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-env")
    parse = _parser().parse_args
    assert parse(["batch", "list"]).api_key == "sk-openai-env"
    # `shoal embed` is not an OpenAI client: it does not send an OpenAI key to Shoal.
    assert parse(["embed", "in.jsonl", "--model", "m", "-o", "out.npy"]).api_key is None
    monkeypatch.setenv("SHOAL_API_KEY", "sk-shoal-env")
    # Shoal's own key comes first.
    assert _parser().parse_args(["batch", "list"]).api_key == "sk-shoal-env"
