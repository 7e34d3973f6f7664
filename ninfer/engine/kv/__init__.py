"""The engine's KV state: what is cached, what each lane holds, and the memory both live in.

`KVState` (state.py) is the owner: the prefix index, the Device KV page pool, the state pool,
the page budget, the Host transfer and the engine's cache counters. What one running request
holds is its `KVLane` (lane.py), built by an admission and dropped at release. Its collaborators
(`Admitter`, `Publisher`, `Prefetcher`, `PageBudget`) receive the parts they use when it builds
them and hold no reference back to it. Nothing here launches a model pass, samples, plans a
step or knows a kernel: that is the loop (engine.py, scheduler.py) and the executor.
"""
