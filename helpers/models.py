"""Real torchvision models, example inputs, and their import into Relax.

Pretrained weights are used when they can be had (downloaded or already in the
torch hub cache). Where they cannot (no network, as in CI), the model gets
seeded random weights and says so: TVM is always checked against PyTorch on the
same weights, so correctness and speed lessons hold either way.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

import torch
import torchvision
import tvm
from tvm import relax
from tvm.relax.frontend.torch import from_exported_program

from .errors import InputShapeError, UnknownModelError

# The course's models. Any torchvision classification model also works.
COURSE_MODELS = ("mobilenet_v2", "resnet18", "resnet50", "efficientnet_b0")
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


def export(model: torch.nn.Module, example: torch.Tensor, dynamic_shapes=None) -> torch.export.ExportedProgram:
    """torch.export the model in inference mode, with one clear error for a bad input."""
    try:
        with torch.no_grad():
            return torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes)
    except RuntimeError as err:
        if "shape" in str(err).lower() or "size" in str(err).lower():
            raise InputShapeError(
                f"The model cannot run on an input of shape {tuple(example.shape)} "
                f"({example.dtype}): {str(err).splitlines()[0]} "
                "Image models here take (batch, 3, 224, 224) float32."
            ) from err
        raise


def import_to_relax(model: torch.nn.Module, example: torch.Tensor) -> ImportedModel:
    """torch.export -> Relax, with the weights detached as separate parameters."""
    if not isinstance(example, torch.Tensor):
        raise InputShapeError(f"The example input must be a torch.Tensor, got {type(example).__name__}.")
    mod, params = to_relax(export(model, example))
    return ImportedModel(mod=mod, params=params, input_shape=tuple(example.shape), input_dtype=dtype_name(example))


def to_relax(program: torch.export.ExportedProgram) -> tuple[tvm.IRModule, list]:
    """An exported program as a Relax module, its weights detached: (module, weights of main)."""
    mod = from_exported_program(program, keep_params_as_input=True)
    mod, params = relax.frontend.detach_params(mod)
    return mod, list(params.get("main", []))


def dtype_name(tensor: torch.Tensor) -> str:
    """``torch.float32`` -> ``"float32"``, the spelling TVM uses."""
    return str(tensor.dtype).replace("torch.", "")
