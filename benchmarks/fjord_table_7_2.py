"""Parameters and MACs of the ordered-dropout sub-models F_p, next to the thesis' Table 7.2.

    python benchmarks/fjord_table_7_2.py

Counts come from :mod:`fedlightning.models.ordered_dropout` (index-set sizes; MACs of the
convolutions and linear layers from ``torch.utils.flop_counter``). Models: the GroupNorm
ResNet-18 on 3×32×32 with 10 classes (the thesis' CIFAR-10 network), FedAvg's CNN on 1×28×28
with 62 classes (not the thesis' smaller two-convolution FEMNIST CNN) and the char-LSTM with the
thesis-sized 2 × LSTM(128) on an 8-dimensional embedding over 90 characters (parameters only:
the LSTM kernel is not seen by the MAC counter).
"""

from __future__ import annotations

from typing import Any

from fedlightning.models.ordered_dropout import OrderedDropout, ordered_units, sub_model_macs
from fedlightning.models.presets import build_model

WIDTHS = (0.2, 0.4, 0.6, 0.8, 1.0)
LSTM_128: dict[str, Any] = {"hidden": 128}
THESIS = {
    "CIFAR10/ResNet18": (["23M", "91M", "203M", "360M", "555M"], ["456K", "2M", "4M", "7M", "11M"]),
    "FEMNIST/CNN": (["47K", "120K", "218K", "342K", "491K"], ["5K", "10K", "15K", "20K", "26K"]),
    "Shakespeare/RNN": (["12K", "40K", "83K", "143K", "216K"], ["12K", "40K", "82K", "142K", "214K"]),
}


def _si(n: float) -> str:
    for unit, scale in (("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(int(n))


def main() -> None:
    cases = [
        ("CIFAR10/ResNet18", build_model("resnet18_gn", input_shape=(3, 32, 32), num_classes=10), (3, 32, 32)),
        ("FEMNIST/CNN", build_model("fedavg_cnn", input_shape=(1, 28, 28), num_classes=62), (1, 28, 28)),
        ("Shakespeare/RNN", build_model("char_lstm", input_shape=(80,), num_classes=90, **LSTM_128), None),
    ]
    print("| model | quantity | source | " + " | ".join(f"p = {p}" for p in WIDTHS) + " |")
    print("|---|---|---|" + "---|" * len(WIDTHS))
    for name, model, shape in cases:
        od = OrderedDropout(model)
        params = [_si(od.parameters_at(p)) for p in WIDTHS]
        thesis_macs, thesis_params = THESIS[name]
        if shape is not None:
            macs = [_si(sub_model_macs(model, od.arch, ordered_units(od.widths(), p), shape)) for p in WIDTHS]
            print(f"| {name} | MACs | measured | " + " | ".join(macs) + " |")
        print(f"| {name} | MACs | thesis | " + " | ".join(thesis_macs) + " |")
        print(f"| {name} | params | measured | " + " | ".join(params) + " |")
        print(f"| {name} | params | thesis | " + " | ".join(thesis_params) + " |")


if __name__ == "__main__":
    main()
