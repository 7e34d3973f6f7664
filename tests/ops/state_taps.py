"""Helpers of the state-tap tests (`forward.StateTap`): one GDN layer's mixer run once over
rows with taps inside them, and the oracle, the same rows run as separate passes split at every
tap (the state a pass ending at a tap leaves).

`tapped` / `split` run `Ops.conv_gated_delta` (the model's call); `split_exact` runs the
oracle's passes on the very tensors the tapped pass's recurrence reads (the conv output and the
gates of the whole pass, sliced), so that the reference can be held to bit equality: a part's
elementwise ops on a tensor of another length may round differently."""

from __future__ import annotations

import torch

from ninfer.forward import StateTap
from ninfer.ops.reference import split_qkv
from tests.models.util import Row, make_batch

WIDTH = 4
SMALL = (2, 4, 32, 32)  # Hk, Hv, dk, dv


class Layer:
    """Random inputs of one GDN layer (head dims `dims`) over the rows (ctx_len, q_len) and
    its state pools: a slot per row (0 .. R-1), then one per tap, then one the oracle runs in."""

    def __init__(self, rows, n_taps, seed, device="cpu", dtype=torch.float32, dims=SMALL):
        g = torch.Generator().manual_seed(seed)
        t = sum(q for _, q in rows)
        hk, hv, dk, dv = dims
        channels = 2 * hk * dk + hv * dv
        self.scale = dk**-0.5

        def rand(*shape):
            return torch.randn(*shape, generator=g).to(device, dtype)

        self.rows, self.device = rows, device
        self.x, self.a, self.b = rand(t, channels), rand(t, hv), rand(t, hv)
        self.weight = rand(channels, WIDTH) * 0.5
        self.a_log, self.dt_bias = rand(hv) * 0.1, rand(hv) * 0.1
        slots = len(rows) + n_taps + 1
        self.conv = rand(slots, channels, WIDTH - 1)
        self.ssm = (torch.randn(slots, hv, dk, dv, generator=g) * 0.1).to(device)

    def pools(self):
        return self.conv.clone(), self.ssm.clone()

    def batch(self, rows, slots, taps=()):
        pages = [[0] * (-(-(c + q) // 64)) for c, q in rows]
        parts = zip(rows, slots, pages, strict=True)
        batch = make_batch([Row([1] * q, c, s, p) for (c, q), s, p in parts], device=self.device)
        batch.state_taps = tuple(taps)
        return batch

    def run(self, ops, rows, slots, x, a, b, conv, ssm, taps=()):
        batch = self.batch(rows, slots, taps)
        return ops.conv_gated_delta(
            x, self.weight, conv, a, b, self.a_log, self.dt_bias, ssm, batch, self.scale
        )

    def tapped(self, ops, taps: list[StateTap]):
        """One pass over every row with `taps`: (output, conv pool, ssm pool)."""
        conv, ssm = self.pools()
        slots = list(range(len(self.rows)))
        out = self.run(ops, self.rows, slots, self.x, self.a, self.b, conv, ssm, taps)
        return out, conv, ssm

    def tapped_exact(self, ops, taps: list[StateTap]):
        """`tapped` as the reference composes it: (y, gates), then (output, conv, ssm)."""
        conv, ssm = self.pools()
        batch = self.batch(self.rows, list(range(len(self.rows))), taps)
        y = ops.causal_conv(self.x, self.weight, conv, batch)
        g, beta = ops.gdn_gates(self.a, self.b, self.a_log, self.dt_bias)
        out = ops.gdn(*split_qkv(y, ssm), g, beta, ssm, batch, self.scale)
        return (y, g, beta), (out, conv, ssm)

    def split_exact(self, ops, taps: list[StateTap], y, g, beta):
        """`split` on the tapped pass's conv output y and gates g, beta (module docstring):
        the conv passes give only the conv states."""
        conv, ssm = self.pools()
        q, k, v = split_qkv(y, ssm)
        scratch = conv.shape[0] - 1
        outs, start = [], 0
        for r, (ctx, n) in enumerate(self.rows):
            conv[scratch], ssm[scratch] = conv[r], ssm[r]
            cuts = sorted((t.offset, t.slot) for t in taps if t.row == r)
            bounds = [0, *(o for o, _ in cuts), n]
            for i in range(len(bounds) - 1):
                sl = slice(start + bounds[i], start + bounds[i + 1])
                batch = self.batch([(ctx + bounds[i], bounds[i + 1] - bounds[i])], [scratch])
                ops.causal_conv(self.x[sl], self.weight, conv, batch)
                part = (q[sl], k[sl], v[sl], g[sl], beta[sl])
                outs.append(ops.gdn(*part, ssm, batch, self.scale))
                if i < len(cuts):
                    conv[cuts[i][1]], ssm[cuts[i][1]] = conv[scratch], ssm[scratch]
            conv[r], ssm[r] = conv[scratch], ssm[scratch]
            start += n
        return torch.cat(outs), conv[:scratch], ssm[:scratch]

    def split(self, ops, taps: list[StateTap]):
        """Each row alone, as successive passes cut at its taps, in the oracle's slot: (output,
        conv pool, ssm pool) with each tap's slot and each row's slot holding what those passes
        left there."""
        conv, ssm = self.pools()
        scratch = conv.shape[0] - 1
        outs, start = [], 0
        for r, (ctx, q) in enumerate(self.rows):
            conv[scratch], ssm[scratch] = conv[r], ssm[r]
            cuts = sorted((t.offset, t.slot) for t in taps if t.row == r)
            bounds = [0, *(o for o, _ in cuts), q]
            for i in range(len(bounds) - 1):
                sl = slice(start + bounds[i], start + bounds[i + 1])
                part = [(ctx + bounds[i], bounds[i + 1] - bounds[i])]
                outs.append(
                    self.run(ops, part, [scratch], self.x[sl], self.a[sl], self.b[sl], conv, ssm)
                )
                if i < len(cuts):
                    conv[cuts[i][1]], ssm[cuts[i][1]] = conv[scratch], ssm[scratch]
            conv[r], ssm[r] = conv[scratch], ssm[scratch]
            start += q
        return torch.cat(outs), conv[:scratch], ssm[:scratch]
