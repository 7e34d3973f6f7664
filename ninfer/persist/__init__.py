"""The prefix cache file (design §5.5, `prefix_cache_file`): the Host tier across restarts.

    tables.py       the file's format (format 2): header, block / snapshot tables, checksums;
                    pure Python, no torch
    plan.py         what a save writes and what a load restores (all, or the densest snapshots
                    first), rebuilt Host-only in the `PrefixIndex`; pure Python, no torch
    payload.py      the slab bytes: Host slabs <-> the file's payload, temp file + fsync + rename
    lock.py         one engine per file: an flock beside it
    fingerprint.py  what a file must share with the engine to be used
    cache_file.py   `PrefixCacheFile`: the engine's load at construction and save at its stop

Sits above `ninfer.cache` and `ninfer.memory` and below the engine: the cache never imports it,
and it never imports the engine (`load` / `save` read the index and the slabs from the KV
state they are handed; a load that fails part-way resets its index, `KVState.reset_index`).
"""
