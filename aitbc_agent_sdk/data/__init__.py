"""Datasets: arrays, text corpora (bytes or BPE tokens), image folders; their files, manifests and the
plans that shard them. Pure, or file I/O on paths the caller gives."""
