"""The Device state pool: C active slots + D snapshot slots over one slot-major tensor pair.

    conv: [S + X, n_gdn, conv_dim, K-1]  model dtype      S = C + D physical slots
    ssm:  [S + X, n_gdn, Hv, dk, dv]     float32          (one slot's image is contiguous)

(X scratch slots after the S, outside every list: `scratch_slots`.)

Any physical slot can play either role. Lanes hold physical slots taken from the active free
list; the prefix index names snapshot slots 0..D-1 ("logical"), and `snap_phys[d]` says which
physical slot holds snapshot slot d's image. That indirection lets an endpoint snapshot take a
finishing lane's image without a copy (`adopt_endpoint` swaps ownership), as design §7.7 asks.

Invariant (checked by `check_invariants`): the active free list, the lanes' slots and the
`snap_phys` table partition 0..S-1, and the active side always has exactly C slots.

Mutates: `acquire` / `release` / `adopt_endpoint` change ownership; `tap` / `resume` /
`copy_image` copy images.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class StatePool:
    def __init__(
        self,
        active_slots: int,
        snapshot_slots: int,
        n_gdn: int,
        conv_dim: int,
        conv_width: int,
        heads: int,
        dk: int,
        dv: int,
        dtype: torch.dtype,
        device: torch.device,
        scratch: int = 0,
    ) -> None:
        self.active_slots = active_slots
        self.snapshot_slots = snapshot_slots
        total = active_slots + snapshot_slots
        # `scratch` more physical slots after the S pool slots, owned by no lane and no snapshot
        # (the prefill graphs' padding row writes its state there)
        self.scratch_slots = list(range(total, total + scratch))
        phys = total + scratch
        self.conv = torch.zeros((phys, n_gdn, conv_dim, conv_width - 1), dtype=dtype, device=device)
        self.ssm = torch.zeros((phys, n_gdn, heads, dk, dv), dtype=torch.float32, device=device)
        self._free_active: list[int] = list(range(active_slots - 1, -1, -1))
        self.snap_phys: list[int] = list(range(active_slots, total))

    @property
    def total_slots(self) -> int:
        return self.active_slots + self.snapshot_slots

    @property
    def image_bytes(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in (self.conv, self.ssm))

    # ---- active slots ---------------------------------------------------------------------
    @property
    def num_free_active(self) -> int:
        return len(self._free_active)

    def acquire(self) -> int:
        """Take a physical slot for a new lane. Raises when all C are in use."""
        if not self._free_active:
            raise RuntimeError("state pool: no free active slot")
        return self._free_active.pop()

    def release(self, phys: int) -> None:
        if phys in self._free_active or phys in self.snap_phys:
            raise RuntimeError(f"state pool: slot {phys} released but not held by a lane")
        self._free_active.append(phys)

    # ---- snapshot images --------------------------------------------------------------------
    def tap(self, lane_phys: int, snap: int) -> None:
        """Copy a lane's image into snapshot slot `snap` (2 device copies, queued)."""
        dst = self.snap_phys[snap]
        self.conv[dst].copy_(self.conv[lane_phys])
        self.ssm[dst].copy_(self.ssm[lane_phys])

    def resume(self, snap: int, lane_phys: int) -> None:
        """Copy snapshot slot `snap`'s image into a lane's slot (2 device copies, queued)."""
        src = self.snap_phys[snap]
        self.conv[lane_phys].copy_(self.conv[src])
        self.ssm[lane_phys].copy_(self.ssm[src])

    def adopt_endpoint(self, lane_phys: int, snap: int) -> int:
        """Make a finishing lane's slot the image of (free) snapshot slot `snap` without a copy;
        returns the physical slot that leaves the snapshot side, now owned by the caller (who
        normally `release`s it to the active free list)."""
        old = self.snap_phys[snap]
        self.snap_phys[snap] = lane_phys
        return old

    def copy_image(self, src: int, dst: int) -> None:
        """Copy physical slot `src`'s image into physical slot `dst` (2 device copies,
        queued): a speculative lane's state rolled back to its accepted tokens."""
        self.conv[dst].copy_(self.conv[src])
        self.ssm[dst].copy_(self.ssm[src])

    # ---- invariants -----------------------------------------------------------------------
    def check_invariants(self, lane_slots: Iterable[int]) -> None:
        lanes = list(lane_slots)
        owners = self._free_active + lanes + self.snap_phys
        if sorted(owners) != list(range(self.total_slots)):
            raise AssertionError(
                f"state pool: slots not a partition (free={self._free_active}, lanes={lanes}, "
                f"snap={self.snap_phys})"
            )
        if len(self._free_active) + len(lanes) != self.active_slots:
            raise AssertionError("state pool: active side does not hold exactly C slots")
