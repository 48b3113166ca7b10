"""Device placement: codecs read a device payload to the host once; helpers make tensors where their inputs live.

Without a GPU two stand-ins emulate one:

* :class:`OnDevice`, a tensor subclass standing for a tensor on an accelerator: every read of
  its values on the host (``.cpu()``, ``.to("cpu")``, ``.numpy()``, ``.tolist()``, ``.item()``,
  ``float()``, ``int()``, ``bool()``, ``__index__``, ``np.asarray``) is counted and hands back a
  plain (host) tensor, and an operation that mixes it with a host tensor of one or more
  dimensions raises, as CUDA does;
* ``with torch.device("meta")``: a factory that forgets ``device=`` makes a meta tensor, which the
  CPU inputs refuse to combine with (the roles of host and device swapped).

The ``gpu``-marked tests run the same codecs and helpers on CUDA and compare with the CPU bits.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor

from fedlightning.callbacks.zampling_sensitivity import perturbation_draw
from fedlightning.compression import (
    QSGD,
    AdaptiveRandomSparsification,
    BiasedRandomSparsification,
    Blockwise,
    DeterministicNatural,
    ExponentialRounding,
    GradientSparsification,
    Identity,
    InducedCompressor,
    NaturalCompression,
    NaturalDithering,
    NURand1,
    RandK,
    ScaledSign,
    Sign,
    SparseCodec,
    StandardDithering,
    TernGrad,
    TopK,
    TopKThen,
)
from fedlightning.compression.arithmetic import BernoulliRangeCodec, LatticeCodec
from fedlightning.compression.codecs import BFloat16Codec, BitPackCodec, Float16Codec, Float32Codec
from fedlightning.compression.gated_sparse import GateMessageCodec, pack_gate_state
from fedlightning.compression.mask import MaskCodec
from fedlightning.compression.operators import Compressor
from fedlightning.datamodules import DigitsDataModule
from fedlightning.federated.channel import MEMORY_KEY, Channel, ReplicaCodec
from fedlightning.federated.message import Message
from fedlightning.federated.payloads import Payload
from fedlightning.federated.state import ClientStateStore
from fedlightning.methods import FedAvg
from fedlightning.methods.eflops_lagrangian import kl_to_constraint_pull
from fedlightning.models import build_model
from fedlightning.models.mlp import MLP
from fedlightning.models.ordered_dropout import od_architecture, ordered_units, sub_model_macs
from fedlightning.models.zampling import diagonal_q
from fedlightning.sampling import FullParticipation
from tests.conftest import round_trainer

LENGTHS = (1_000, 10_000)
"""Payload lengths: what a codec reads to the host must not grow from one to the other."""

HOST_READS = frozenset({"cpu", "numpy", "tolist", "item", "__float__", "__int__", "__bool__", "__index__", "__array__"})
MIXING_ALLOWED = frozenset({"__getitem__", "__setitem__", "copy_", "to"})
"""Operations CUDA lets a host tensor meet a device tensor in (host indices, copies)."""


def _tensors(value: Any) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _names_the_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a ``Tensor.to`` call (its arguments after ``self``) moves the tensor to the host."""
    for target in (*args, kwargs.get("device")):
        if isinstance(target, str | torch.device) and torch.device(target).type == "cpu":
            return True
        if isinstance(target, Tensor) and not isinstance(target, OnDevice):
            return True
    return False


class OnDevice(Tensor):
    """A CPU tensor standing for one on an accelerator (see the module docstring)."""

    reads: ClassVar[Counter[str]] = Counter()

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in HOST_READS or (name == "to" and _names_the_host(args[1:], kwargs)):
            cls.reads[name] += 1
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
            return out.as_subclass(Tensor) if isinstance(out, Tensor) else out
        if name not in MIXING_ALLOWED:
            host = [t for t in _tensors((args, kwargs)) if type(t) is Tensor and t.dim() > 0]
            if host:
                raise RuntimeError(f"{name}: a device tensor meets a host tensor of shape {tuple(host[0].shape)}")
        return super().__torch_function__(func, types, args, kwargs)


# ---------------------------------------------------------------------------- the codecs
@dataclass(frozen=True)
class Case:
    """A codec and a payload of a given length: ``make(numel) -> (encode, x)``."""

    name: str
    make: Callable[[int], tuple[Callable[[Tensor], Message], Tensor]]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _gaussian(numel: int, seed: int = 0) -> Tensor:
    return torch.randn(numel, generator=_generator(seed))


def _sparse(numel: int) -> Tensor:
    x = _gaussian(numel)
    return torch.where(torch.rand(numel, generator=_generator(1)) < 0.1, x, torch.zeros(()))


def _operator(name: str, make: Callable[[int], Compressor]) -> Case:
    def build(numel: int) -> tuple[Callable[[Tensor], Message], Tensor]:
        op = make(numel)
        return lambda x: op.compress(x, _generator(7)), _gaussian(numel)

    return Case(name, build)


def _codec(name: str, make: Callable[[int], Any], payload: Callable[[int], Tensor]) -> Case:
    def build(numel: int) -> tuple[Callable[[Tensor], Message], Tensor]:
        return make(numel).encode, payload(numel)

    return Case(name, build)


def _model_p(numel: int) -> Tensor:
    return torch.rand(numel, generator=_generator(2))


def _mask(numel: int) -> Tensor:
    return (torch.rand(numel, generator=_generator(3)) < _model_p(numel)).float()


def _natural_sparse(numel: int) -> Tensor:
    return NaturalCompression()(_sparse(numel), _generator(4))


def _lattice_points(numel: int) -> Tensor:
    return torch.randint(0, 6, (numel,), generator=_generator(6)) / 5


def _gate_state(numel: int) -> Tensor:
    dim = numel // 2
    pi = torch.rand(dim, generator=_generator(5))
    return pack_gate_state(_gaussian(dim), pi, pi > 0.9, 0.25, torch.tensor([0.1, 0.2]))


CASES = [
    _operator("identity", lambda n: Identity()),
    _operator("sign", lambda n: Sign()),
    _operator("scaled_sign", lambda n: ScaledSign()),
    _operator("natural", lambda n: NaturalCompression()),
    _operator("natural_deterministic", lambda n: DeterministicNatural()),
    _operator("exp_rounding", lambda n: ExponentialRounding(base=3.0)),
    _operator("standard_dithering", lambda n: StandardDithering(p=2.0, s=4)),
    _operator("qsgd", lambda n: QSGD(s=16)),
    _operator("terngrad", lambda n: TernGrad()),
    _operator("natural_dithering", lambda n: NaturalDithering(s=3)),
    _operator("natural_dithering_natural_norm", lambda n: NaturalDithering(s=3, norm_code="natural")),
    _operator("top_k", lambda n: TopK(fraction=0.01)),
    _operator("top_k_natural_values", lambda n: TopK(fraction=0.01, values="natural")),
    _operator("top_k_float16_values", lambda n: TopK(fraction=0.01, values="float16")),
    _operator("rand_k", lambda n: RandK(fraction=0.01)),
    _operator("rand_k_int8_values", lambda n: RandK(fraction=0.01, values="int8")),
    _operator("biased_rand", lambda n: BiasedRandomSparsification(q=0.05)),
    _operator("adaptive_rand", lambda n: AdaptiveRandomSparsification()),
    _operator("nu_rand_1", lambda n: NURand1()),
    _operator("grad_spars", lambda n: GradientSparsification(fraction=0.05)),
    _operator("top_k+natural_dithering", lambda n: TopKThen(NaturalDithering(s=2), fraction=0.01)),
    _operator("induced", lambda n: InducedCompressor(TopK(fraction=0.01), RandK(fraction=0.01))),
    _operator("top_k/layerwise", lambda n: Blockwise(TopK(fraction=0.01), [n // 2, n - n // 2])),
    _codec("float32", lambda n: Float32Codec(), _gaussian),
    _codec("float16", lambda n: Float16Codec(), _gaussian),
    _codec("bfloat16", lambda n: BFloat16Codec(), _gaussian),
    *(
        _codec(f"sparse[{v}]", lambda n, v=v: SparseCodec(value_codec=v), _sparse)
        for v in ("float32", "float16", "bfloat16", "int8")
    ),
    _codec("sparse[natural]", lambda n: SparseCodec(value_codec="natural"), _natural_sparse),
    _codec("bitpack", lambda n: BitPackCodec(), _mask),
    _codec("bernoulli_range", lambda n: BernoulliRangeCodec(model_p=_model_p(n)), _mask),
    _codec("mask_range_or_bitpack", lambda n: MaskCodec(model_p=_model_p(n)), _mask),
    _codec("lattice", lambda n: LatticeCodec(levels=5), _lattice_points),
    _codec("eflops_gates", lambda n: GateMessageCodec(num_groups=2), _gate_state),
]
CASE_IDS = [case.name for case in CASES]


def _same_message(got: Message, expected: Message) -> None:
    assert (bytes(got.payload), got.num_bits, got.header_bits) == (
        bytes(expected.payload),
        expected.num_bits,
        expected.header_bits,
    )


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_encoding_reads_a_device_payload_to_the_host_once_whatever_its_length(case: Case) -> None:
    for numel in LENGTHS:
        encode, x = case.make(numel)
        expected = encode(x)
        OnDevice.reads.clear()
        message = encode(x.as_subclass(OnDevice))
        assert sum(OnDevice.reads.values()) == 1, f"{numel} entries: {dict(OnDevice.reads)}"
        _same_message(message, expected)


@contextlib.contextmanager
def counting_host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Count every call of the tensor methods that read values to the host, on any tensor."""
    counts: Counter[str] = Counter()

    def counted(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Tensor, *args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return method(self, *args, **kwargs)

        return wrapper

    with monkeypatch.context() as patch:
        for name in ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__"):
            patch.setattr(Tensor, name, counted(name, getattr(Tensor, name)))
        yield counts


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_host_reads_while_encoding_do_not_grow_with_the_payload(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    totals = []
    for numel in LENGTHS:
        encode, x = case.make(numel)
        with counting_host_reads(monkeypatch) as counts:
            encode(x)
        totals.append(sum(counts.values()))
    assert totals[0] == totals[1], f"host reads per message for {LENGTHS}: {totals}"


def test_the_stand_in_device_refuses_a_host_tensor_and_counts_each_element_read() -> None:
    x = torch.arange(4.0).as_subclass(OnDevice)
    with pytest.raises(RuntimeError, match="device tensor meets a host tensor"):
        _ = x + torch.ones(4)
    OnDevice.reads.clear()
    assert [float(v) for v in x] == [0.0, 1.0, 2.0, 3.0]
    assert OnDevice.reads["__float__"] == 4


# ---------------------------------------------------------------------------- tensors made where their inputs are
def test_a_replica_message_decodes_on_the_device_of_its_reference() -> None:
    op, x, reference = TopK(k=3), _gaussian(20), _gaussian(20, seed=1)
    inner = op.compress(x - reference, _generator(0))
    assert torch.equal(ReplicaCodec.wrap(inner, op, reference).decode(), reference + inner.decode())
    on_meta = ReplicaCodec.wrap(inner, op, reference.to("meta")).decode()
    assert on_meta.device.type == "meta" and on_meta.shape == x.shape


def test_a_diagonal_q_and_its_layouts_live_on_the_device_of_its_values() -> None:
    values, columns = _gaussian(6), torch.tensor([4, 1])
    expected = diagonal_q(values)
    with torch.device("meta"):  # every factory below must follow its inputs, which are on the CPU
        q = diagonal_q(values)
        dense = q.to_dense()
        block = q.column_block(columns)
    assert torch.equal(q.cols, expected.cols) and torch.equal(dense, expected.to_dense())
    assert all(torch.equal(a, b) for a, b in zip(block, expected.column_block(columns), strict=True))


def test_the_sensitivity_perturbation_draws_on_its_generator_and_lands_on_the_device_of_p() -> None:
    p = torch.rand(50, generator=_generator(0))
    expected = perturbation_draw(p, 0.1, _generator(3))
    generator = _generator(3)
    with torch.device("meta"):
        got = perturbation_draw(p, 0.1, generator)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_the_sub_model_mac_count_probes_the_model_on_its_own_device() -> None:
    model = MLP(in_features=4, hidden=[8], num_classes=3)
    arch = od_architecture(model)
    units = ordered_units(arch.widths(), 0.5)
    expected = sub_model_macs(model, arch, units, (4,))
    with torch.device("meta"):
        assert sub_model_macs(model, arch, units, (4,)) == expected


def test_the_kl_pull_makes_its_prior_on_the_device_of_the_gates() -> None:
    pi = torch.tensor([0.5, 0.9])
    expected = kl_to_constraint_pull(pi, -2.0, 0.1, 0.5)
    with torch.device("meta"):
        assert torch.equal(kl_to_constraint_pull(pi, -2.0, 0.1, 0.5), expected)


# ---------------------------------------------------------------------------- on CUDA
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@contextlib.contextmanager
def counting_device_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Count the host reads of tensors that are not on the CPU (``.to`` only when it lands on the CPU)."""
    counts: Counter[str] = Counter()

    def counted(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Tensor, *args: Any, **kwargs: Any) -> Any:
            out = method(self, *args, **kwargs)
            moved = name != "to" or (isinstance(out, Tensor) and out.device.type == "cpu")
            if self.device.type != "cpu" and moved:
                counts[name] += 1
            return out

        return wrapper

    with monkeypatch.context() as patch:
        for name in ("to", "item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__"):
            patch.setattr(Tensor, name, counted(name, getattr(Tensor, name)))
        yield counts


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_a_cuda_payload_encodes_with_one_host_read_to_the_cpu_bits_and_decodes_alike(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    encode, x = case.make(LENGTHS[-1])
    expected = encode(x)
    on_device = x.cuda()
    with counting_device_reads(monkeypatch) as reads:
        message = encode(on_device)
    assert sum(reads.values()) == 1, dict(reads)
    _same_message(message, expected)
    assert torch.equal(message.decode().view(torch.int32), expected.decode().view(torch.int32))


@pytest.mark.gpu
@needs_cuda
def test_operators_and_replica_messages_give_cuda_results_with_the_cpu_bits() -> None:
    x, reference = _gaussian(1_000), _gaussian(1_000, seed=1)
    for op in (NaturalCompression(), TopK(k=10), QSGD(s=4), RandK(k=10)):
        got = op(x.cuda(), _generator(1))
        assert got.device.type == "cuda" and torch.equal(got.cpu(), op(x, _generator(1)))
    rounded = NaturalCompression().round(x.cuda(), _generator(2))
    assert rounded.device.type == "cuda" and torch.equal(rounded.cpu(), NaturalCompression().round(x, _generator(2)))
    op = TopK(k=10)
    inner = op.compress(x - reference, _generator(0))
    decoded = ReplicaCodec.wrap(inner, op, reference.cuda()).decode()
    expected = ReplicaCodec.wrap(inner, op, reference).decode()
    assert decoded.device.type == "cuda" and torch.equal(decoded.cpu(), expected)
    p = torch.rand(1_000, generator=_generator(3))
    drawn = perturbation_draw(p.cuda(), 0.1, _generator(4))
    assert all(
        a.device.type == "cuda" and torch.equal(a.cpu(), b)
        for a, b in zip(drawn, perturbation_draw(p, 0.1, _generator(4)), strict=True)
    )


@pytest.mark.parametrize(
    ("operator", "error_feedback"), [(QSGD(s=16), False), (TopK(fraction=0.01), True)], ids=["qsgd", "top_k_ef"]
)
def test_a_share_of_device_uploads_is_read_to_the_host_once_and_sent_as_row_by_row(
    operator: Compressor, error_feedback: bool
) -> None:
    def channel() -> Channel:
        ch = Channel(direction="uplink", payload=Payload.MODEL_DELTA, codec=Float32Codec(), method="m")
        ch.attach(operator, error_feedback=error_feedback, granularity="model")
        return ch

    share, ids = torch.randn(5, 2_000, generator=_generator(8)), [3, 1, 4, 0, 2]
    expected_store, got_store = ClientStateStore(), ClientStateStore()
    expected = [
        channel().send(share[k], client_id=cid, generator=_generator(cid), state=expected_store)[0]
        for k, cid in enumerate(ids)
    ]
    OnDevice.reads.clear()
    sent, decoded = channel().send_share(
        share.as_subclass(OnDevice), client_ids=ids, generator=_generator, state=got_store
    )
    assert sum(OnDevice.reads.values()) == 1, dict(OnDevice.reads)
    for k, want in enumerate(expected):
        _same_message(sent.message(k), want)
    assert len(decoded) == len(ids)
    if error_feedback:
        for cid in ids:
            assert torch.equal(got_store.get(cid, MEMORY_KEY), expected_store.get(cid, MEMORY_KEY))


@pytest.mark.gpu
@needs_cuda
def test_a_cuda_evaluation_serves_its_batches_from_a_device_copy_and_scores_as_on_the_cpu() -> None:
    dm = DigitsDataModule(num_clients=3, seed=0)
    torch.manual_seed(0)
    model = build_model("digits_mlp", input_shape=tuple(dm.input_shape), num_classes=dm.num_classes)
    module = FedAvg(model=model, datamodule=dm)
    round_trainer(2, [FullParticipation()], accelerator="cpu").fit(module)
    scores: dict[str, dict[str, float]] = {}
    for accelerator, device in (("cpu", "cpu"), ("gpu", "cuda")):
        trainer = round_trainer(0, [], accelerator=accelerator, devices=1)
        [val] = trainer.validate(module, verbose=False)
        assert trainer.val_dataloaders.dataset.tensors[0].device.type == device
        [test] = trainer.test(module, verbose=False)
        assert trainer.test_dataloaders.dataset.tensors[0].device.type == device
        scores[device] = {**val, **test}
    gpu, cpu = scores["cuda"], scores["cpu"]
    assert gpu["val/acc"] == pytest.approx(cpu["val/acc"], abs=1 / 144)  # one prediction of digits' 144 may flip
    assert gpu["test/acc"] == pytest.approx(cpu["test/acc"], abs=1 / 359)
    assert gpu["test/loss"] == pytest.approx(cpu["test/loss"], rel=1e-3)
