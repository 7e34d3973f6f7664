"""Benchmarks as library functions returning dicts (prefill, decode, TTFT, restore, cache)."""
