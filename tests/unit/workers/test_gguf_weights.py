"""A GGUF's quantized blocks put into an OpenVINO graph as the weights it serves.

A small llama-layout GGUF is written with gguf-py (the library transformers reads GGUF
with), holding each block type the module knows, rows in the file's rotary layout where
llama permutes them, and one weight whose exported copy does not match the file. The
graph stands for optimum's export: named float32 constants into MatMul and Gather."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
ov = pytest.importorskip("openvino")

from shoal.workers.generation.gguf_weights import native_weights  # noqa: E402
from shoal.workers.generation.weight_guard import EXACT  # noqa: E402
from tests.weight_graphs import (  # noqa: E402
    assert_serves,
    exported_graph,
    kernel_weights,
)

Q = gguf.GGMLQuantizationType
HIDDEN, HEADS, KV_HEADS, VOCAB = 256, 2, 1, 16  # K-quant rows are whole super-blocks of 256
ROTARY = {"attn_q": HEADS, "attn_k": KV_HEADS}
# GGUF name -> (block type, rows, HF name)
WEIGHTS = {
    "blk.0.attn_q": (Q.Q4_1, 64, "model.layers.0.self_attn.q_proj"),
    "blk.0.attn_k": (Q.Q4_0, 32, "model.layers.0.self_attn.k_proj"),
    "blk.0.attn_v": (Q.Q4_K, 32, "model.layers.0.self_attn.v_proj"),
    "blk.0.attn_output": (Q.Q5_K, 64, "model.layers.0.self_attn.o_proj"),
    "blk.0.ffn_down": (Q.Q8_0, 64, "model.layers.0.mlp.down_proj"),
    "blk.0.ffn_up": (Q.Q4_1, 96, "model.layers.0.mlp.up_proj"),
    "token_embd": (Q.Q6_K, VOCAB, "model.embed_tokens"),  # as Q4_K_M files store it
    "blk.0.ffn_gate": (Q.Q5_0, 96, "model.layers.0.mlp.gate_proj"),
    "blk.1.ffn_up": (Q.Q5_1, 32, "model.layers.1.mlp.up_proj"),
    "output": (Q.Q3_K, VOCAB, "lm_head"),  # not expressed here
}
MISMATCHED = "model.layers.0.mlp.up_proj"


# Where each f16 super-block scale sits in a K-quant block (gguf-py cannot quantize to
# K-quants, so their blocks are random codes and 6/8-bit scales under a sane f16 scale).
K_SCALE_BYTES = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q3_K: (108,)}


def _random_k_blocks(rng, kind, rows: int) -> np.ndarray:
    size = gguf.GGML_QUANT_SIZES[kind][1]
    raw = rng.integers(0, 256, (rows, HIDDEN // 256, size), dtype=np.uint8)
    for at in K_SCALE_BYTES[kind]:
        scale = rng.uniform(1e-3, 1e-2, (rows, HIDDEN // 256)).astype(np.float16)
        raw[..., at : at + 2] = scale[..., None].view(np.uint8).reshape(rows, -1, 2)
    if kind in (Q.Q4_K, Q.Q5_K):  # no 6-bit group scale of 0: llama.cpp writes one only for a group
        raw[..., 4:16] |= 1  # of equal weights, which (q - z) * 0 cannot express (kept f32)
    return raw.reshape(rows, -1)


def _to_file_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert: Q and K rows reordered for its rotary layout."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """The GGUF, and each weight as the exporter sees it: dequantized, HF row order."""
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    exported = {}
    for name, (kind, rows, hf_name) in WEIGHTS.items():
        w = rng.standard_normal((rows, HIDDEN)).astype(np.float32) * 0.1
        heads = ROTARY.get(name.split(".")[-1])
        in_file = _to_file_rows(w, heads) if heads else w
        if kind in K_SCALE_BYTES:
            blocks = _random_k_blocks(rng, kind, rows)
        else:
            blocks = gguf.quants.quantize(in_file, kind)
        writer.add_tensor(f"{name}.weight", blocks, raw_dtype=kind)
        exported[hf_name] = gguf.quants.dequantize(blocks, kind).astype(np.float32)
        if heads:  # transformers puts the rows back when it reads the file
            exported[hf_name] = (
                exported[hf_name]
                .reshape(heads, rows // heads // 2, 2, HIDDEN)
                .swapaxes(2, 1)
                .reshape(rows, HIDDEN)
            )
    exported[MISMATCHED] = exported[MISMATCHED] + 0.01  # not the file's weights
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, exported


def test_quantized_weights_serve_as_the_files_blocks(checkpoint) -> None:
    path, exported = checkpoint
    model = exported_graph(exported, HIDDEN)
    done = native_weights(model, path)

    assert done.replaced == {
        "Q4_1": 1, "Q4_0": 1, "Q5_0": 1, "Q5_1": 1, "Q8_0": 1, "Q4_K": 1, "Q5_K": 1, "Q6_K": 1,
    }  # fmt: skip
    assert done.kept == {
        MISMATCHED: "Q4_1 blocks do not match the exported weights",
        "lm_head": "Q3_K blocks are not served as blocks yet",
    }

    compiled = ov.Core().compile_model(model, "CPU", EXACT)
    # The file's value within float32 rounding (Q4_1's minimum is a float zero point).
    assert_serves(compiled, exported, HIDDEN, 1e-5)
    # The compiled kernels read the codes, not a float32 copy.
    weights = kernel_weights(compiled)
    assert weights["FullyConnected", "u4"] == 3  # Q4_1, Q4_0 and Q4_K
    assert weights["FullyConnected", "u8"] == 3  # the 5-bit codes of Q5_0, Q5_1 and Q5_K
    assert weights["FullyConnected", "i8"] == 1  # Q8_0
    assert weights["FullyConnected", "f32"] == 2  # the mismatched and the Q3_K one, kept
    assert weights["Gather", "i8"] == 1  # the embedding, Q6_K's signed 6-bit codes


def test_a_graph_without_matching_names_is_left_alone(checkpoint) -> None:
    path, exported = checkpoint
    renamed = {f"other.{name}": w for name, w in exported.items() if name != "model.embed_tokens"}
    done = native_weights(exported_graph(renamed, HIDDEN), path)
    assert done.replaced == {} and done.kept == {}
