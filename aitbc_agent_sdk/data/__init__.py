"""Datasets: arrays, text corpora (bytes or BPE tokens), image folders; their files, manifests and the
plans that shard them. Pure, or file I/O on paths the caller gives."""

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "_corpus": ("TEXT_SUFFIXES",),
    "_dataset_dirs": ("dataset_kind", "visible_files",),
    "_datasets": ("load_dataset",),
}, globals())
