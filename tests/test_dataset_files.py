"""Datasets prepared from what users bring: labelled arrays read in chunks, text corpora tokenized."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aitbc_agent_sdk.errors import DatasetError
from aitbc_agent_sdk.data import _array_files as array_files
from aitbc_agent_sdk.data._array_files import write_class_sorted
from aitbc_agent_sdk.data._corpus import BYTE_EOT, decode_bytes, tokenize_corpus


def read_back(out: Path, layout) -> tuple[np.ndarray, np.ndarray]:
    x = np.fromfile(out / "x.f32", dtype=np.float32).reshape(-1, *layout.feature_shape)
    return x, np.fromfile(out / "y.i64", dtype=np.int64)


def as_rows(x: np.ndarray, y: np.ndarray) -> list[tuple]:
    return sorted((int(label), *row.ravel().tolist()) for row, label in zip(x, y))


@pytest.mark.parametrize("fmt", ["npz", "npz-compressed", "pt", "csv"])
def test_arrays_are_rewritten_class_sorted_in_chunks(tmp_path: Path, fmt: str, monkeypatch) -> None:
    monkeypatch.setattr(array_files, "CHUNK_BYTES", 64)  # many chunks: the chunked path, not one read
    rng = np.random.default_rng(0)
    x = rng.normal(size=(101, 2, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=101)
    if fmt == "csv":
        x = x.reshape(101, 6)
        src = tmp_path / "d.csv"
        lines = ["a,b,c,d,e,f,label"] + [",".join(f"{v:.9g}" for v in row) + f",{lab}" for row, lab in zip(x, y)]
        src.write_text("\n".join(lines) + "\n")
    elif fmt == "pt":
        src = tmp_path / "d.pt"
        torch.save({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}, src)
    else:
        src = tmp_path / "d.npz"
        (np.savez_compressed if fmt == "npz-compressed" else np.savez)(src, x=x, y=y)
    layout = write_class_sorted(src, tmp_path / "out", label_column="label")
    got_x, got_y = read_back(tmp_path / "out", layout)
    assert layout.class_rows == tuple(np.bincount(y, minlength=4))
    assert (np.diff(got_y) >= 0).all()  # sorted by class
    assert as_rows(got_x, got_y) == as_rows(x, y)  # the same rows, none lost or changed
    assert list(got_y) != sorted(y) or not np.array_equal(got_x, x[np.argsort(y, kind="stable")])  # shuffled within


def test_bad_arrays_get_clear_errors(tmp_path: Path) -> None:
    src = tmp_path / "bad.npz"
    np.savez(src, x=np.array([[np.nan], [1.0]], dtype=np.float32), y=np.array([0, 1]))
    with pytest.raises(DatasetError, match="NaN"):
        write_class_sorted(src, tmp_path / "o1")
    np.savez(src, x=np.ones((3, 2), dtype=np.float32), y=np.array([0, 0, 0]))
    with pytest.raises(DatasetError, match="at least 2 classes"):
        write_class_sorted(src, tmp_path / "o2")
    np.savez(src, features=np.ones((3, 2)), wrong=np.array([0, 1, 0]))
    with pytest.raises(DatasetError, match="expected arrays"):
        write_class_sorted(src, tmp_path / "o3")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(DatasetError, match="unknown extension"):
        write_class_sorted(tmp_path / "d.txt", tmp_path / "o4")


def test_a_corpus_becomes_byte_tokens_cut_at_documents(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    docs = {"a.txt": "hello wörld\n" * 30, "sub/b.txt": "second document", "c.txt": "x" * 1000}
    for name, text in docs.items():
        (corpus / name).write_text(text)
    (corpus / ".hidden.txt").write_text("secret")  # skipped, as `ipfs add` skips hidden files
    (corpus / "notes.md").write_text("not text corpus")
    layout, paths = tokenize_corpus(corpus, tmp_path / "tokens", file_tokens=256)
    tokens = np.concatenate([np.fromfile(p, dtype="<u2") for p in paths])
    assert layout.vocab_size == 257 and layout.dtype == "uint16"
    expected = "".join(docs[k] + "\n" for k in ("a.txt", "c.txt", "sub/b.txt"))  # path order, eot as newline
    assert decode_bytes(tokens) == expected
    assert int((tokens == BYTE_EOT).sum()) == 3
    assert all(p.stat().st_size <= 512 for p in paths) and len(paths) > 3
    with pytest.raises(DatasetError, match="no .txt files"):
        tokenize_corpus(tmp_path / "tokens", tmp_path / "t2")
