"""The tensors the prefix cache's decisions act on (docs/ARCHITECTURE.md).

    kv_pool.py        Device KV pages, one FlashInfer-layout tensor per full-attention layer
    state_pool.py     Device state slots: C active + D snapshot, any slot in either role
    streams.py        compute / restore / transfer streams and events (no-ops on the CPU)
    host_slabs.py     the Host tier's pinned slabs, cut by one `SlabGeometry`
    copy_runs.py      which contiguous byte ranges a restore / write-through moves (pure ints)
    transfer.py       the engine's `Transfer` seam: `HostTransfer` issues those copies on the
                      streams and reports `Landed` batch ids; `DeviceOnlyTransfer` beside it

Knows no policy: which page or slot holds what is the prefix index's and the engine's business.
"""
