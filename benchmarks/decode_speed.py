"""Decode time of every codec on one 1M-coordinate message (median of repeats, one thread).

    python benchmarks/decode_speed.py [--numel 1000000] [--repeats 7]

Prints a Markdown table: codec, message bits, median decode milliseconds. Run it before and
after a change to the decoders and compare the columns.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from fedlightning.compression import QSGD, NaturalCompression, NaturalDithering, RandK, TopK
from fedlightning.compression.arithmetic import BernoulliRangeCodec, LatticeCodec
from fedlightning.compression.codecs import BFloat16Codec, BitPackCodec, Float16Codec, Float32Codec
from fedlightning.compression.index_coding import SparseCodec
from fedlightning.federated.message import Message


def messages(numel: int) -> dict[str, Message]:
    """One message per codec, all of ``numel`` coordinates, seed 0."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(numel, generator=g)
    p = torch.rand(numel, generator=g)
    z = (torch.rand(numel, generator=g) < p).float()
    sparse = torch.where(torch.rand(numel, generator=g) < 0.01, x, torch.zeros(()))
    lattice = torch.randint(0, 11, (numel,), generator=g).double() / 10
    out: dict[str, Message] = {
        "float32": Float32Codec().encode(x),
        "float16": Float16Codec().encode(x),
        "bfloat16": BFloat16Codec().encode(x),
        "bitpack": BitPackCodec().encode(z),
        "lattice(K=10)": LatticeCodec(levels=10).encode(lattice),
        "bernoulli_range": BernoulliRangeCodec(model_p=p).encode(z),
        "sparse[float32] (1 %)": SparseCodec(value_codec="float32").encode(sparse),
        "sparse[int8] (1 %)": SparseCodec(value_codec="int8").encode(sparse),
    }
    for name, op in {
        "top_k(1 %)": TopK(fraction=0.01),
        "rand_k(1 %)": RandK(fraction=0.01),
        "natural": NaturalCompression(),
        "natural_dithering(s=2)": NaturalDithering(s=2),
        "qsgd(s=16)": QSGD(s=16),
    }.items():
        out[name] = op.compress(x, torch.Generator().manual_seed(1))
    return out


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` in milliseconds (one warm-up call first)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--numel", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| codec | bits | decode ms |\n|---|---|---|")
    for name, msg in messages(args.numel).items():
        print(f"| {name} | {msg.num_bits:,} | {median_ms(msg.decode, args.repeats):.2f} |")


if __name__ == "__main__":
    main()
