from shoal.workers.generation.text import TextTracker

# A toy byte-level "tokenizer": each id is one UTF-8 byte, like byte-fallback tokens.


def decode(ids) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def feed(tracker: TextTracker, text: str) -> list[str]:
    out = [tracker.add(b) for b in text.encode()]
    return out


def test_multibyte_characters_are_held_until_complete() -> None:
    t = TextTracker(decode, [])
    out = feed(t, "né")
    assert out == ["n", "", "é"]  # the first byte of "é" alone is not text yet
    assert t.finish() == ""


def test_a_stop_string_is_never_emitted_and_ends_generation() -> None:
    t = TextTracker(decode, ["</end>"])
    out = "".join(feed(t, "abc</en"))
    assert out == "abc"  # "</en" might become the stop string: held back
    assert not t.stopped
    out += t.add(ord("d")) + t.add(ord(">"))
    assert t.stopped and out == "abc" and t.text == "abc"


def test_held_back_text_is_released_when_it_cannot_be_a_stop_string() -> None:
    t = TextTracker(decode, ["STOP"])
    assert "".join(feed(t, "ST")) == ""
    assert t.add(ord("x")) == "STx"


def test_finish_releases_what_was_held_back() -> None:
    t = TextTracker(decode, ["STOP"])
    feed(t, "okST")
    assert t.finish() == "ST"
