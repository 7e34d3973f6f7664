"""The package's version: below every other module (the CLI and the cache file's fingerprint
read it without importing the package's face)."""

__version__ = "0.1.0"
