"""Data for the example tasks, from tables that ship inside scikit-learn (nothing is downloaded).

    python examples/tasks/make_data.py cancer.csv   # 569 rows, 30 features, label column "diagnosis"
    python examples/tasks/make_data.py digits.npz   # x: [1797, 3, 16, 16] float32, y: [1797] int64
    python examples/tasks/make_data.py diabetes.csv # 442 rows, 10 features, float column "progression"

``cancer.csv`` is the Wisconsin breast-cancer table (for ``focal_tabular.py``): unscaled
features, two imbalanced classes named ``malignant`` and ``benign``. ``digits.npz`` is the UCI
digits upsampled to 16x16 and coloured into three channels (for ``resnet_small.py``): each image
gets a random ink colour and a little noise, so the channels differ and colour says nothing.
``diabetes.csv`` is the diabetes table (for ``linear_regression.py``): ten standardized features and a
float target, disease progression a year later; without scikit-learn a synthetic table of the same
shape (a noisy linear target) is written instead.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np


def write_breast_cancer_csv(path: Path) -> Path:
    from sklearn.datasets import load_breast_cancer

    table = load_breast_cancer()
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([*table.feature_names, "diagnosis"])
        for row, label in zip(table.data, table.target):
            writer.writerow([*(f"{v:.6g}" for v in row), table.target_names[label]])
    return path


def write_colour_digits_npz(path: Path, *, side: int = 16, seed: int = 0) -> Path:
    import torch
    from torch.nn import functional as F
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    gray = torch.as_tensor(digits.images / 16.0, dtype=torch.float32)[:, None]  # [N, 1, 8, 8] in [0, 1]
    gray = F.interpolate(gray, size=(side, side), mode="bilinear", align_corners=False).numpy()
    ink = rng.uniform(0.3, 1.0, size=(len(gray), 3, 1, 1)).astype(np.float32)
    noise = rng.normal(0.0, 0.05, size=(len(gray), 3, side, side)).astype(np.float32)
    np.savez(path, x=gray * ink + noise, y=digits.target.astype(np.int64))
    return path


def write_diabetes_csv(path: Path, *, seed: int = 0) -> Path:
    try:
        from sklearn.datasets import load_diabetes

        table = load_diabetes()
        names, features, target = list(table.feature_names), table.data, table.target
    except ImportError:  # the same shape, synthesized: a linear target plus noise
        rng = np.random.default_rng(seed)
        features = rng.normal(size=(442, 10))
        target = 150.0 + features @ rng.normal(0.0, 20.0, size=10) + rng.normal(0.0, 10.0, size=442)
        names = [f"f{i}" for i in range(10)]
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([*names, "progression"])
        for row, value in zip(features, target):
            writer.writerow([*(f"{v:.6g}" for v in row), f"{float(value):.1f}"])
    return path


WRITERS = {"cancer.csv": write_breast_cancer_csv, "digits.npz": write_colour_digits_npz,
           "diabetes.csv": write_diabetes_csv}

if __name__ == "__main__":
    if len(sys.argv) != 2 or Path(sys.argv[1]).name not in WRITERS:
        sys.exit(f"usage: make_data.py {' | '.join(WRITERS)}")
    print(WRITERS[Path(sys.argv[1]).name](Path(sys.argv[1])))
