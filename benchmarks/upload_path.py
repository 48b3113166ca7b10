"""CPU milliseconds of one client's upload data path on S2's model (``mnistfc``, 266,610 weights).

    python benchmarks/upload_path.py [--repeats 30] [--calls 20]

After six local SGD steps at batch 10 (so caches hold what a real client leaves behind), each
arm folds the client's weights into the round's sums ``--calls`` times; the median over
``--repeats`` interleaved repetitions is printed per call. Arms:

* ``engine``: what the engine does for a plain FedAvg upload: the weights minus the broadcast
  written in one pass (``flat_difference``), the finiteness sum, the message's bitstream
  (``Float32Codec.encode``; the float32 wire reproduces the upload, so it is not decoded), and
  the float64 fold (``WeightedMean.accumulate``);
* ``engine_before``: the same as the engine did it until 2026-12-03 noon: a flat copy of the
  weights, the broadcast subtracted in place, the bitstream encoded and decoded, and the same
  fold;
* ``float32_codec``: the plain uplink's bitstream alone, encoded and decoded;
* ``peer``: the suite's plain peer: ``buf.add_(p, alpha=n_i)`` per tensor into float32 buffers;
* ``flat_float32``: the engine's flat difference folded into a float32 sum instead;
* ``difference_only``: the difference written tensor by tensor into a preallocated flat buffer;
* ``difference_float64``: that difference folded into the float64 sum.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from fedlightning.compression.codecs import Float32Codec
from fedlightning.federated.aggregators import WeightedMean
from fedlightning.federated.params import assign_flat_, flat_difference, flat_parameters
from fedlightning.models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)
    params = list(model.parameters())
    received = flat_parameters(model).clone()
    broadcast = [p.detach().clone() for p in params]
    dim = received.numel()
    x, y = torch.randn(10, 1, 28, 28), torch.randint(0, 10, (10,))
    opt = torch.optim.SGD(params, lr=0.01)
    float64_sums = WeightedMean(dim=dim, normalise=True)
    float32_sum = torch.zeros(dim)
    buffers = [torch.zeros_like(p) for p in params]
    difference = torch.empty(dim)

    def write_difference() -> None:
        offset = 0
        for p, g in zip(params, broadcast, strict=True):
            n = p.numel()
            torch.sub(p.detach().reshape(-1), g.reshape(-1), out=difference[offset : offset + n])
            offset += n

    codec = Float32Codec()

    def engine() -> None:
        upload = flat_difference(model, received)
        float(upload.sum())
        codec.encode(upload)
        float64_sums.accumulate(upload, weight=60.0)

    def engine_before() -> None:
        upload = flat_parameters(model).sub_(received)
        float(upload.sum())
        decoded = codec.encode(upload).decode()
        float64_sums.sums[:dim].add_(decoded, alpha=60.0)
        float64_sums.sums[dim] += 60.0

    def float32_codec() -> None:
        codec.encode(difference).decode()

    def peer() -> None:
        with torch.no_grad():
            for buf, p in zip(buffers, params, strict=True):
                buf.add_(p, alpha=60.0)

    def flat_float32() -> None:
        float32_sum.add_(flat_parameters(model) - received, alpha=60.0)

    def difference_float64() -> None:
        write_difference()
        float64_sums.accumulate(difference, weight=60.0)

    arms: dict[str, Callable[[], None]] = {
        "engine": engine,
        "engine_before": engine_before,
        "float32_codec": float32_codec,
        "peer": peer,
        "flat_float32": flat_float32,
        "difference_only": write_difference,
        "difference_float64": difference_float64,
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, fold in arms.items():
            assign_flat_(model, received)
            for _ in range(6):
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            start = time.process_time()
            for _ in range(args.calls):
                fold()
            times[name].append((time.process_time() - start) / args.calls * 1e3)
    for name, values in times.items():
        print(f"{name:20s} {statistics.median(values):.3f} ms per client (median of {args.repeats})")


if __name__ == "__main__":
    main()
