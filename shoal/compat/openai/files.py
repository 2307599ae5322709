"""OpenAI files: https://platform.openai.com/docs/api-reference/files"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["FileDeleted", "FileList", "FileObject", "FilePurpose"]

FilePurpose = Literal[
    "assistants",
    "assistants_output",
    "batch",
    "batch_output",
    "fine-tune",
    "fine-tune-results",
    "vision",
    "user_data",
]
PURPOSES: tuple[str, ...] = FilePurpose.__args__  # type: ignore[attr-defined]


class FileObject(msgspec.Struct, kw_only=True):
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    object: Literal["file"] = "file"
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None


class FileList(msgspec.Struct, kw_only=True):
    data: list[FileObject]
    has_more: bool
    first_id: str | None
    last_id: str | None
    object: Literal["list"] = "list"


class FileDeleted(msgspec.Struct, kw_only=True):
    id: str
    deleted: bool
    object: Literal["file"] = "file"
