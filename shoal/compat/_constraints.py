"""Constraints shared by the HTTP schemas, named once."""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["INT32_MAX", "Count", "ModelName", "Score", "Seed", "TokenId"]

INT32_MAX = 2**31 - 1
"""Bound for ints that only count things. JSON ints have no size limit, but every int
that reaches a queue message must fit MessagePack's 64 bits; bounding them in the schema
makes a huge one a 400 naming its field, not a failure deep in the encoder."""

ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
TokenId = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
"""A token id: no vocabulary comes near 2**31 entries."""
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""A sampling seed: any int64 (torch's generators take 64 bits)."""
Count = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]
"""How many of something (labels, choices) a request asks for."""
Score = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
"""A probability-like score threshold."""
