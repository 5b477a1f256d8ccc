"""The rank-file writer lays out a safetensors file exactly as `safetensors.torch.save_file` does, from the
tensors' names, dtypes and shapes alone, whatever order (and in however many row blocks) the data arrives."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trtpipe.checkpoint.rank_file import Layout, RankFileWriter, safetensors_dtype

# Every dtype the converters write (F16, BF16, F32 scales, I8 packed INT4 and INT8, F8_E4M3) and the rest torch
# and safetensors share, so a change of safetensors' sort order shows here first.
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.uint8, torch.int16, torch.int32, torch.int64, torch.float64, torch.bool)


def _random_tensors(rng: random.Random, generator: torch.Generator) -> dict[str, torch.Tensor]:
    tensors = {}
    for i in range(rng.randint(1, 40)):
        shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 3)))
        name = f"transformer.layers.{rng.randint(0, 12)}.t{i}.{rng.choice(['weight', 'bias', 'scale'])}"
        tensors[name] = (torch.randn(shape, generator=generator) * 3).to(rng.choice(DTYPES))
    return tensors


@pytest.mark.parametrize("seed", range(20))
def test_same_bytes_as_save_file(tmp_path: Path, seed: int) -> None:
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    tensors = _random_tensors(rng, generator)
    save_file(tensors, str(tmp_path / "reference.safetensors"))

    layout = Layout({name: (safetensors_dtype(t), tuple(t.shape)) for name, t in tensors.items()})
    writer = RankFileWriter(tmp_path / "streamed.safetensors", layout)
    items = list(tensors.items())
    rng.shuffle(items)
    for name, tensor in items:
        if tensor.dim() > 1 and tensor.shape[0] > 1 and rng.random() < 0.5:
            cut = rng.randint(1, tensor.shape[0] - 1)
            writer.write(name, tensor[:cut])
            writer.write(name, tensor[cut:])
        else:
            writer.write(name, tensor)
    writer.close()
    assert (tmp_path / "streamed.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()
    assert layout.file_bytes == (tmp_path / "reference.safetensors").stat().st_size


def test_metadata_goes_first(tmp_path: Path) -> None:
    tensors = {"b": torch.ones(3, dtype=torch.float16), "a": torch.zeros(2, 2)}
    save_file(tensors, str(tmp_path / "reference.safetensors"), metadata={"format": "pt"})
    layout = Layout({n: (safetensors_dtype(t), tuple(t.shape)) for n, t in tensors.items()}, metadata={"format": "pt"})
    writer = RankFileWriter(tmp_path / "mine.safetensors", layout)
    for name, tensor in tensors.items():
        writer.write(name, tensor)
    writer.close()
    assert (tmp_path / "mine.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()


def test_refuses_what_the_layout_does_not_hold(tmp_path: Path) -> None:
    layout = Layout({"w": ("F16", (2, 3)), "s": ("F32", (1,))})
    writer = RankFileWriter(tmp_path / "r.safetensors", layout)
    with pytest.raises(ValueError, match="not in the file's layout"):
        writer.write("x", torch.zeros(1))
    with pytest.raises(ValueError, match="is BF16, the layout says F16"):
        writer.write("w", torch.zeros(2, 3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="block has shape"):
        writer.write("w", torch.zeros(2, 2, dtype=torch.float16))
    writer.write("w", torch.zeros(2, 3, dtype=torch.float16))
    with pytest.raises(ValueError, match="more bytes than its shape holds"):
        writer.write("w", torch.zeros(1, 3, dtype=torch.float16))
    with pytest.raises(ValueError, match="not fully written, e.g. s"):
        writer.close()
