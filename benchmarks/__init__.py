"""benchmarks: every benchmark of the project, in one place (results: benchmarks/README.md).

- ``pipeline``: ``streamer bench``: raw clients, a naive pipeline, ours, the worker, codecs,
  schemas, the memory soak;
- ``decode``: the block decoder alone (``python -m benchmarks.decode``);
- ``checkpoint``: the cost of a checkpoint (``python -m benchmarks.checkpoint``);
- ``multiworker``: one model on 1 or 2 workers, and kill -9 to exit
  (``python -m benchmarks.multiworker``, from the repository root: it uses the test helpers).
"""
