"""What every torch-backed adapter shares: its precision, its memory footprint and how it
lets go."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ._guard import EXACT_FLOOR, PROBE_TEXTS, QUALITY_FLOOR, worst_cosine
from ._packing import PackedGraph, pack, packed_inputs
from .base import EncoderAdapter, Tokenized, pad_batch
from .cpu import runs_natively

if TYPE_CHECKING:
    from ._openvino import OpenVinoGraph

__all__ = ["Graph", "TorchAdapter"]

log = logging.getLogger(__name__)


class Graph(torch.nn.Module):
    """A model's forward as a module of named tensors, what a graph compiler traces:
    `output(model, features)` with the features dict transformers models take."""

    def __init__(
        self,
        model: torch.nn.Module,
        output: Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor],
    ) -> None:
        super().__init__()
        self.model = model
        self.output = output

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        return self.output(self.model, features)


class TorchAdapter(EncoderAdapter):
    """An adapter whose loaded model is a torch module in `self.model`.

    Precision follows the profile's `dtype`. On a GPU the weights are cast. On a CPU the
    weights stay float32 and bf16 runs under autocast (matmuls in bf16, softmax, norms and
    pooling in float32): measured on MiniLM it is as fast as cast weights and closer to
    float32 (perf/results/README.md); only where the CPU has native bf16.
    """

    model: torch.nn.Module | None = None
    device: str = "cpu"
    _autocast: torch.dtype | None = None
    _engine: OpenVinoGraph | None = None
    _packed: PackedGraph | None = None
    """The forward on packed rows (`_packing`), where float32 torch on it matched the padded
    forward at load (`_torch_packs`)."""
    _engine_packs: bool = False
    """Whether the engine runs `_packed` (else padded batches, or no engine)."""
    _token_types: bool = False
    """Whether the model takes token type ids (set by `load` from its tokenizer)."""
    cache_dir: Path | None = None  # where converted engine graphs are kept (`_graph_cache`)

    def _set_precision(self, model: torch.nn.Module) -> None:
        """Apply the profile's dtype to a freshly loaded `model` (on `self.device`)."""
        dtype = self.spec.profile.dtype
        self._autocast = None
        if dtype == "float32":
            return
        if not runs_natively(dtype, self.device):
            log.warning(
                "model %s: %s on this CPU would be slower than float32; serving float32",
                self.spec.id,
                dtype,
            )
        elif self.device != "cpu":
            model.to(getattr(torch, dtype))
        else:
            self._autocast = torch.bfloat16

    def _compute(self) -> contextlib.AbstractContextManager:
        """Where a forward pass runs: inference mode, under autocast when the profile
        asks for it."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode())
        if self._autocast is not None:
            stack.enter_context(torch.autocast("cpu", dtype=self._autocast))
        return stack

    def _compile_graph(
        self,
        graph: torch.nn.Module,
        example: Mapping[str, np.ndarray],
        packed: PackedGraph | None = None,
    ) -> None:
        """Hand `graph` (the adapter's main forward, taking `example`'s inputs by name) to
        the profile's engine; called by `load`, after the tokenizer is set.

        `auto` picks OpenVINO on a CPU where it is installed and its outputs on the probe
        texts keep the floor against float32 torch (`EXACT_FLOOR` at float32, the quality
        floor in bf16, which only a profile asks for); else torch. A GPU runs torch.

        `packed`, the same forward on packed rows (`_packing`), is what the engine runs
        instead wherever it keeps that floor against `graph` in float32 torch, checked
        whatever the profile (packing is right only for models that take positions and a
        mask as given); else the engine runs `graph` on padded batches. Without an engine
        (or for LoRA batches) torch runs `packed` wherever it matched `graph` at load."""
        self._engine = None
        self._engine_packs = False
        names = list(example)
        self._packed = (
            packed if packed is not None and self._torch_packs(packed, graph, names) else None
        )
        if not self._engine_allowed():
            return
        from . import _openvino

        bf16 = self._openvino_bf16()
        floor = QUALITY_FLOOR if bf16 else EXACT_FLOOR
        if self._packed is not None:
            engine = self._compile_packed(self._packed, graph, names, bf16, floor)
            if engine is not None:
                self._engine, self._engine_packs = engine, True
                return
        compiled = _openvino.OpenVinoGraph(graph, example, bf16, self.cache_dir)
        if self.spec.profile.engine == "auto":
            threads = torch.get_num_threads()
            worst = self._probe_agreement(
                graph, names, lambda rows: compiled(self._padded(rows, names), threads)
            )
            choice = "openvino" if worst >= floor else "torch"
            (log.info if choice == "openvino" else log.warning)(
                "model %s: engine auto: %s (openvino %s kept a worst cosine of %.7f to "
                "float32 torch on the probe texts; floor %s)",
                self.spec.id,
                choice,
                compiled.precision,
                worst,
                floor,
            )
            if choice == "torch":
                return
        self._engine = compiled

    def _torch_packs(self, packed: PackedGraph, graph: torch.nn.Module, names: list[str]) -> bool:
        """Whether float32 torch on packed rows keeps `EXACT_FLOOR` against `graph` on the
        probe texts padded (packing is right only for models that take positions and a
        mask as given), saying why not. Right-padded tokenizers on a CPU only: on a GPU
        padded batches run fused attention kernels that a dense mask would give up, and
        packing there is unmeasured."""
        if self.tokenizer.pad_left or self.device != "cpu":  # type: ignore[attr-defined]
            return False

        def run(rows: list[Tokenized]) -> np.ndarray:
            with torch.inference_mode():
                return self._torch_forward(packed, self._packed_inputs(rows, packed))

        holds = self._packing_holds("torch float32", graph, names, EXACT_FLOOR, lambda: run)
        return holds is not None

    def _compile_packed(
        self,
        packed: PackedGraph,
        graph: torch.nn.Module,
        names: list[str],
        bf16: bool,
        floor: float,
    ) -> OpenVinoGraph | None:
        """`packed` compiled, if its outputs on the probe texts packed several to a row keep
        `floor` against float32 torch's `graph` on them padded; else None, saying why."""
        from . import _openvino

        tokenizer = self.tokenizer  # type: ignore[attr-defined]
        precision = "bf16" if bf16 else "f32"
        compiled: list[OpenVinoGraph] = []

        def compile_it() -> Callable[[list[Tokenized]], np.ndarray]:
            example = self._packed_inputs(tokenizer.texts(["a", "b"]), packed)
            engine = _openvino.OpenVinoGraph(packed, example, bf16, self.cache_dir)
            compiled.append(engine)
            threads = torch.get_num_threads()
            return lambda rows: engine(self._packed_inputs(rows, packed), threads)

        worst = self._packing_holds(f"openvino {precision}", graph, names, floor, compile_it)
        if worst is None:
            return None
        log.info(
            "model %s: engine %s: openvino %s on packed rows (worst cosine %.7f to float32 "
            "torch on the probe texts; floor %s)",
            self.spec.id,
            self.spec.profile.engine,
            precision,
            worst,
            floor,
        )
        return compiled[0]

    def _packing_holds(
        self,
        runner: str,
        graph: torch.nn.Module,
        names: list[str],
        floor: float,
        make: Callable[[], Callable[[list[Tokenized]], np.ndarray]],
    ) -> float | None:
        """The worst cosine of `make()`'s outputs (a forward of packed rows, made inside the
        check: making it may fail too) to float32 torch's `graph` on the probe texts padded,
        if it keeps `floor`; else None, the log saying why (`runner` names what ran)."""
        try:
            worst = self._probe_agreement(graph, names, make())
        except Exception as exc:  # parts that do not fit together: padded it is
            log.warning(
                "model %s: packed rows off (%s: %s); padded batches instead",
                self.spec.id,
                type(exc).__name__,
                exc,
            )
            return None
        if worst < floor:
            log.warning(
                "model %s: packed rows off: %s on them kept a worst cosine of %.7f to float32 "
                "torch on the probe texts padded (floor %s); padded batches instead",
                self.spec.id,
                runner,
                worst,
                floor,
            )
            return None
        return worst

    def _engine_allowed(self) -> bool:
        """Whether the profile and this machine let the OpenVINO engine run the model
        (`engine = "openvino"` without the package is an error; `auto` says why not)."""
        wanted = self.spec.profile.engine
        if wanted == "torch":
            return False
        if self.device != "cpu":
            if wanted == "openvino":
                log.warning(
                    "model %s: the openvino engine is for CPUs; serving with torch on %s",
                    self.spec.id,
                    self.device,
                )
            return False
        from . import _openvino

        if not _openvino.available():
            if wanted == "openvino":
                raise RuntimeError(
                    f"model {self.spec.id!r}: engine 'openvino' needs the openvino package "
                    "(pip install 'shoal[encoder]')"
                )
            log.info("model %s: engine auto: torch (openvino is not installed)", self.spec.id)
            return False
        return True

    def _padded(self, rows: Sequence[Tokenized], names: list[str]) -> dict[str, np.ndarray]:
        """`rows` as one padded batch, the inputs in `names`."""
        tokenizer = self.tokenizer  # type: ignore[attr-defined]
        ids, mask, types = pad_batch(rows, tokenizer.pad_id, tokenizer.pad_left)
        every = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: every[name] for name in names}

    def _probe_agreement(
        self,
        graph: torch.nn.Module,
        names: list[str],
        candidate: Callable[[list[Tokenized]], np.ndarray],
    ) -> float:
        """Worst cosine between `candidate(rows)` and float32 torch's `graph` on padded
        `PROBE_TEXTS`: all of them (padded, or packed several to a row), then the first
        alone. Per-token outputs are compared on the texts' tokens, not the padding."""
        tokenizer = self.tokenizer  # type: ignore[attr-defined] - every torch adapter has one
        rows = tokenizer.texts(list(PROBE_TEXTS))
        worst = 1.0
        for batch in (rows, rows[:1]):
            with torch.inference_mode():
                padded = self._padded(batch, names)
                tensors = {name: torch.from_numpy(a) for name, a in padded.items()}
                exact = graph(**tensors).float().numpy()
            theirs = candidate(batch)
            if exact.ndim == 3:  # per-token outputs: only the inputs' own tokens count
                real = padded["attention_mask"][..., None]
                exact, theirs = exact * real, theirs * real
            worst = min(worst, worst_cosine(exact, theirs))
        return worst

    def _run(self, graph: torch.nn.Module, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """`graph(**inputs)` as float32 numpy: in the compiled engine when the profile has
        one and no LoRA adapter is active (the engine holds the base weights only), else
        in torch. The engine takes the threads the worker gave this forward pass."""
        if self._engine is not None and not self._lora_active():
            return self._engine(inputs, torch.get_num_threads())
        with self._compute():
            return self._torch_forward(graph, inputs)

    def _torch_forward(
        self, graph: torch.nn.Module, inputs: Mapping[str, np.ndarray]
    ) -> np.ndarray:
        """`graph(**inputs)` in torch on the adapter's device, as float32 numpy."""
        tensors = {name: torch.from_numpy(a).to(self.device) for name, a in inputs.items()}
        return graph(**tensors).float().cpu().numpy()

    def _lora_active(self) -> bool:
        return bool(self.lora and self.lora.active_name)

    def _runs_packed(self) -> bool:
        """Whether the next forward of the main graph runs packed: in the engine where it
        runs packed rows (it holds the base weights only, so not for LoRA batches), else in
        torch wherever packing held at load."""
        if self._packed is None:
            return False
        return self._engine is None or self._engine_packs or self._lora_active()

    def _run_packed(self, rows: Sequence[Tokenized]) -> np.ndarray:
        """The main graph's outputs for `rows`, packed: in the engine where it runs them
        and no LoRA adapter is active, else in torch."""
        assert self._packed is not None
        inputs = self._packed_inputs(rows, self._packed)
        if self._engine is not None and self._engine_packs and not self._lora_active():
            return self._engine(inputs, torch.get_num_threads())
        with self._compute():
            return self._torch_forward(self._packed, inputs)

    def _packed_inputs(
        self, rows: Sequence[Tokenized], packed: PackedGraph
    ) -> dict[str, np.ndarray]:
        """`rows` packed, as `packed` takes them."""
        tokenizer = self.tokenizer  # type: ignore[attr-defined]
        return packed_inputs(pack(rows, tokenizer.pad_id, packed.alpha), self._token_types)

    def runs_side_by_side(self, op: str, lora: str) -> bool:
        return self._engine is not None and not lora and self._on_engine(op)

    def _on_engine(self, op: str) -> bool:
        """Whether `forward` runs `op` through `_run` (so in the engine, without LoRA)."""
        return True

    def engine(self) -> str:
        if self._engine is not None:
            return f"openvino {'bfloat16' if self._engine.precision == 'bf16' else 'float32'}"
        if self._autocast is not None:
            return "torch bfloat16 (autocast)"
        dtype = next(self.model.parameters()).dtype if self.model is not None else None
        name = str(dtype).removeprefix("torch.") if dtype else self.spec.profile.dtype
        return f"torch {name}" if self.device == "cpu" else f"torch {name} ({self.device})"

    def planned_bytes(self, weights: int) -> int:
        """The weights, and on a CPU where the OpenVINO engine will (or, under `auto`, may)
        serve the model, its compiled copy of them (a second thread count compiles
        another, counted once it exists)."""
        if not self._compiles() or self.device != "cpu" or self.spec.profile.engine == "torch":
            return weights
        from . import _openvino

        if not _openvino.available():
            return weights
        return weights + _compiled_bytes(weights, self._openvino_bf16(), copies=1)

    def _openvino_bf16(self) -> bool:
        """Whether OpenVINO runs this profile in bf16: asked for, and native on this CPU."""
        return self.spec.profile.dtype == "bfloat16" and runs_natively("bfloat16", "cpu")

    def _compiles(self) -> bool:
        """Whether `load` hands a graph to the engine (every head does)."""
        return True

    def memory_bytes(self) -> int:
        assert self.model is not None
        tensors = [*self.model.parameters(), *self.model.buffers()]
        weights = sum(t.numel() * t.element_size() for t in tensors)
        if self._engine is None:
            return weights
        # Each compiled copy holds the weights again, in bf16 or float32.
        bf16 = self._engine.precision == "bf16"
        return weights + _compiled_bytes(weights, bf16, copies=max(1, self._engine.compiled))

    def unload(self) -> None:
        self.model = None
        self._engine = None
        self.lora = None
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()


def _compiled_bytes(weights: int, bf16: bool, copies: int) -> int:
    """What `copies` compiled OpenVINO copies of `weights` bytes of float32 weights hold (an
    estimate: OpenVINO does not report its own memory)."""
    return int(weights * (0.5 if bf16 else 1.0) * copies)
