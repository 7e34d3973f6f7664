"""Benchmarks as library functions returning dicts (prefill, decode, TTFT, restore, cache)."""

# Here rather than in `suite` (which imports torch), so that `ninfer --help` stays fast.
PARTS = ("prefill", "decode", "ttft", "restore", "cache")
