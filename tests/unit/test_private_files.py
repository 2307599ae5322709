"""`write_private`: the settings `shoal serve` hands its children (S3 secrets, OTEL
headers) are readable by their user only, even where the file was there before."""

from __future__ import annotations

import stat

from shoal.private import write_private


def test_a_new_file_is_written_0600(tmp_path) -> None:
    path = write_private(tmp_path / "settings.json", b"{}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"{}"


def test_a_world_readable_file_is_narrowed_and_replaced(tmp_path) -> None:
    path = tmp_path / "settings.json"
    path.write_bytes(b'{"old": "longer than the new content"}')
    path.chmod(0o644)
    write_private(path, b"{}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"{}"
