"""Parameters and MACs of the ordered-dropout sub-models F_p, next to the thesis' Table 7.2.

    python benchmarks/fjord_table_7_2.py

Counts come from :mod:`fedlightning.models.ordered_dropout` (index-set sizes; MACs of the
convolutions and linear layers from ``torch.utils.flop_counter``, of the LSTM per time step from
:func:`fedlightning.metrics.inference_cost.lstm_step_macs`). Models, as their configs build them:
``resnet18_gn`` on 3×32×32 with 10 classes (the thesis' CIFAR-10 network), ``fjord_femnist_cnn``
on 1×28×28 with 62 classes (the FEMNIST CNN, its shape recovered from this table) and
``fjord_char_lstm`` over data=shakespeare's 90 character ids (the Shakespeare RNN). The RNN's MACs
are printed twice: matrix products only (the usual convention), and with biases and element-wise
operations counted too.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fedlightning.models.ordered_dropout import OrderedDropout, ordered_units, sub_model_macs
from fedlightning.models.presets import build_model

WIDTHS = (0.2, 0.4, 0.6, 0.8, 1.0)
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


def table_models() -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    """(row name, model, input shape) of Table 7.2's three networks."""
    return [
        ("CIFAR10/ResNet18", build_model("resnet18_gn", input_shape=(3, 32, 32), num_classes=10), (3, 32, 32)),
        ("FEMNIST/CNN", build_model("fjord_femnist_cnn", input_shape=(1, 28, 28), num_classes=62), (1, 28, 28)),
        ("Shakespeare/RNN", build_model("fjord_char_lstm", input_shape=(80,), num_classes=90), (80,)),
    ]


def _row(name: str, quantity: str, source: str, cells: Sequence[str]) -> str:
    return f"| {name} | {quantity} | {source} | " + " | ".join(cells) + " |"


def main() -> None:
    print("| model | quantity | source | " + " | ".join(f"p = {p}" for p in WIDTHS) + " |")
    print("|---|---|---|" + "---|" * len(WIDTHS))
    for name, model, shape in table_models():
        od = OrderedDropout(model)
        units = [ordered_units(od.widths(), p) for p in WIDTHS]
        thesis_macs, thesis_params = THESIS[name]
        macs = [_si(sub_model_macs(model, od.arch, u, shape)) for u in units]
        if name == "Shakespeare/RNN":
            print(_row(name, "MACs", "measured (matrix products)", macs))
            every = [_si(sub_model_macs(model, od.arch, u, shape, elementwise=True)) for u in units]
            print(_row(name, "MACs", "measured (+ biases, element-wise)", every))
        else:
            print(_row(name, "MACs", "measured", macs))
        print(_row(name, "MACs", "thesis", thesis_macs))
        print(_row(name, "params", "measured", [_si(od.parameters_at(p)) for p in WIDTHS]))
        print(_row(name, "params", "thesis", thesis_params))


if __name__ == "__main__":
    main()
