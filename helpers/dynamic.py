"""One compiled module for every batch size: a symbolic batch dimension.

``models.import_to_relax`` traces the model at one input shape, so the compiled
code only accepts that shape, and a batch-size sweep would import and compile
once per batch. Here ``torch.export`` marks the batch dimension as dynamic, the
Relax module takes ``(batch, ...)`` with ``batch`` a symbolic variable, and one
``tvm.compile`` serves every batch from 1 to ``max_batch``.

The price: the kernels are generated for an unknown batch, so a tuner (Day 8)
cannot specialise them to one shape. For untuned comparisons and sweeps that
does not matter; for tuned numbers compile each shape statically.

Introduced on Day 4.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import tvm

from .build import CompiledModel, compile_model, device_for, load_executable
from .errors import InputShapeError
from .machine import cpu_target
from .models import ImportedModel, dtype_name, export, to_relax


@dataclass
class DynamicImport(ImportedModel):
    """An imported model whose first input dimension (the batch) is symbolic.

    ``input_shape`` holds the example's shape; only its trailing dimensions are
    fixed in the module.
    """

    max_batch: int = 64


def import_dynamic_batch(model: torch.nn.Module, example: torch.Tensor, max_batch: int = 64) -> DynamicImport:
    """torch.export with a dynamic batch dimension -> Relax, weights split out.

    ``example`` may have any batch size; it only fixes the other dimensions.
    """
    if not isinstance(example, torch.Tensor) or example.dim() < 1:
        raise InputShapeError("The example input must be a torch.Tensor with a batch dimension first.")
    if max_batch < 2:
        raise ValueError(f"max_batch must be at least 2 for a dynamic batch, got {max_batch}.")
    # torch.export specialises a dimension of size 1, so trace with a batch of 2.
    trace = example[:1].repeat(2, *[1] * (example.dim() - 1))
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    mod, params = to_relax(export(model, trace, dynamic_shapes=({0: batch},)))
    return DynamicImport(
        mod=mod, params=params, input_shape=tuple(example.shape), input_dtype=dtype_name(example), max_batch=max_batch
    )


@dataclass
class DynamicBatchModel(CompiledModel):
    """A compiled model that accepts any batch from 1 to ``max_batch``.

    Works everywhere a ``CompiledModel`` does (``timing.tvm_runner``,
    ``profiling.profile``, ``build.check_parity``).
    """

    max_batch: int = 64

    def check_input(self, array: np.ndarray) -> None:
        fixed = tuple(self.input_shape[1:])
        ok = (
            array.ndim == len(self.input_shape)
            and tuple(array.shape[1:]) == fixed
            and str(array.dtype) == self.input_dtype
            and 1 <= array.shape[0] <= self.max_batch
        )
        if not ok:
            raise InputShapeError(
                f"This module takes (batch, {', '.join(map(str, fixed))}) {self.input_dtype} with "
                f"1 <= batch <= {self.max_batch}, but got {tuple(array.shape)} {array.dtype}."
            )


def compile_dynamic(
    imported: DynamicImport,
    target: tvm.target.Target | None = None,
    pipeline: str | tvm.transform.Pass = "default",
) -> DynamicBatchModel:
    """tvm.compile a dynamic-batch module for ``target`` (default: this CPU) and load it."""
    target = target or cpu_target()
    device_for(target)  # fail before a long compile when the device is missing
    compiled = compile_model(imported, target, pipeline)
    return DynamicBatchModel(**vars(compiled), max_batch=imported.max_batch)
