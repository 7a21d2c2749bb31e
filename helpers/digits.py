"""Real labelled images and a network trained on them, for measuring accuracy honestly (Day 12).

The course's ImageNet models have random weights here (no trained weights can be downloaded), so they
serve speed, never accuracy. Accuracy needs trained weights and labelled data that a registry package
ships: scikit-learn's handwritten digits (1,797 scans of 8x8 pixels, 16 grey levels, from the UCI
repository; ``sklearn.datasets.load_digits`` reads them from the package, nothing is downloaded).

The network is MobileNetV2's architecture (torchvision's class: the same inverted residual blocks,
1x1 expansion, 3x3 depthwise, 1x1 projection, ReLU6, residual adds), with four stages instead of seven,
one input channel and ten classes, on the digits resized to 32x32. Day 12's int8 steps apply to it
unchanged. Its weights ship with the course (``WEIGHTS``, float16, about 0.4 MB), trained by
``python -m helpers.digits`` (deterministic: seeded, one thread), on ``TRAINING`` images; the other
``TEST_IMAGES`` are never seen in training or calibration.

Introduced on Day 12.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np
import torch
import torchvision

from .errors import CourseError

WEIGHTS = Path(__file__).parent / "weights" / "digits_mobilenet_v2.pt"
SIZE = 32  # the 8x8 scans, resized: MobileNetV2's four stride-2 stages leave 2x2 pixels
TEST_IMAGES = 900  # the held-out test set; the other 897 images train the network and calibrate int8
SPLIT_SEED = 0
STAGES = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 2, 2], [6, 64, 2, 2]]  # MobileNetV2's first four: expansion,
# channels, blocks, stride
CLASSES = 10
BATCH = 100  # images a call, when testing and calibrating (a batch-1 build would make 900 calls)


@functools.lru_cache(maxsize=1)
def _images_and_labels() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    x = torch.nn.functional.interpolate(x, size=SIZE, mode="bilinear", align_corners=False)
    return (x - 0.5) / 0.5, torch.tensor(digits.target)


def _split() -> tuple[torch.Tensor, torch.Tensor]:
    """(training indices, test indices): one seeded shuffle, the same on every machine."""
    labels = _images_and_labels()[1]
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    return order[TEST_IMAGES:], order[:TEST_IMAGES]


def training_set() -> tuple[torch.Tensor, torch.Tensor]:
    """(images ``[897, 1, 32, 32]`` in -1..1, labels 0-9): what trains the network and calibrates int8."""
    x, y = _images_and_labels()
    train, _ = _split()
    return x[train], y[train]


def test_set(count: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels) of the held-out test set, its first ``count`` images (default: all 900)."""
    x, y = _images_and_labels()
    _, test = _split()
    test = test if count is None else test[:count]
    return x[test], y[test]


def calibration_inputs(images: int = 2 * BATCH, batch: int = BATCH) -> list[torch.Tensor]:
    """Batches of training images for int8 calibration (never test images)."""
    x, _ = training_set()
    return list(x[:images].split(batch))


def architecture() -> torch.nn.Module:
    """The untrained network: torchvision's MobileNetV2 with ``STAGES``, one input channel, ten classes."""
    model = torchvision.models.MobileNetV2(num_classes=CLASSES, inverted_residual_setting=STAGES)
    stem = model.features[0][0]
    model.features[0][0] = torch.nn.Conv2d(1, stem.out_channels, 3, stride=1, padding=1, bias=False)
    return model


def trained_model() -> torch.nn.Module:
    """The network with the weights that ship with the course, in float32, ready for inference."""
    if not WEIGHTS.exists():
        raise CourseError(f"The digits network's weights are missing ({WEIGHTS}). They ship with the course: "
                          "restore them with `git checkout -- helpers/weights`, or retrain them with "
                          "`python -m helpers.digits` (about two minutes).")
    model = architecture()
    state = torch.load(WEIGHTS, weights_only=True)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return model.eval()


def predictions(run, images: torch.Tensor, batch: int = BATCH) -> np.ndarray:
    """The class ``run(x) -> logits`` picks for each image, fed ``batch`` images a call (the last call padded)."""
    picked = []
    with torch.no_grad():
        for start in range(0, len(images), batch):
            chunk = images[start:start + batch]
            padded = torch.cat([chunk, chunk[:1].expand(batch - len(chunk), *chunk.shape[1:])]) if len(chunk) < batch else chunk
            picked.append(np.asarray(run(padded)).argmax(-1)[:len(chunk)])
    return np.concatenate(picked)


def train(epochs: int = 20, batch: int = 32, seed: int = 0) -> torch.nn.Module:
    """Train ``architecture()`` on the training set: AdamW with a one-cycle rate, images shifted by up to two
    pixels. Deterministic on one thread; about two minutes on two cores."""
    torch.manual_seed(seed)
    x, y = training_set()
    model = architecture()
    steps = epochs * (len(y) // batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(order) - batch + 1, batch):
            chosen = order[start:start + batch]
            shift = tuple(int(s) for s in torch.randint(-2, 3, (2,), generator=generator))
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.roll(x[chosen], shift, dims=(2, 3))), y[chosen])
            loss.backward()
            optimizer.step()
            schedule.step()
    return model.eval()


def main() -> None:
    """The maintainer's command: train, check on the test set, write ``WEIGHTS`` in float16."""
    torch.set_num_threads(1)
    started = time.perf_counter()
    model = train()
    state = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    WEIGHTS.parent.mkdir(exist_ok=True)
    torch.save(state, WEIGHTS)
    images, labels = test_set()
    correct = int((predictions(trained_model(), images) == labels.numpy()).sum())
    print(f"trained in {time.perf_counter() - started:.0f} s; {correct} of {len(labels)} test images right; "
          f"wrote {WEIGHTS} ({WEIGHTS.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
