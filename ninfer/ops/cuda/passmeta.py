"""The index tables a prefill pass's GDN layers share: built once per pass, not per layer.

For a ragged batch of R rows and T tokens (q_lens, ctx_lens on the host):

    tok_row       [T]       int64  the row of every flat token (the causal conv's prefill)
    has_state     [R]       int64  1 where the row continues a cached state, 0 if it is fresh
    cu_seqlens    [R+1]     int64  row starts (fla's varlen layout)
    chunk_offsets [R+1]     int64  first 64-token chunk of each row (fla's chunk states h)
    chunk_indices [NC, 2]   int64  (row, chunk within the row) of every chunk

All five live in ONE device buffer, filled from ONE pinned host buffer by one non-blocking
copy. Each table starts 16-byte aligned (its length rounded up to an even count): Triton
specializes a kernel on the alignment of its pointer arguments, so views at odd offsets would
make new kernel variants (a JIT compile each, fla's included) whenever the parity of T or R
changes: seconds of stall in the middle of serving.

A pass with in-pass state taps (`forward.StateTap`, eager passes only) also gets a `TapIndex`
(one more small copy): per tap, the flat index of its row's first token after it, the fla chunk
holding the tap (the chunk grid starts at each row's first token), and the slot it writes. A
tap on the grid (offset a multiple of CHUNK) is that chunk's start state; one off the grid
(`TapIndex.rest`) is the start state of the chunk it lies in, advanced over the tap's first
offset % CHUNK tokens of that chunk (`gdn.gdn_prefill`); in the row's first chunk, the row's
initial state in fp32 (a verify row's taps at offsets 1 .. k, every step):

    row     |-- chunk --|-- chunk --|-- chunk --|
    tap                             |- r ->|        offset = 2 * CHUNK + r
    state   h[chunk 2] advanced over the r tokens before the tap

A tap within K-1 tokens of its row's start takes part of its conv state from the row's
initial conv state (`TapIndex.near`, `conv.tap_init`).

The eager path builds a fresh buffer per pass (`PassMeta.of`); the prefill-graph runner keeps
one static buffer per captured shape and refills it before each replay (`layout`, `tables`,
`PassMeta.view`), so that the captured kernels read the new tables.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

CHUNK = 64  # fla's chunk size for the gated delta rule
SHORT_PASS = 512  # tokens: `tables` builds shorter passes' tables from lists


def num_chunks(q_lens: list[int]) -> int:
    return sum(-(-n // CHUNK) for n in q_lens)


def even(n: int) -> int:
    """n rounded up to an even count: int64 segments of that length keep 16-byte alignment."""
    return n + (n & 1)


def tables(q_lens: list[int], ctx_lens: list[int]) -> torch.Tensor:
    """The five tables of the module docstring, in that order, each padded to `even`: one
    int64 host tensor. Long passes build it by vectorised ops (Python lists of a long prompt
    cost host time on the path before its first GDN layer can launch), short ones (up to
    SHORT_PASS tokens) from lists, where a dozen small torch ops cost more than the lists."""
    if sum(q_lens) <= SHORT_PASS:
        return torch.tensor(_table_lists(q_lens, ctx_lens), dtype=torch.int64)
    q = torch.tensor(q_lens, dtype=torch.int64)
    n_rows, n_tok = len(q_lens), int(q.sum())
    chunks = (q + CHUNK - 1) // CHUNK
    n_chunks = int(chunks.sum())
    rows = torch.arange(n_rows)
    lengths = layout(n_tok, n_rows, n_chunks)
    out = torch.zeros(sum(lengths), dtype=torch.int64)
    tok_row, has_state, cu, offsets, indices = (
        seg[:n] for seg, n in zip(out.split(lengths), sizes(n_tok, n_rows, n_chunks), strict=True)
    )
    tok_row.copy_(torch.repeat_interleave(rows, q, output_size=n_tok))
    has_state.copy_(torch.tensor([c > 0 for c in ctx_lens], dtype=torch.int64))
    torch.cumsum(q, 0, out=cu[1:])
    torch.cumsum(chunks, 0, out=offsets[1:])
    chunk_row = torch.repeat_interleave(rows, chunks, output_size=n_chunks)
    pairs = indices.view(n_chunks, 2)
    pairs[:, 0] = chunk_row
    pairs[:, 1] = torch.arange(n_chunks) - offsets[:-1][chunk_row]
    return out


def _table_lists(q_lens: list[int], ctx_lens: list[int]) -> list[int]:
    tok_row = [r for r, n in enumerate(q_lens) for _ in range(n)]
    has_state = [int(c > 0) for c in ctx_lens]
    cu = [0, *itertools.accumulate(q_lens)]
    chunks = [-(-n // CHUNK) for n in q_lens]
    offsets = [0, *itertools.accumulate(chunks)]
    indices = [v for r, m in enumerate(chunks) for j in range(m) for v in (r, j)]
    out: list[int] = []
    for part in (tok_row, has_state, cu, offsets, indices):
        out += part + [0] * (len(part) & 1)
    return out


def sizes(n_tok: int, n_rows: int, n_chunks: int) -> list[int]:
    """Lengths of the five tables."""
    return [n_tok, n_rows, n_rows + 1, n_rows + 1, 2 * n_chunks]


def layout(n_tok: int, n_rows: int, n_chunks: int) -> list[int]:
    """Their lengths in the flat buffer (each padded to `even`)."""
    return [even(n) for n in sizes(n_tok, n_rows, n_chunks)]


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


@dataclass(frozen=True, slots=True)
class TapRest:
    """The taps of a pass off the chunk grid, on the device (int64): for tap j, the flat
    indices of the tokens between its chunk's start and the tap are tokens[cu[j]:cu[j+1]]; it
    starts from fla's chunk state h[chunk[j]] and writes slot[j]. The taps `opening` (indices
    into these) lie in their row's first chunk: they start from the row's initial state
    instead, as the pass gathered it in fp32 (h holds it rounded to k's dtype), row
    `opening_row`."""

    tokens: torch.Tensor  # [m]
    cu: torch.Tensor  # [n + 1]
    chunk: torch.Tensor  # [n]
    slot: torch.Tensor  # [n]
    opening: torch.Tensor | None = None  # [j]
    opening_row: torch.Tensor | None = None  # [j]


@dataclass(frozen=True, slots=True)
class TapNear:
    """The taps of a pass within CHUNK tokens of their row's start, on the device (int64):
    index into the pass's taps, row, offset. The causal conv's state at such a tap reaches back
    into the row's initial conv state when the offset is below the conv's K-1 (`conv.tap_init`,
    `conv.write_taps`)."""

    index: torch.Tensor  # [j]
    row: torch.Tensor  # [j]
    offset: torch.Tensor  # [j]


@dataclass(frozen=True, slots=True)
class TapIndex:
    """A pass's state taps on the device, [n] int64 each (module docstring)."""

    cut: torch.Tensor  # flat index of the row's first token after the tap
    chunk: torch.Tensor  # index into fla's chunk states h: the chunk holding the tap
    slot: torch.Tensor  # the state slot the tap writes
    rest: TapRest | None = None  # the taps off the chunk grid (their state is advanced)
    near: TapNear | None = None  # the taps in their row's first chunk
    # derived indices, the same for every layer of the pass, made at first use (by key:
    # `conv.write_taps`'s column sources)
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, taps: Sequence, q_lens: list[int], device: torch.device) -> TapIndex | None:
        """The index of `taps` (`forward.StateTap`s, any offset inside its row) of a pass with
        rows of `q_lens` tokens; None without taps."""
        if not taps:
            return None
        starts = [0, *itertools.accumulate(q_lens)]
        first = [0, *itertools.accumulate(-(-n // CHUNK) for n in q_lens)]
        cols, rest, tokens, cu, opening, near = [], [], [], [0], [], []
        for i, t in enumerate(taps):
            if not 0 < t.offset < q_lens[t.row]:
                raise ValueError(f"state tap {t}: offset not inside its row")
            chunk = first[t.row] + t.offset // CHUNK
            cols.append((starts[t.row] + t.offset, chunk, t.slot))
            r = t.offset % CHUNK
            if r:
                base = starts[t.row] + t.offset - r
                tokens.extend(range(base, base + r))
                cu.append(len(tokens))
                if t.offset < CHUNK:
                    opening.append((len(rest), t.row))
                rest.append((chunk, t.slot))
            if t.offset < CHUNK:
                near.append((i, t.row, t.offset))
        flat = _to_device(torch.tensor(cols, dtype=torch.int64).t().contiguous(), device)
        return cls(
            flat[0], flat[1], flat[2], _rest(rest, tokens, cu, opening, device),
            _near(near, device),
        )  # fmt: skip


def _rest(
    rest: list[tuple[int, int]],
    tokens: list[int],
    cu: list[int],
    opening: list[tuple[int, int]],
    device: torch.device,
) -> TapRest | None:
    """The `TapRest` of the off-grid taps ((chunk, slot) each; tap j's tokens are
    tokens[cu[j]:cu[j+1]]; `opening`: (j, row) of those in their row's first chunk), in one
    copy. `cu`, which the recurrent kernel reads, comes first: Triton specialises on a
    pointer's 16-byte alignment, and a view at an odd offset would compile another variant in
    the middle of serving."""
    if not rest:
        return None
    n, m, j = len(rest), len(tokens), len(opening)
    host = torch.tensor([
        *cu, *(c for c, _ in rest), *(s for _, s in rest), *tokens,
        *(i for i, _ in opening), *(r for _, r in opening),
    ])  # fmt: skip
    parts = _to_device(host.to(torch.int64), device).split([n + 1, n, n, m, j, j])
    cu_t, chunk, slot, idx, at, rows = parts
    return TapRest(idx, cu_t, chunk, slot, at if j else None, rows if j else None)


def _near(near: list[tuple[int, int, int]], device: torch.device) -> TapNear | None:
    if not near:
        return None
    flat = _to_device(torch.tensor(near, dtype=torch.int64).t().contiguous(), device)
    return TapNear(flat[0], flat[1], flat[2])


@dataclass(frozen=True, slots=True)
class PassMeta:
    tok_row: torch.Tensor
    has_state: torch.Tensor
    cu_seqlens: torch.Tensor
    chunk_offsets: torch.Tensor
    chunk_indices: torch.Tensor
    taps: TapIndex | None = None  # the pass's state taps (eager passes only)
    # [T] int64: the slot that takes the state after each token, or -1; set, the GDN layers
    # run the rows token by token (`gdn.gdn_rows`: the speculative verify graphs' short rows)
    tap_tok: torch.Tensor | None = None

    @classmethod
    def view(cls, flat: torch.Tensor, n_tok: int, n_rows: int, n_chunks: int) -> PassMeta:
        """The tables as views of `flat` (int64, laid out by `layout`)."""
        parts = flat.split(layout(n_tok, n_rows, n_chunks))
        parts = [p[:n] for p, n in zip(parts, sizes(n_tok, n_rows, n_chunks), strict=True)]
        return cls(*parts[:4], parts[4].view(n_chunks, 2))

    @classmethod
    def of(
        cls, q_lens: list[int], ctx_lens: list[int], device: torch.device, taps: Sequence = ()
    ) -> PassMeta:
        """A new device buffer holding the tables of this batch (one non-blocking copy), and
        the `TapIndex` of its state `taps` (one more)."""
        flat = _to_device(tables(q_lens, ctx_lens), device)
        meta = cls.view(flat, sum(q_lens), len(q_lens), num_chunks(q_lens))
        return replace(meta, taps=TapIndex.of(taps, q_lens, device))
