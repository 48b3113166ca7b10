"""Shakespeare next-character prediction, one natural client per play and speaking role.

The federated Shakespeare data set of LEAF (Caldas et al., 2018, arXiv:1812.01097), as used
by FedAvg (McMahan et al., 2017, arXiv:1602.05629): each client is one speaking role of one
play; an example is an 80-character window ``x`` and the character ``y`` that follows it.

Three sources, read without writing anything into ``root``:

* ``tff`` — TensorFlow Federated's HDF5 files ``<root>/shakespeare/shakespeare_{train,test}.h5``
  (group ``examples/<client>/snippets``: one byte string per speech; 715 clients, 16,068 train
  and 2,356 test speeches).
* ``leaf`` — LEAF's JSON output, ``<root>/shakespeare/leaf/{train,test}/*.json`` with
  ``{"users", "num_samples", "user_data": {u: {"x": [80-char strings], "y": [chars]}}}``.
* ``text`` — plain play text (``data.text_file``), split into roles by :func:`parse_roles`
  following LEAF's rules, then each role's speeches are split into train and test in order.

Speeches become windows as follows. With the ``tff`` vocabulary (the default; 86 characters
plus pad 0, out-of-vocabulary 87, beginning 88 and end 89 of a speech, 90 ids, as in TFF's
baselines) each speech is wrapped in BOS/EOS and a role's speeches are concatenated. With the
``leaf`` vocabulary (LEAF's 80 letters; other characters map to space) a role's speeches are
joined by spaces, newlines become spaces and runs of spaces collapse, as LEAF's
``txt_to_data`` does. A role shorter than one window is left-padded (pad id, or space for
``leaf``), so every role with a speech is a client. Windows start every ``stride`` characters
(``1`` is LEAF's sliding window); the test windows every ``eval_stride`` characters, because
evaluating an LSTM on every position of the test text costs 80 times more.

Features are stored as ``uint8`` character ids and returned as ``int64`` by
:meth:`ShakespeareDataModule.transform` (the engine's ``augment`` path and the evaluation
loaders); :class:`~fedlightning.models.char_lstm.CharLSTM` accepts either.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlightning.datamodules.base import DataUnavailableError, FederatedDataModule

__all__ = [
    "LEAF_LETTERS",
    "TFF_CHARS",
    "ShakespeareDataModule",
    "Vocabulary",
    "char_windows",
    "parse_roles",
]

log = logging.getLogger(__name__)

#: The 86 characters of TFF's Shakespeare baselines, ids 1..86 in this order.
TFF_CHARS = "dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]!%)-159\r"
#: The 80 characters of LEAF's Shakespeare model (``ALL_LETTERS``), ids 0..79 in this order.
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"

SEQ_LEN = 80
#: TFF's archive of the two HDF5 files.
TFF_URL = "https://storage.googleapis.com/tff-datasets-public/shakespeare.tar.bz2"


class Vocabulary:
    """Character-to-id table of the ``tff`` (90 ids) or ``leaf`` (80 ids) vocabulary.

    Example:
        >>> v = Vocabulary("tff")
        >>> v.size, v.pad, v.oov, v.bos, v.eos
        (90, 0, 87, 88, 89)
        >>> v.encode(b"dh~").tolist()
        [1, 2, 87]
        >>> Vocabulary("leaf").encode(b"A\\t").tolist()
        [25, 1]
    """

    def __init__(self, kind: str = "tff") -> None:
        if kind not in ("tff", "leaf"):
            raise ValueError(f"data.vocabulary must be 'tff' or 'leaf' (got {kind!r}).")
        self.kind = kind
        lut = np.empty(256, dtype=np.uint8)
        if kind == "tff":
            self.chars = TFF_CHARS
            self.pad, self.oov = 0, len(TFF_CHARS) + 1
            self.bos, self.eos = len(TFF_CHARS) + 2, len(TFF_CHARS) + 3
            self.size = len(TFF_CHARS) + 4
            lut[:] = self.oov
            lut[np.frombuffer(TFF_CHARS.encode(), np.uint8)] = np.arange(1, len(TFF_CHARS) + 1)
        else:
            self.chars = LEAF_LETTERS
            space = LEAF_LETTERS.index(" ")
            self.pad = self.oov = space  # LEAF has no special ids; unknown characters become spaces
            self.bos = self.eos = -1
            self.size = len(LEAF_LETTERS)
            lut[:] = space
            lut[np.frombuffer(LEAF_LETTERS.encode(), np.uint8)] = np.arange(len(LEAF_LETTERS))
        self._lut = lut

    def encode(self, text: bytes | str) -> np.ndarray:
        """Ids of the characters of ``text`` (ASCII; other bytes are out of vocabulary)."""
        raw = text.encode("utf-8", "replace") if isinstance(text, str) else text
        return self._lut[np.frombuffer(raw, dtype=np.uint8)]

    def role_sequence(self, speeches: Sequence[bytes | str]) -> np.ndarray:
        """One role's speeches as a single id sequence (see the module docstring)."""
        if self.kind == "tff":
            parts: list[np.ndarray] = []
            for s in speeches:
                parts += [np.array([self.bos], np.uint8), self.encode(s), np.array([self.eos], np.uint8)]
            return np.concatenate(parts) if parts else np.empty(0, np.uint8)
        text = " ".join(s.decode("utf-8", "replace") if isinstance(s, bytes) else s for s in speeches)
        return self.encode(re.sub(r"  +", " ", text.replace("\n", " ")))


def char_windows(seq: np.ndarray, *, seq_len: int, stride: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows ``x = seq[i : i + seq_len]`` and targets ``y = seq[i + seq_len]`` for ``i = 0, stride, ...``.

    A sequence shorter than ``seq_len + 1`` is left-padded with ``pad`` to give one window.

    Example:
        >>> x, y = char_windows(np.arange(6, dtype=np.uint8), seq_len=3, stride=2, pad=0)
        >>> x.tolist(), y.tolist()
        ([[0, 1, 2], [2, 3, 4]], [3, 5])
        >>> char_windows(np.array([7, 8], np.uint8), seq_len=3, stride=1, pad=0)[0].tolist()
        [[0, 0, 7]]
    """
    if len(seq) < seq_len + 1:
        seq = np.concatenate([np.full(seq_len + 1 - len(seq), pad, dtype=seq.dtype), seq])
    w = np.lib.stride_tricks.sliding_window_view(seq, seq_len + 1)[::stride]
    return np.ascontiguousarray(w[:, :seq_len]), w[:, seq_len].astype(np.int64)


_COLON_SPEAKER = re.compile(r"^([A-Z][A-Za-z' .-]*[A-Za-z.]):\s*$")
_GUTENBERG_SPEAKER = re.compile(r"^  ([A-Z][A-Za-z ]*[A-Za-z])\. (.*)$")


def parse_roles(text: str, *, play: str = "PLAY") -> dict[str, list[str]]:
    """Split play text into speeches per speaking role, following LEAF's rules.

    Two layouts are recognised: a speaker's name alone on a line ending in ``:`` followed by
    the speech (Karpathy's ``tinyshakespeare.txt``), and LEAF's Project Gutenberg layout where
    a speech starts with ``"  NAME. "`` and continues on more-indented lines. As in LEAF,
    consecutive lines of one speaker form one speech, lines outside speeches are ignored, and
    a client is ``<PLAY>_<ROLE>`` (upper case, non-alphanumerics as ``_``). Splitting a
    complete-works file into its plays is not done here: pass one play's text at a time (or
    accept that equal role names across plays merge).

    Args:
        text: The play text.
        play: Play name used in client ids.

    Returns:
        Client id to its speeches, in order of first appearance.

    Example:
        >>> text = "First Citizen:\\nSpeak.\\nNow.\\n\\nAll:\\nAye.\\n\\nFirst Citizen:\\nGo.\\n"
        >>> parse_roles(text, play="Coriolanus")
        {'CORIOLANUS_FIRST_CITIZEN': ['Speak.\\nNow.', 'Go.'], 'CORIOLANUS_ALL': ['Aye.']}
    """
    roles: dict[str, list[str]] = {}
    prefix = re.sub(r"[^A-Z0-9]+", "_", play.upper()).strip("_")
    speaker: str | None = None
    lines: list[str] = []

    def flush() -> None:
        if speaker is not None and lines:
            speech = "\n".join(lines).strip()
            if speech:
                key = f"{prefix}_{re.sub(r'[^A-Z0-9]+', '_', speaker.upper()).strip('_')}"
                roles.setdefault(key, []).append(speech)

    for line in text.splitlines():
        colon = _COLON_SPEAKER.match(line)
        guten = _GUTENBERG_SPEAKER.match(line)
        if colon:
            flush()
            speaker, lines = colon.group(1), []
        elif guten:
            flush()
            speaker, lines = guten.group(1), [guten.group(2).strip()]
        elif not line.strip():
            flush()
            speaker, lines = None, []
        elif speaker is not None:
            lines.append(line.strip())
    flush()
    return roles


class ShakespeareDataModule(FederatedDataModule):
    """Federated Shakespeare: next character after 80 characters, clients = play roles.

    Takes the keyword arguments of :class:`FederatedDataModule` and:

    Args:
        source: ``auto`` (TFF HDF5 if present, else LEAF JSON, else ``text_file``), ``tff``,
            ``leaf`` or ``text``.
        vocabulary: ``tff`` (90 ids) or ``leaf`` (80 ids).
        stride: Characters between training windows (``1``: LEAF's sliding window).
        eval_stride: Characters between test windows.
        text_file: Plain play text for ``source=text``.
        text_train_fraction: Share of each role's speeches (the first ones) used for training
            with ``source=text``; the rest is the role's test data.
        **kwargs: :class:`FederatedDataModule` arguments (``root``, ``num_clients``, ...).

    With ``partition=natural`` each client is one role; ``data.num_clients`` must then be the
    number of roles (715 for TFF) or fewer (roles are merged).
    """

    name = "shakespeare"
    num_classes = 90
    input_shape = (SEQ_LEN,)
    feature_dtype = None  # keep uint8 ids; ``transform`` gives int64 per batch
    token_inputs = True

    def __init__(
        self,
        *,
        source: str = "auto",
        vocabulary: str = "tff",
        stride: int = 1,
        eval_stride: int = SEQ_LEN,
        text_file: str | None = None,
        text_train_fraction: float = 0.8,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        if source not in ("auto", "tff", "leaf", "text"):
            raise ValueError(f"data.source must be auto, tff, leaf or text (got {source!r}).")
        if stride < 1 or eval_stride < 1:
            raise ValueError(f"data.stride and data.eval_stride must be >= 1 (got {stride}, {eval_stride}).")
        if not 0.0 < text_train_fraction < 1.0:
            raise ValueError(f"data.text_train_fraction must be in (0, 1) (got {text_train_fraction}).")
        self.vocab = Vocabulary(vocabulary)
        self.num_classes = self.vocab.size
        self.source = source
        self.stride = int(stride)
        self.eval_stride = int(eval_stride)
        self.text_file = Path(text_file).expanduser() if text_file else None
        self.text_train_fraction = float(text_train_fraction)
        self.client_names: list[str] = []
        #: Speeches (``tff``/``text``) or LEAF samples read, per split.
        self.snippet_counts: dict[str, int] = {}
        self._groups: np.ndarray | None = None

    # -- files -----------------------------------------------------------------------------

    @property
    def folder(self) -> Path:
        """``<root>/shakespeare``."""
        return self.root / "shakespeare"

    def _tff_files(self) -> list[Path]:
        return [self.folder / f"shakespeare_{s}.h5" for s in ("train", "test")]

    def _resolve_source(self) -> str:
        if self.source != "auto":
            return self.source
        if all(p.is_file() for p in self._tff_files()):
            return "tff"
        if (self.folder / "leaf" / "train").is_dir():
            return "leaf"
        if self.text_file is not None:
            return "text"
        raise DataUnavailableError(
            f"Shakespeare not found: looked for {self._tff_files()[0]} (TFF HDF5) and "
            f"{self.folder / 'leaf' / 'train'} (LEAF JSON) under data.root={self.root}; point data.root at a "
            "folder holding shakespeare/, or set data.text_file to plain play text."
        )

    def _download(self) -> None:
        missing = [p for p in self._tff_files() if not p.is_file()]
        if not missing or self.source not in ("auto", "tff"):
            return
        from torchvision.datasets.utils import download_and_extract_archive  # only needed online

        try:
            download_and_extract_archive(TFF_URL, download_root=str(self.folder), md5=None)
        except Exception as err:  # any network or IO failure means the same to the user
            raise DataUnavailableError(
                f"Shakespeare: could not download {TFF_URL} ({type(err).__name__}) to provide {missing[0]} "
                f"under data.root={self.root}; copy shakespeare_{{train,test}}.h5 there or use data.text_file."
            ) from err

    # -- loading ---------------------------------------------------------------------------

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        source = self._resolve_source()
        train_roles: Mapping[str, Sequence[bytes | str]]
        test_roles: Mapping[str, Sequence[bytes | str]]
        if source == "tff":
            train_roles, test_roles = self._read_tff()
        elif source == "text":
            train_roles, test_roles = self._read_text()
        else:
            return self._read_leaf()
        self.snippet_counts = {
            "train": sum(map(len, train_roles.values())),
            "test": sum(map(len, test_roles.values())),
        }
        self.client_names = [c for c, s in train_roles.items() if s]
        xs, ys, gs = [], [], []
        for g, client in enumerate(self.client_names):
            x, y = char_windows(
                self.vocab.role_sequence(train_roles[client]), seq_len=SEQ_LEN, stride=self.stride, pad=self.vocab.pad
            )
            xs.append(x)
            ys.append(y)
            gs.append(np.full(len(y), g, dtype=np.int64))
        tx, ty = [], []
        for speeches in test_roles.values():
            if speeches:
                x, y = char_windows(
                    self.vocab.role_sequence(speeches), seq_len=SEQ_LEN, stride=self.eval_stride, pad=self.vocab.pad
                )
                tx.append(x)
                ty.append(y)
        self._groups = np.concatenate(gs)
        log.info(
            "shakespeare (%s): %d roles, %d train / %d test speeches -> %d train / %d test windows",
            source,
            len(self.client_names),
            self.snippet_counts["train"],
            self.snippet_counts["test"],
            sum(map(len, ys)),
            sum(map(len, ty)),
        )
        return (
            (torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))),
            (torch.from_numpy(np.concatenate(tx)), torch.from_numpy(np.concatenate(ty))),
        )

    def _read_tff(self) -> tuple[dict[str, list[bytes]], dict[str, list[bytes]]]:
        import h5py

        roles: list[dict[str, list[bytes]]] = []
        for path in self._tff_files():
            if not path.is_file():
                raise DataUnavailableError(
                    f"Shakespeare file {path} not found under data.root={self.root}; point data.root at a folder "
                    "holding shakespeare/shakespeare_{train,test}.h5."
                )
            with h5py.File(path, "r") as f:
                examples = f["examples"]
                roles.append({c: list(examples[c]["snippets"][()]) for c in sorted(examples)})
        return roles[0], roles[1]

    def _read_text(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        if self.text_file is None or not self.text_file.is_file():
            raise DataUnavailableError(
                f"Shakespeare text file {self.text_file} not found; set data.text_file to a plain-text play file."
            )
        roles = parse_roles(self.text_file.read_text(encoding="utf-8", errors="replace"), play=self.text_file.stem)
        train, test = {}, {}
        for client, speeches in roles.items():
            cut = max(1, round(self.text_train_fraction * len(speeches)))
            train[client], test[client] = speeches[:cut], speeches[cut:]
        return train, test

    def _read_leaf(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        out: list[tuple[list[str], list[np.ndarray], list[np.ndarray]]] = []
        for split in ("train", "test"):
            folder = self.folder / "leaf" / split
            files = sorted(folder.glob("*.json")) if folder.is_dir() else []
            if not files:
                raise DataUnavailableError(
                    f"Shakespeare LEAF JSON not found: no {folder}/*.json under data.root={self.root}; run LEAF's "
                    "preprocessing and copy data/shakespeare/data/{train,test} there."
                )
            users: list[str] = []
            xs: list[np.ndarray] = []
            ys: list[np.ndarray] = []
            for path in files:
                raw = json.loads(path.read_text())
                for user in raw["users"]:
                    data = raw["user_data"][user]
                    users.append(user)
                    xs.append(self._encode_leaf_x(data["x"]))
                    ys.append(self.vocab.encode("".join(data["y"])).astype(np.int64))
            out.append((users, xs, ys))
        (train_users, xs, ys), (_, tx, ty) = out
        self.client_names = train_users
        self.snippet_counts = {"train": sum(map(len, ys)), "test": sum(map(len, ty))}
        self._groups = np.repeat(np.arange(len(ys)), [len(y) for y in ys])
        return (
            (torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))),
            (torch.from_numpy(np.concatenate(tx)), torch.from_numpy(np.concatenate(ty))),
        )

    def _encode_leaf_x(self, windows: Iterable[str]) -> np.ndarray:
        rows = list(windows)
        bad = [w for w in rows if len(w) != SEQ_LEN]
        if bad:
            raise ValueError(f"LEAF Shakespeare windows must be {SEQ_LEN} characters (found one of {len(bad[0])}).")
        return self.vocab.encode("".join(rows)).reshape(len(rows), SEQ_LEN)

    # -- hooks -----------------------------------------------------------------------------

    def natural_groups(self) -> np.ndarray | None:
        """Role index of every training window (``client_names`` gives the role names)."""
        return self._groups

    def transform(self, x: Tensor) -> Tensor:
        """``uint8`` character ids to the ``int64`` an embedding takes."""
        return x.long()
