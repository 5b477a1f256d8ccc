"""A safetensors file written tensor by tensor (or block by block), byte-identical to `safetensors.save_file`.

ModelOpt's exporter builds a whole rank's tensors in memory and calls `safetensors.torch.save_file(weights,
path)`. To write the same bytes without holding the rank, the layout is computed first from the tensors'
names, dtypes and shapes, and the data is then written at its offset as it becomes available, in any order.

The layout `save_file` writes (safetensors 0.4 and later, checked against the installed version by
tests/checkpoint/test_rank_file.py on every dtype the converters write):
  - 8 bytes: the header length N, little-endian u64;
  - N bytes: compact JSON (no spaces), "__metadata__" first when given, then one entry per tensor
    `"name":{"dtype":"F16","shape":[..],"data_offsets":[begin,end]}` in data order, padded with spaces
    to a multiple of 8 bytes;
  - the data: tensors ordered by dtype (the order of `_DTYPE_ORDER`), then by name, each packed
    little-endian and row-major, with no gaps.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# safetensors sorts the data by dtype, largest Dtype enum value first (safetensors/src/tensor.rs, `enum Dtype`:
# BOOL < F4 < F6_E2M3 < F6_E3M2 < U8 < I8 < F8_E5M2 < F8_E4M3 < F8_E8M0 < I16 < U16 < F16 < BF16 < I32 < U32
# < F32 < C64 < F64 < I64 < U64), then by name.
_DTYPE_ORDER = ("U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16", "F8_E8M0",
                "F8_E4M3", "F8_E5M2", "I8", "U8", "F6_E3M2", "F6_E2M3", "F4", "BOOL")
DTYPE_BYTES = {"U64": 8, "I64": 8, "F64": 8, "C64": 8, "F32": 4, "U32": 4, "I32": 4, "BF16": 2, "F16": 2, "U16": 2,
               "I16": 2, "F8_E8M0": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}
# torch dtype name (str(tensor.dtype) without "torch.") -> safetensors dtype
TORCH_DTYPES = {"float64": "F64", "float32": "F32", "bfloat16": "BF16", "float16": "F16", "int64": "I64",
                "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
                "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def safetensors_dtype(tensor: Any) -> str:
    """The safetensors dtype name of a torch tensor."""
    return TORCH_DTYPES[str(tensor.dtype).removeprefix("torch.")]


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # data offsets, relative to the end of the header
    end: int


class Layout:
    """Where each tensor of a safetensors file lives, computed from (name -> dtype, shape) alone."""

    def __init__(self, tensors: Mapping[str, tuple[str, tuple[int, ...]]], metadata: Mapping[str, str] | None = None):
        order = sorted(tensors, key=lambda name: (_DTYPE_ORDER.index(tensors[name][0]), name))
        self.entries: dict[str, TensorEntry] = {}
        offset = 0
        for name in order:
            dtype, shape = tensors[name]
            size = DTYPE_BYTES[dtype]
            for dim in shape:
                size *= int(dim)
            self.entries[name] = TensorEntry(dtype, tuple(int(d) for d in shape), offset, offset + size)
            offset += size
        header: dict[str, Any] = {}
        if metadata:
            header["__metadata__"] = dict(metadata)
        for name, entry in self.entries.items():
            header[name] = {"dtype": entry.dtype, "shape": list(entry.shape), "data_offsets": [entry.begin, entry.end]}
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        text += b" " * (-len(text) % 8)
        self.header = struct.pack("<Q", len(text)) + text
        self.data_bytes = offset

    @property
    def file_bytes(self) -> int:
        return len(self.header) + self.data_bytes


class RankFileWriter:
    """Write a safetensors file whose layout is known up front; tensors arrive in any order, each in one
    piece or in consecutive row blocks. `close()` refuses a file with a tensor missing or short.

    The file is created at its full size first (sparse where not yet written), so a reader that opens it
    before `close()` sees zeros, never a truncated file; the converters write into a staging directory."""

    def __init__(self, path: Path, layout: Layout) -> None:
        self.path = Path(path)
        self.layout = layout
        self._next: dict[str, int] = {name: 0 for name in layout.entries}  # bytes of each tensor written so far
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(self._fd, layout.header, 0)
            os.ftruncate(self._fd, layout.file_bytes)
        except BaseException:
            os.close(self._fd)
            raise

    def write(self, name: str, tensor: Any) -> None:
        """Write `tensor` (all of it, or the next rows of it) into tensor `name`."""
        import torch

        entry = self.layout.entries.get(name)
        if entry is None:
            raise ValueError(f"{self.path.name}: tensor {name} is not in the file's layout")
        dtype = safetensors_dtype(tensor)
        if dtype != entry.dtype:
            raise ValueError(f"{self.path.name}: tensor {name} is {dtype}, the layout says {entry.dtype}")
        if tuple(tensor.shape[1:]) != entry.shape[1:] and tuple(tensor.shape) != entry.shape:
            raise ValueError(f"{self.path.name}: tensor {name} block has shape {list(tensor.shape)}, "
                             f"the layout says {list(entry.shape)}")
        data = tensor.detach().contiguous().view(-1).view(torch.uint8).numpy()
        start = self._next[name]
        if entry.begin + start + data.nbytes > entry.end:
            raise ValueError(f"{self.path.name}: tensor {name} is given more bytes than its shape holds")
        view = memoryview(data)
        where = len(self.layout.header) + entry.begin + start
        while view:
            written = os.pwrite(self._fd, view, where)
            view, where = view[written:], where + written
        self._next[name] = start + data.nbytes

    def close(self) -> None:
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        os.close(fd)
        short = [name for name, entry in self.layout.entries.items() if self._next[name] != entry.end - entry.begin]
        if short:
            raise ValueError(f"{self.path.name}: {len(short)} tensor(s) not fully written, e.g. {short[0]}")

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
