"""Data for the example tasks, from tables that ship inside scikit-learn (nothing is downloaded).

    python examples/tasks/make_data.py cancer.csv   # 569 rows, 30 features, label column "diagnosis"
    python examples/tasks/make_data.py digits.npz   # x: [1797, 3, 16, 16] float32, y: [1797] int64

``cancer.csv`` is the Wisconsin breast-cancer table (for ``focal_tabular.py``): unscaled
features, two imbalanced classes named ``malignant`` and ``benign``. ``digits.npz`` is the UCI
digits upsampled to 16x16 and coloured into three channels (for ``resnet_small.py``): each image
gets a random ink colour and a little noise, so the channels differ and colour says nothing.
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


WRITERS = {".csv": write_breast_cancer_csv, ".npz": write_colour_digits_npz}

if __name__ == "__main__":
    if len(sys.argv) != 2 or Path(sys.argv[1]).suffix not in WRITERS:
        sys.exit("usage: make_data.py cancer.csv | digits.npz")
    print(WRITERS[Path(sys.argv[1]).suffix](Path(sys.argv[1])))
