"""The tensors the prefix cache's decisions act on (docs/ARCHITECTURE.md).

    kv_pool.py        Device KV pages, one FlashInfer-layout tensor per full-attention layer
    state_pool.py     Device state slots: C active + D snapshot, any slot in either role
    streams.py        compute / restore / transfer streams and events (no-ops on the CPU)
    transfer_seam.py  the engine's Transfer interface, and its Device-only implementation
    host_slabs.py, copy_runs.py, transfer.py, host_transfer.py   the pinned Host tier

Knows no policy: which page or slot holds what is the prefix index's and the engine's business.
"""
