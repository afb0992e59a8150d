"""Memory-mapped indexed token datasets (``name.bin`` + ``name.idx``): the format Pythia's
pre-tokenized training data ships in (GPT-NeoX's and Megatron's "MMIDIDX"), read lazily.

``.idx`` (little endian): the magic ``MMIDIDX\\0\\0``, version 1 (u64), a dtype code (u8: 1 uint8,
2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), the number of sequences S
(u64) and of document boundaries D (u64), then the sequence lengths (int32 [S]), their byte
offsets into ``.bin`` (int64 [S]) and the document boundaries (int64 [D]: document d is the
sequences boundaries[d] .. boundaries[d + 1] - 1).  ``.bin`` holds the tokens.

    data = IndexedTokens("pile/document")      # document.bin + document.idx, nothing read yet
    data.num_documents, data.num_tokens
    stats = cooccurrence(data.batches(0, 10_000), vocab_size=50304)   # a shard: documents 0..9999

Nothing is copied until a document is asked for, so a shard is a range of documents.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = ["IndexedTokens"]

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}  # fmt: skip
_HEADER = 9 + 8 + 1 + 8 + 8


class IndexedTokens:
    """A ``.bin`` + ``.idx`` pair given by its common prefix (or either file's path)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        prefix = path.with_suffix("") if path.suffix in (".bin", ".idx") else path
        self.idx_path, self.bin_path = prefix.with_suffix(".idx"), prefix.with_suffix(".bin")
        for file in (self.idx_path, self.bin_path):
            if not file.is_file():
                raise FileNotFoundError(
                    f"no {file.suffix} file at {file} (an indexed dataset"
                    " is a .bin and an .idx with the same name)"
                )
        index = np.memmap(self.idx_path, dtype=np.uint8, mode="r")
        if index.size < _HEADER or bytes(index[:9]) != MAGIC:
            raise ValueError(f"{self.idx_path} is not an indexed-dataset index (no MMIDIDX header)")
        version, code, S, D = struct.unpack("<QBQQ", bytes(index[9:_HEADER]))
        if version != 1:
            raise ValueError(f"{self.idx_path}: index version {version}, only 1 is known")
        if code not in DTYPES:
            raise ValueError(f"{self.idx_path}: unknown dtype code {code}")
        need = _HEADER + 4 * S + 8 * S + 8 * D
        if index.size < need:
            raise ValueError(f"{self.idx_path} is truncated: {index.size} bytes, {need} needed")
        self.dtype = np.dtype(DTYPES[code])
        if self.dtype.kind == "f":
            raise ValueError(f"{self.idx_path} holds {self.dtype} values, not token ids")
        self.sizes = np.frombuffer(index, np.int32, S, _HEADER)
        self.pointers = np.frombuffer(index, np.int64, S, _HEADER + 4 * S)
        self.boundaries = np.frombuffer(index, np.int64, D, _HEADER + 12 * S)
        self.tokens = np.memmap(self.bin_path, dtype=self.dtype, mode="r")
        if S:
            end = self.pointers[-1] + self.sizes[-1].astype(np.int64) * self.dtype.itemsize
            if (self.sizes < 0).any() or end > self.tokens.nbytes:
                raise ValueError(f"{self.bin_path} is shorter than its index says")
        b = self.boundaries
        if D and (b[0] != 0 or b[-1] != S or (np.diff(b) < 0).any()):
            raise ValueError(f"{self.idx_path}: document boundaries must rise from 0 to {S}")

    @property
    def num_sequences(self) -> int:
        return int(self.sizes.size)

    @property
    def num_documents(self) -> int:
        return max(int(self.boundaries.size) - 1, 0)

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))

    def sequence(self, i: int) -> np.ndarray:
        """Sequence i as int64 ids."""
        start = int(self.pointers[i]) // self.dtype.itemsize
        return np.asarray(self.tokens[start : start + int(self.sizes[i])], dtype=np.int64)

    def document(self, d: int) -> np.ndarray:
        """Document d (its sequences, concatenated) as int64 ids."""
        if not 0 <= d < self.num_documents:
            raise IndexError(f"document {d} of {self.num_documents}")
        lo, hi = int(self.boundaries[d]), int(self.boundaries[d + 1])
        parts = [self.sequence(i) for i in range(lo, hi)]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def documents(self, start: int = 0, stop: int | None = None) -> Iterator[np.ndarray]:
        """Documents start .. stop - 1 (a shard), one array each, read as they are asked for."""
        stop = self.num_documents if stop is None else min(stop, self.num_documents)
        for d in range(start, stop):
            yield self.document(d)

    def batches(
        self, start: int = 0, stop: int | None = None, documents_per_batch: int = 4096
    ) -> Iterator[list[np.ndarray]]:
        """`documents` in lists, as `corpus.cooccurrence` takes an iterable of batches."""
        batch = []
        for doc in self.documents(start, stop):
            batch.append(doc)
            if len(batch) == documents_per_batch:
                yield batch
                batch = []
        if batch:
            yield batch

    def max_id(self) -> int:
        """The largest token id (one pass over ``.bin``)."""
        return int(self.tokens.max()) if self.tokens.size else -1
