"""Next-token sampling for a batch of rows, each with its own SamplingParams.

Speculative decoding's acceptance rule (`accept_drafts`) lives here too: it draws from the
same distributions `sample` does.

Order of operations (as vLLM's V1 sampler): temperature, min-p, top-k, top-p, then one draw
per row. Greedy rows (temperature 0) take the argmax of the raw logits, exactly. A draw is the
exponential race argmax(p / E), E ~ Exp(1): one `exponential_` over all unseeded rows from the
global RNG, and one per seeded row from its own torch.Generator, so a seeded row's tokens do not
depend on its batch neighbours. Everything stays on the logits' device and nothing waits for it:
the logprobs a request asked for are copied to the host when `SampleResult.logprobs` is first
read. This module knows nothing about requests or the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.request import SamplingParams


@dataclass(slots=True)
class _LogprobTensors:
    """Device tensors of the rows' logprobs, turned into dicts on the host when read."""

    wanted: list[int | None]  # per row: top-k asked for, or None
    top_lp: torch.Tensor  # [R, k_max]
    top_ids: torch.Tensor  # [R, k_max]
    chosen_lp: torch.Tensor  # [R]
    chosen: torch.Tensor  # [R]

    def host(self) -> list[dict[int, float] | None]:
        top_lp, top_ids, chosen_lp, chosen = (
            t.tolist() for t in (self.top_lp, self.top_ids, self.chosen_lp, self.chosen)
        )
        out: list[dict[int, float] | None] = []
        for r, k in enumerate(self.wanted):
            if k is None:
                out.append(None)
                continue
            row = dict(zip(top_ids[r][:k], top_lp[r][:k], strict=True))
            row[chosen[r]] = chosen_lp[r]
            out.append(row)
        return out


class SampleResult:
    """token_ids [R] int64 on the logits' device; `logprobs`: per row {token: logprob} (top-k +
    chosen) or None, copied to the host (a sync) when first read."""

    __slots__ = ("token_ids", "_pending", "_logprobs")

    def __init__(self, token_ids: torch.Tensor, pending: _LogprobTensors | None, n: int) -> None:
        self.token_ids = token_ids
        self._pending = pending
        self._logprobs: list[dict[int, float] | None] | None = None if pending else [None] * n

    @property
    def logprobs(self) -> list[dict[int, float] | None]:
        if self._logprobs is None:
            self._logprobs = self._pending.host()
            self._pending = None
        return self._logprobs


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """The per-request generator for `SamplingParams.seed` (None: use the global RNG)."""
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def _row_tensor(values: list[float], logits: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=logits.dtype, device=logits.device).unsqueeze(1)


def _filter_mask(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor | None:
    """Boolean [R, V] mask of the tokens the min-p / top-k / top-p filters remove (None: none).

    `logits` are already divided by the temperature.
    """
    vocab = logits.shape[1]
    remove: torch.Tensor | None = None
    if any(p.min_p > 0.0 for p in params):
        probs = logits.softmax(dim=-1)
        floor = _row_tensor([p.min_p for p in params], logits) * probs.amax(dim=-1, keepdim=True)
        remove = probs < floor
        logits = logits.masked_fill(remove, float("-inf"))
    use_k = any(0 < p.top_k < vocab for p in params)
    use_p = any(p.top_p < 1.0 for p in params)
    if not (use_k or use_p):
        return remove
    # Stable, so that equal logits keep index order and top_k=1 picks what argmax picks.
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    sorted_remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if use_k:
        k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        sorted_remove |= ranks >= torch.tensor(k, device=logits.device).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(sorted_remove, float("-inf"))
    if use_p:
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the better-ranked tokens
        # 2.0 for rows without top-p: rounding must not cut their tail.
        top_p = [p.top_p if p.top_p < 1.0 else 2.0 for p in params]
        sorted_remove |= before > _row_tensor(top_p, logits)
    top_remove = torch.empty_like(sorted_remove).scatter_(1, order, sorted_remove)
    return top_remove if remove is None else remove | top_remove


def draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row: argmax(p / E) with E ~ Exp(1) is a draw from p."""
    noise = torch.empty_like(probs)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if len(unseeded) == len(generators):
        noise.exponential_()
    else:
        if unseeded:
            idx = torch.tensor(unseeded, device=probs.device)
            noise[idx] = torch.empty_like(noise[idx]).exponential_()
        for i, gen in enumerate(generators):
            if gen is not None:
                noise[i].exponential_(generator=gen)
    # A zero draw would make 0/0 = nan for a filtered-out token.
    return (probs / noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(dim=-1)


def _logprobs(
    logits: torch.Tensor, chosen: torch.Tensor, params: list[SamplingParams]
) -> _LogprobTensors | None:
    """Top-k log-probabilities of the raw logits plus the chosen token's, for the rows that ask
    (device tensors; None when no row asks)."""
    wanted = [p.logprobs for p in params]
    if all(k is None for k in wanted):
        return None
    logp = logits.float().log_softmax(dim=-1)
    k_max = min(max(k or 0 for k in wanted), logits.shape[1])
    top_lp, top_ids = logp.topk(k_max, dim=-1)
    chosen_lp = logp.gather(1, chosen.unsqueeze(1)).squeeze(1)
    return _LogprobTensors(wanted, top_lp, top_ids, chosen_lp, chosen)


def token_logprobs(
    logits: torch.Tensor, tokens: list[int], params: SamplingParams
) -> list[dict[int, float]]:
    """What `SampleResult.logprobs` gives a sampled row, for each of `tokens` in turn from
    the rows of `logits` [>= len(tokens), V] (a verify row's accepted tokens: token j from
    row j). Reads them to the host."""
    n = len(tokens)
    chosen = torch.tensor(tokens, dtype=torch.int64).to(logits.device)
    return _logprobs(logits[:n], chosen, [params] * n).host()


def apply_token_mask(logits: torch.Tensor, rows: list[int], bits: torch.Tensor) -> None:
    """In place: -inf on the tokens row `rows[i]` of `logits` [R, V] may not sample, bit t % 32
    of `bits[i, t // 32]` (int32, on the host) clear. A structured output's grammar: applied
    before the temperature and the filters, and seen by the logprobs."""
    vocab = logits.shape[1]
    dev = logits.device
    words = bits.to(dev, non_blocking=True)
    shifts = torch.arange(32, dtype=torch.int32, device=dev)
    allowed = ((words.unsqueeze(-1) >> shifts) & 1).view(len(rows), -1)[:, :vocab].bool()
    if allowed.shape[1] < vocab:  # a mask narrower than the logits: the rest is forbidden
        pad = torch.zeros(len(rows), vocab - allowed.shape[1], dtype=torch.bool, device=dev)
        allowed = torch.cat([allowed, pad], dim=1)
    if rows == list(range(logits.shape[0])):
        logits.masked_fill_(~allowed, float("-inf"))
        return
    index = torch.tensor(rows, dtype=torch.int64).to(dev, non_blocking=True)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> SampleResult:
    """Pick one token per row of `logits` [R, V] (fp32) under that row's params.

    `generators[r]` comes from `make_generator(params[r].seed, device)` and is advanced in place.
    """
    if logits.dim() != 2 or logits.shape[0] != len(params) or len(generators) != len(params):
        raise ValueError(
            f"sample: logits {tuple(logits.shape)} for {len(params)} params, "
            f"{len(generators)} generators"
        )
    sampled_rows = [not p.greedy for p in params]
    if not any(sampled_rows):
        chosen = logits.argmax(dim=-1)
    else:
        temps = _row_tensor([p.temperature if not p.greedy else 1.0 for p in params], logits)
        scaled = logits / temps
        remove = _filter_mask(scaled, params)
        if remove is not None:
            scaled = scaled.masked_fill(remove, float("-inf"))
        drawn = draw(scaled.softmax(dim=-1), generators)
        if all(sampled_rows):
            chosen = drawn
        else:
            mask = torch.tensor(sampled_rows, device=logits.device)
            chosen = torch.where(mask, drawn, logits.argmax(dim=-1))
    return SampleResult(chosen, _logprobs(logits, chosen, params), len(params))


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[R, V] fp32: the distribution `sample` draws from for each row of `logits` under one
    request's `params` (temperature, then the filters). Not for greedy params."""
    scaled = logits.float() / params.temperature
    remove = _filter_mask(scaled, [params] * logits.shape[0])
    if remove is not None:
        scaled = scaled.masked_fill(remove, float("-inf"))
    return scaled.softmax(dim=-1)


def accept_greedy(target: list[int], drafts: list[int]) -> list[int]:
    """`accept_drafts` for greedy params from the target's argmax at the row's k + 1 positions
    (read once for all of a step's greedy rows): the drafts while they equal it, then the
    argmax where they stop (or after the last)."""
    out = []
    for j, d in enumerate(drafts):
        out.append(target[j])
        if d != target[j]:
            return out
    return out + [target[len(drafts)]]


def greedy_outcome(
    top: torch.Tensor, drafts: torch.Tensor, m: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """On the device, what greedy verify rows yield: `top` [rows, K + 1] the target's argmax
    at each position, `drafts` [rows, K] the drafts verified, `m` [rows] the drafts each
    accepts (None: the longest prefix `top` agrees with, as `accept_greedy`).
    Returns (m, the target's token after them [rows])."""
    if m is None:
        m = (top[:, :-1] == drafts).long().cumprod(dim=1).sum(dim=1)
    return m, top.gather(1, m[:, None])[:, 0]


def accept_on_device(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`accept_drafts` without a host sync: (m, token) as 0-dim int64 tensors on the logits'
    device, the row yielding drafts[:m] + [token]. `drafts` [k] int64 on that device. The same
    rule, the same draws from `generator` in the same order (u [k], then one draw over the
    vocabulary) and the same comparisons (in float64, as the host makes them), so for the same
    generator state it yields exactly the tokens `accept_drafts` does."""
    k = drafts.shape[0]
    if params.greedy:
        m, after = greedy_outcome(logits.argmax(dim=-1)[None], drafts[None])
        return m[0], after[0]
    p = probabilities(logits, params)
    u = torch.rand(k, generator=generator, device=generator.device if generator else p.device)
    cols = torch.arange(k, device=p.device)
    p_d, q_d = p[cols, drafts].double(), draft_probs[cols, drafts].double()
    ok = (q_d > 0) & (u.double() * q_d < p_d)
    m = ok.long().cumprod(dim=0).sum()
    p_m = p.index_select(0, m.view(1))
    q = torch.cat([draft_probs[:k].float(), p.new_zeros(1, p.shape[1])])  # row k: after them
    residual = (p_m - q.index_select(0, m.view(1))).clamp_min_(0)
    total = residual.sum()
    # at a rejection: norm(max(p - q, 0)), or norm(p) where that is empty; after k
    # acceptances: p as is
    fallback = p_m / p_m.sum()
    probs = torch.where(m == k, p_m, torch.where(total > 0, residual / total, fallback))
    return m, draw(probs, [generator])[0]


def accept_drafts(
    logits: torch.Tensor,
    drafts: list[int],
    draft_probs: torch.Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> list[int]:
    """The tokens one speculative verify row yields: 1 .. k + 1 of them.

    `logits` [k + 1, V]: the target's at the row's positions (row j follows draft j);
    `drafts`: the k draft tokens; `draft_probs` [k, V]: the distributions they were drawn from
    (None for greedy params). Greedy: the drafts while they equal the target's argmax, then the
    argmax where they stop (or after the last). Sampled: the standard rejection rule, so the
    tokens follow the target's distribution whatever the drafts: draft j is kept with
    probability min(1, p_j(d) / q_j(d)); at the first rejection a token is drawn from
    norm(max(p_j - q_j, 0)), and after k acceptances one from p_k. Every draw uses `generator`
    (None: the global RNG), so a seeded request is reproducible."""
    k = len(drafts)
    if logits.shape[0] != k + 1:
        raise ValueError(f"accept_drafts: {logits.shape[0]} logits rows for {k} drafts")
    if params.greedy:
        return accept_greedy(logits.argmax(dim=-1).tolist(), drafts)
    p = probabilities(logits, params)
    u = torch.rand(k, generator=generator, device=generator.device if generator else p.device)
    p_d = p[torch.arange(k), drafts].tolist() if k else []
    q_d = draft_probs[torch.arange(k), drafts].tolist() if k else []
    for j in range(k):
        if q_d[j] > 0 and u[j].item() * q_d[j] < p_d[j]:  # never a token p rules out
            continue
        residual = (p[j] - draft_probs[j]).clamp_min_(0)
        if not float(residual.sum()) > 0:  # q covers p exactly where they differ by rounding
            residual = p[j]
        token = int(draw((residual / residual.sum()).unsqueeze(0), [generator])[0])
        return drafts[:j] + [token]
    return drafts + [int(draw(p[k : k + 1], [generator])[0])]
