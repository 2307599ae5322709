"""16-bit weights served as 16-bit: a bf16 or f16 checkpoint (or a GGUF's F16 and BF16
tensors) read from 16-bit constants, not from their float32 copy.

optimum exports every weight as a float32 constant, a 16-bit checkpoint's widened
exactly, and a decode step reads every weight once: the float32 copy doubles what one
stream reads. This puts each float32 weight constant whose values are all exactly bf16
(else all exactly f16) back in that type, with a Convert to float32 that the CPU plugin
fuses into the FullyConnected (and Gather) kernel that reads it: float32 activations
times 16-bit weights, float32 arithmetic. Checked value by value, so the graph computes
what the float32 copy did: a constant any value of which would round stays float32 (a
float32 checkpoint keeps every one).

The CPU plugin fuses that Convert only where the IR marks it as a decompression (what
OpenVINO's own fp16 compression writes), and its Python API cannot set that mark:
`mark_decompression` writes it into the saved IR's XML.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np

__all__ = ["SIXTEEN_BIT", "mark_decompression", "sixteen_bit_weights", "weight_constants"]

SIXTEEN_BIT = frozenset({"F16", "BF16"})
"""What `sixteen_bit_weights` counts, as GGUF names the types."""


def weight_constants(model) -> Iterable:
    """The named 2-D weight constants of optimum's export (`self.<name>.weight`, into
    MatMul or the embedding's Gather), each once."""
    for op in model.get_ops():
        named = op.get_type_name() == "Constant" and op.get_friendly_name().endswith(".weight")
        if named and len(op.get_output_shape(0)) == 2:
            yield op


def sixteen_bit_weights(model) -> dict[str, int]:
    """Replace, in the OpenVINO `model`, every float32 weight constant whose values are
    all exactly bf16 (else f16) by that 16-bit constant and a Convert to float32; how many
    of each type ("F16", "BF16", as GGUF names them)."""
    import openvino as ov
    from openvino import opset13 as ops

    done: Counter[str] = Counter()
    for const in list(weight_constants(model)):
        if const.get_element_type() != ov.Type.f32:
            continue
        narrow = _narrowed(const.get_data(), ov)
        if narrow is None:
            continue
        kind, tensor = narrow
        weight = ops.constant(tensor)
        weight.set_friendly_name(const.get_friendly_name())
        value = ops.convert(weight, ov.Type.f32).output(0)
        for target in list(const.output(0).get_target_inputs()):
            target.replace_source_output(value)
        done[kind] += 1
    return dict(done)


def _narrowed(w: np.ndarray, ov) -> tuple[str, object] | None:
    """("BF16", a bf16 tensor) or ("F16", an f16 array) holding exactly `w`'s values, or
    None where neither does. bf16 first: widening it is a shift, and its kernels ran
    faster than f16's on one stream (perf/results/README.md); a bf16 checkpoint's values
    are often f16 values too, an f16 checkpoint's seldom bf16 ones."""
    bits = np.ascontiguousarray(w).view(np.uint32)
    if not (bits & 0xFFFF).any():  # bf16 is float32's upper half
        # A tensor of OpenVINO's own: one made over a numpy array would only borrow it.
        tensor = ov.Tensor(ov.Type.bf16, ov.Shape(list(w.shape)))
        tensor.data[:] = (bits >> 16).astype(np.uint16).view(tensor.data.dtype)
        return "BF16", tensor
    half = w.astype(np.float16)
    if np.array_equal(half.astype(np.float32), w):
        return "F16", half
    return None


def mark_decompression(xml_path: Path) -> int:
    """Mark, in the saved IR at `xml_path`, each Convert of a 16-bit constant to float32
    as a decompression (the rt_info attribute OpenVINO's fp16 compression writes), so the
    CPU plugin keeps the weight 16-bit inside the kernel; how many it marked."""
    tree = ET.parse(xml_path)
    layers = {layer.get("id"): layer for layer in tree.getroot().iter("layer")}
    sixteen = {
        id_
        for id_, layer in layers.items()
        if layer.get("type") == "Const" and _data(layer).get("element_type") in ("f16", "bf16")
    }
    marked = 0
    for edge in tree.getroot().iter("edge"):
        layer = layers.get(edge.get("to-layer"))
        if (
            edge.get("from-layer") in sixteen
            and layer is not None
            and layer.get("type") == "Convert"
            and _data(layer).get("destination_type") == "f32"
        ):
            rt_info = layer.find("rt_info")
            if rt_info is None:
                rt_info = ET.Element("rt_info")
                layer.insert(list(layer).index(_data(layer)) + 1, rt_info)
            if rt_info.find("attribute[@name='decompression']") is None:
                ET.SubElement(rt_info, "attribute", name="decompression", version="0")
            marked += 1
    if marked:  # an IR with no 16-bit weight (a GGUF's blocks alone) stays as saved
        tree.write(xml_path, encoding="utf-8", xml_declaration=True)
    return marked


def _data(layer: ET.Element) -> ET.Element:
    data = layer.find("data")
    return data if data is not None else ET.Element("data")
