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

A snapshot inside the pass (`gdn_split`, the prompt-tail tap of a long final chunk without a
second pass): the GDN layers run the last row in two parts and copy its conv and recurrent state
between them into a snapshot slot; attention, the dense parts and the pages see the whole pass.

    flat tokens  |<- rows 0 .. R-2 ->|<- last row: head ->|<- tail ->|
                                                          cut
    GDN layer    conv_gated_delta(head batch) ; state[dst] = state[src] ; (tail batch)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
    gdn_split: GdnSplit | None = None  # see the module docstring

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


@dataclass(frozen=True, slots=True)
class GdnSplit:
    """The two GDN sub-batches of a pass that snapshots its last row's state at `cut`."""

    cut: int  # flat index of the last row's first token after the snapshot
    head: ForwardBatch  # every row, the last one ending at `cut`
    tail: ForwardBatch  # the last row from `cut` on, continuing from its slot
    src: int  # the last row's state slot
    dst: int  # the snapshot slot that receives the state at `cut`


def split_last_row(batch: ForwardBatch, offset: int, src: int, dst: int) -> GdnSplit:
    """The `GdnSplit` snapshotting the last row's state after its first `offset` tokens into
    slot `dst` (`src` = that row's slot). Device tensors of the sub-batches are views of the
    batch's or made by fills on the device (no host sync); only the GDN fields are meaningful
    (the sub-batches sample nothing and are never given to attention)."""
    q_last, ctx_last = batch.q_lens[-1], batch.ctx_lens[-1]
    if not 0 < offset < q_last:
        raise ValueError(f"gdn_split: offset {offset} not inside the last row ({q_last} tokens)")
    if src == dst:
        raise ValueError(f"gdn_split: the snapshot slot {dst} is the row's own slot")
    cut = batch.num_tokens - q_last + offset
    head_cu = batch.cu_q.clone()
    head_cu[-1] = cut
    tail_cu = batch.cu_q.new_zeros(2)
    tail_cu[1] = q_last - offset
    none = batch.logits_indices[:0]
    head = ForwardBatch(
        input_ids=batch.input_ids[:cut],
        positions=batch.positions[:cut],
        q_lens=[*batch.q_lens[:-1], offset],
        ctx_lens=list(batch.ctx_lens),
        cu_q=head_cu,
        state_slots=batch.state_slots,
        block_table=batch.block_table,
        slot_mapping=batch.slot_mapping[:cut],
        logits_indices=none,
    )
    tail = ForwardBatch(
        input_ids=batch.input_ids[cut:],
        positions=batch.positions[cut:],
        q_lens=[q_last - offset],
        ctx_lens=[ctx_last + offset],
        cu_q=tail_cu,
        state_slots=batch.state_slots[-1:],
        block_table=batch.block_table[-1:],
        slot_mapping=batch.slot_mapping[cut:],
        logits_indices=none,
    )
    return GdnSplit(cut, head, tail, src, dst)


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
