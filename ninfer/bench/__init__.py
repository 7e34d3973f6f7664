"""Benchmarks as functions returning dicts: prefill, decode, TTFT, resume, restore, cache,
reuse."""

# Here rather than in `suite` (which imports torch), so that `ninfer --help` stays fast.
PARTS = ("prefill", "decode", "ttft", "resume", "restore", "cache", "reuse")
