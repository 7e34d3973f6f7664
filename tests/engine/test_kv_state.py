"""The KV-state owner (`ninfer/engine/kv/state.py`): its collaborators work on the owner's parts,
also after the index is replaced (a cache file that failed to load part-way)."""

from __future__ import annotations

import random

from engine_helpers import assert_idle, greedy, rand_tokens

PROMPT = rand_tokens(random.Random(11), 260)


def _two_turns(llm):
    """The same prompt twice: the second is served from what the first left in the cache."""
    outs = [llm.generate([PROMPT], greedy(12))[0] for _ in range(2)]
    return [(o.token_ids, o.usage.cached_tokens, o.usage.restored_host_bytes) for o in outs]


def test_a_cache_file_failing_in_its_payload_leaves_an_empty_index_in_use(make_llm, tmp_path):
    """The file's tables are rebuilt into the index before a slab checksum fails: the index is
    replaced by an empty one, and admission, publication and prefetch all work on that one.
    The engine then serves exactly as one that never had a file (same tokens, a cold first
    turn, the same hit on the second), with the cache consistent after every step."""
    path = tmp_path / "c.hpc"
    writer = make_llm(prefix_cache_file=str(path))
    writer.generate([PROMPT], greedy(12))
    writer.close()
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x5A  # inside the last slab: the tables are read and rebuilt first
    path.write_bytes(bytes(data))

    reader = make_llm(prefix_cache_file=str(path))
    kv_state = reader.engine.kv_state
    assert reader.cache_stats().snapshots == 0  # nothing half-restored
    for part in (kv_state.admitter, kv_state.publisher, kv_state.prefetcher, kv_state.budget):
        assert part.index is kv_state.index
    got = _two_turns(reader)
    want = _two_turns(make_llm())
    assert got == want
    assert got[0][1] == 0 and got[1][1] > 0  # cold, then a hit on what the first turn left
    assert_idle(reader)
    reader.close(save=False)
