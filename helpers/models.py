"""Real torchvision models, example inputs, and their import into Relax.

Pretrained weights are used when they can be had (downloaded or already in the
torch hub cache). Where they cannot (no network, as in CI), the model gets
seeded random weights and says so: TVM is always checked against PyTorch on the
same weights, so correctness and speed lessons hold either way.

Introduced on Day 0.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchvision
import tvm
from tvm import relax
from tvm.relax.frontend.torch import from_exported_program

from . import cache
from .errors import ExportError, InputShapeError, UnknownModelError

IMAGE_SIZE = 224


def available_models() -> list[str]:
    """Every torchvision classification model name load_model accepts."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


def _check_name(name: str) -> None:
    known = available_models()
    if name not in known:
        close = [m for m in known if name.split("_")[0].lower() in m][:6]
        hint = f" Did you mean one of {close}?" if close else ""
        raise UnknownModelError(
            f"Unknown model {name!r}: it is not a torchvision classification model.{hint} "
            "helpers.models.available_models() lists them all."
        )


def _pretrained_state(name: str) -> dict | None:
    """The pretrained state dict, or None when it cannot be had (no network, no cache)."""
    try:
        weights = torchvision.models.get_model_weights(name).DEFAULT
    except (ValueError, AttributeError):
        return None
    # torch.hub prints its download attempt and progress; a failed attempt would
    # clutter the notebook (and stderr costs points in an nbgrader test cell), so
    # keep it quiet and report the outcome in one line instead.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return weights.get_state_dict(progress=False)
        except Exception:
            return None


@functools.cache
def pretrained_available(name: str) -> bool:
    """Whether the trained weights of ``name`` can be had here (downloaded, or in torch's cache)."""
    return _pretrained_state(name) is not None


def load_model(name: str, pretrained: bool = True, seed: int = 0) -> torch.nn.Module:
    """A torchvision model in eval mode.

    With ``pretrained=True`` it tries the real ImageNet weights and, when they
    cannot be had, falls back to seeded random weights with a visible message.
    """
    _check_name(name)
    torch.manual_seed(seed)
    model = torchvision.models.get_model(name, weights=None)
    if pretrained:
        state = _pretrained_state(name)
        if state is None:
            print(
                f"[helpers] {name}: pretrained weights are not available here (no network, "
                f"nothing in {torch.hub.get_dir()}); using random weights with seed {seed}. "
                "Speed and TVM-vs-PyTorch parity do not depend on the weights."
            )
        else:
            model.load_state_dict(state)
            print(f"[helpers] {name}: pretrained ImageNet weights loaded.")
    return model.eval()


def example_input(batch: int = 1, size: int = IMAGE_SIZE, seed: int = 0) -> torch.Tensor:
    """A seeded random image batch, shape (batch, 3, size, size), float32."""
    if batch < 1:
        raise InputShapeError(f"batch must be at least 1, got {batch}.")
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=gen)


@dataclass
class ImportedModel:
    """A Relax module with its weights split out, ready for tvm.compile."""

    mod: tvm.IRModule
    params: list  # tvm.runtime.Tensor, in the order main() takes them after the input
    input_shape: tuple[int, ...]
    input_dtype: str

    @property
    def num_params(self) -> int:
        return len(self.params)


@dataclass(frozen=True)
class Expected:
    """What a model's first layer takes, read from the layer, and whether an example input fits it."""

    text: str  # "The first layer it defines, `features.0.0` (Conv2d), takes inputs of shape (batch, 3, height, width), float32."
    fits: bool


def expected_input(model: torch.nn.Module, example: torch.Tensor) -> Expected | None:
    """What the first convolution or linear layer ``model`` defines takes, and whether ``example`` fits it.

    None when the model defines neither (lazy layers do not know their sizes yet). The first layer
    *defined* is normally the first applied; a model that defines its head first misleads it.
    """
    for name, layer in model.named_modules():
        if isinstance(layer, torch.nn.modules.lazy.LazyModuleMixin):
            continue
        if isinstance(layer, torch.nn.modules.conv._ConvNd):
            spatial = len(layer.kernel_size)
            axes = {1: "length", 2: "height, width", 3: "depth, height, width"}[spatial]
            shape = f"(batch, {layer.in_channels}, {axes})"
            fits = example.dim() in (spatial + 1, spatial + 2) and example.shape[-spatial - 1] == layer.in_channels
        elif isinstance(layer, torch.nn.Linear):
            shape = f"(..., {layer.in_features})"
            fits = example.dim() >= 1 and example.shape[-1] == layer.in_features
        else:
            continue
        return Expected(
            f"The first layer it defines, `{name}` ({type(layer).__name__}), takes inputs of shape {shape}, "
            f"{dtype_name(layer.weight)}.",
            fits and example.dtype == layer.weight.dtype,
        )
    return None


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


@contextlib.contextmanager
def quiet(logger: str) -> Iterator[None]:
    """Only errors from ``logger`` while the block runs: harmless warnings would show as red stderr in a notebook."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def torch_logs_held():
    """Hold torch's log records while the body runs: replayed if it succeeds, dropped if it raises.

    A failing torch.export logs the failed operator's traceback (or the graph so far) to stderr
    before it raises, tens of lines that the raised error, chained, already carries; in a graded
    cell any stderr costs the points.
    """
    held: list[logging.LogRecord] = []

    class _Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record)

    hold = _Hold()
    saved = {
        logger: logger.handlers
        for name, logger in list(logging.root.manager.loggerDict.items())
        if (name == "torch" or name.startswith("torch.")) and isinstance(logger, logging.Logger) and logger.handlers
    }
    for logger in saved:
        logger.handlers = [hold]
    succeeded = False
    try:
        yield
        succeeded = True
    finally:
        for logger, handlers in saved.items():
            logger.handlers = handlers
        if succeeded:
            for record in held:
                logging.getLogger(record.name).handle(record)


def export(model: torch.nn.Module, example: torch.Tensor, dynamic_shapes=None) -> torch.export.ExportedProgram:
    """torch.export the model in inference mode; a failure arrives as the course's own error.

    ``InputShapeError`` when the input does not fit the model (by the first layer's sizes and
    dtype, or by PyTorch's message), ``ExportError`` otherwise; both name the input's shape and
    what the model expects where that can be read, and chain PyTorch's error (``__cause__``).
    """
    if not isinstance(example, torch.Tensor):
        raise InputShapeError(f"The example input must be a torch.Tensor, got {type(example).__name__}.")
    try:
        with torch.no_grad(), torch_logs_held():
            return torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes)
    except Exception as err:
        expected = expected_input(model, example)
        given = f"an input of shape {tuple(example.shape)} ({dtype_name(example)})"
        wants = f" {expected.text}" if expected else ""
        reason = _first_line(err).rstrip(".")
        words = str(err).lower()
        # an operator's own complaint (a plain RuntimeError: "expected input[2, 5, 8, 8] to have 3
        # channels") is about the input; torch.export's (data-dependent control flow...) is not
        operator_error = type(err).__module__ == "builtins" and ("shape" in words or "size" in words)
        if (expected and not expected.fits) or operator_error:
            raise InputShapeError(f"The model cannot run on {given}: {reason}.{wants}") from err
        raise ExportError(
            f"torch.export could not capture the model on {given}: {reason} ({type(err).__name__}).{wants} "
            "PyTorch's full error is chained to this one (its __cause__)."
        ) from err


def import_to_relax(model: torch.nn.Module, example: torch.Tensor) -> ImportedModel:
    """torch.export -> Relax, with the weights detached as separate parameters.

    In the suite (``cache.for_tests()``) a model made only of torch's and torchvision's layers is
    imported once per weights and input shape, and read back afterwards (``fingerprint``).
    """
    if not isinstance(example, torch.Tensor):
        raise InputShapeError(f"The example input must be a torch.Tensor, got {type(example).__name__}.")
    shape, dtype = tuple(example.shape), dtype_name(example)
    folder = cache.kept_for_tests("import", model, (shape, dtype), Path(__file__), lambda out: _save_import(model, example, out))
    if folder is None:
        mod, params = to_relax(export(model, example))
        return ImportedModel(mod=mod, params=params, input_shape=shape, input_dtype=dtype)
    mod = tvm.ir.load_json((folder / "module.json").read_text())
    with np.load(folder / "params.npz") as saved:
        params = [tvm.runtime.tensor(saved[f"p{i}"]) for i in range(len(saved.files))]
    return ImportedModel(mod=mod, params=params, input_shape=shape, input_dtype=dtype)


def load_imported(name: str, batch: int = 1) -> tuple[torch.nn.Module, torch.Tensor, ImportedModel]:
    """A course model by name, its example input of ``batch`` images, and its import into Relax:
    what every comparison of TVM with PyTorch starts from."""
    model = load_model(name)
    x = example_input(batch)
    return model, x, import_to_relax(model, x)


def _save_import(model: torch.nn.Module, example: torch.Tensor, folder: Path) -> None:
    mod, params = to_relax(export(model, example))
    (folder / "module.json").write_text(tvm.ir.save_json(mod))
    np.savez(folder / "params.npz", **{f"p{i}": p.numpy() for i, p in enumerate(params)})


def to_relax(program: torch.export.ExportedProgram, decompose: bool = True,
             custom_convert_map: dict | None = None) -> tuple[tvm.IRModule, list]:
    """An exported program as a Relax module, its weights detached: (module, weights of main). The course's one
    road from torch.export to Relax. ``decompose=False`` keeps ``R.nn.attention`` whole (Day 14);
    ``custom_convert_map`` replaces the importer's converters of some operators (``hugging_face``)."""
    mod = from_exported_program(program, keep_params_as_input=True, run_ep_decomposition=decompose,
                                custom_convert_map=custom_convert_map)
    mod, params = relax.frontend.detach_params(mod)
    return mod, list(params.get("main", []))


def dtype_name(tensor: torch.Tensor) -> str:
    """``torch.float32`` -> ``"float32"``, the spelling TVM uses."""
    return str(tensor.dtype).replace("torch.", "")
