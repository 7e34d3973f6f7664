"""The data that crosses the model / ops seam: forward metadata, the state a pass reads and
writes, and the head dims the kernels specialise on.

Below both `ninfer.models` and `ninfer.ops` (and imported by the engine and `ninfer.memory`
alike): it imports neither, only torch. The model knows nothing about requests, the scheduler
or the prefix cache: it receives a ragged batch (`ForwardBatch`) and the tensors of the
engine's memory layout (`ModelCache`), and returns logits. Every field is passed explicitly;
there are no globals.

Ragged batch layout (R rows, T tokens; rows are prefill chunks or single-token decode rows):

    flat token axis  |<- row 0: q_lens[0] ->|<- row 1 ->|...|<- row R-1 ->|
    cu_q             0                      q0          q0+q1 ...          T
    row r covers absolute positions [ctx_lens[r], ctx_lens[r] + q_lens[r])

    pages of row r   block_table[r, 0 .. ceil((ctx_lens[r] + q_lens[r]) / 64))
    token at absolute position p of row r is written to page block_table[r, p // 64], offset p % 64
    (slot_mapping holds that as page * 64 + offset for every flat token)

A row with ctx_lens[r] == 0 starts from a zero recurrent and conv state, whatever its state slot
holds; a row with ctx_lens[r] > 0 continues from the state in its slot (the engine resumed or
restored it there). After the pass each row's slot holds the state after its last token.

Snapshots inside the pass (`state_taps`): each `StateTap` asks the GDN layers to write a row's
conv and recurrent state after its first `offset` tokens into another slot, without splitting
the row; attention, the dense parts and the pages never see them. Several taps per row, in
several rows, may share a pass. The ops honour them (`ninfer.ops.base.Ops.causal_conv`, `gdn`);
an op set serves offsets of at least its `tap_stride`.

    row r        |<------------------ q_lens[r] tokens ------------------>|
    taps         |---- offset a ---->|              |
                 |---------- offset b ------------->|
    slot a holds the state after tokens [0, a) of the row, slot b after [0, b)

Images (`mrope_positions`, `embeds`): Qwen3.5 rotates each token at three positions (t, h, w;
interleaved mRoPE, `ninfer.vision.positions`). Text tokens have t = h = w, and so do all
tokens after an image's last one (at their index plus the request's rope delta), so only a
pass holding image tokens needs the 3-D positions; RoPE then ignores `positions`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, absolute positions
    q_lens: list[int]  # host, [R]: new tokens per row
    ctx_lens: list[int]  # host, [R]: tokens already cached for the row before this pass
    cu_q: torch.Tensor  # [R+1] int32 on the model's device
    state_slots: torch.Tensor  # [R] int64: each row's slot in the state pool
    block_table: torch.Tensor  # [R, max_pages] int32 page ids (unused tail entries arbitrary)
    slot_mapping: torch.Tensor  # [T] int64: page * 64 + offset where each token's K/V goes
    logits_indices: torch.Tensor  # [N] int64: flat token indices whose logits are returned
    # Called with the layer index just before that layer runs (Host restores overlapped with
    # the first prefill pass wait there on the layer's copy event). None: nothing to wait for.
    before_layer: Callable[[int], None] | None = None
    state_taps: tuple[StateTap, ...] = ()  # see the module docstring
    # A pass over image tokens (see the module docstring): the [3, T] int64 (t, h, w) rotary
    # positions of every token, and the rows whose input embedding is an image's. None: text
    # only, every token rotated at `positions` (t = h = w).
    mrope_positions: torch.Tensor | None = None
    embeds: Embeds | None = None

    @property
    def num_rows(self) -> int:
        return len(self.q_lens)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.q_lens))

    @property
    def is_decode(self) -> bool:
        """True when every row is a one-token row continuing a cached context."""
        return all(q == 1 for q in self.q_lens) and all(c > 0 for c in self.ctx_lens)


class Embeds(NamedTuple):
    """Input embeddings that replace the token embeddings of some rows of a pass (a vision
    tower's output at its image pad tokens)."""

    rows: torch.Tensor  # [N] int64 flat token indices
    values: torch.Tensor  # [N, hidden]


class StateTap(NamedTuple):
    """Write row `row`'s GDN state after its first `offset` tokens into state slot `slot`."""

    row: int
    offset: int
    slot: int


def check_state_taps(taps: Sequence[StateTap], q_lens: list[int], slots: list[int]) -> None:
    """Raises ValueError unless every tap lies strictly inside its row, writes a slot no row of
    the pass owns, and no two taps write one slot."""
    for t in taps:
        if not 0 <= t.row < len(q_lens) or not 0 < t.offset < q_lens[t.row]:
            raise ValueError(f"state tap {t}: offset not inside its row")
        if t.slot in slots:
            raise ValueError(f"state tap {t}: slot {t.slot} is a row's own slot")
    if len({t.slot for t in taps}) != len(taps):
        raise ValueError("state taps: two taps write one slot")


def row_taps(taps: Sequence[StateTap], row: int) -> list[tuple[int, int]]:
    """(offset, slot) of the taps of `row`, by offset."""
    return sorted((t.offset, t.slot) for t in taps if t.row == row)


@dataclass(slots=True)
class ModelCache:
    """The engine-owned tensors a forward pass reads and writes.

    kv:   one tensor per full-attention layer, FlashInfer NHD: [pages, 2, 64, Hkv, head_dim]
          (dim 1: 0 = K, 1 = V); dtype = kv dtype. Page ids are shared by all layers.
    conv: [slots, n_gdn_layers, conv_dim, K - 1] in the model dtype: the last K-1 pre-conv
          inputs (channel order q | k | v) of every GDN layer, slot-major so that one slot's
          image is contiguous.
    ssm:  [slots, n_gdn_layers, Hv, dk, dv] float32 recurrent state, slot-major.
    k_scale / v_scale: per full-attention layer dequantisation scales (fp8 KV), else None.
    """

    kv: list[torch.Tensor]
    conv: torch.Tensor
    ssm: torch.Tensor
    k_scale: list[float] | None = None
    v_scale: list[float] | None = None


@dataclass(frozen=True, slots=True)
class HeadDims:
    """The per-head dims of a model's two mixers, which decide the kernels that can serve it
    (`ninfer.ops.cuda.support.plan_ops`): full attention's head_dim and rotary_dim, the GDN
    layers' key and value head dims (dk, dv)."""

    head_dim: int
    rotary_dim: int
    gdn_key_dim: int
    gdn_value_dim: int
