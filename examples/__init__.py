"""Example models for ``streamer run --model examples.<module>:<function>`` (run from the repository root)."""
