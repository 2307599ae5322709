"""Constraints shared by the HTTP schemas, named once."""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["ModelName"]

ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
