"""Benchmarks as functions returning dicts: prefill, decode, TTFT, resume, restore, cache."""

# Here rather than in `suite` (which imports torch), so that `ninfer --help` stays fast.
PARTS = ("prefill", "decode", "ttft", "resume", "restore", "cache")
