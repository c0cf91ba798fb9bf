"""input: from Kafka (or the embedded simulator) to decoded blocks in tf.data.

- ``source``: ``StreamSource``, N consumer shards as interleaved ``from_generator`` datasets,
  decoded block by block; ``StreamStart`` / ``resolve_start``: where a run starts, once;
- ``routing``: shard events, who owns a partition now, where commit requests go;
- ``passes``: when a pass ends (records, clock, idle shards) and a replay's range;
- ``offsets``: ``OffsetTracker``, the low-watermark commit points of what was trained;
- ``stream_position``: ``StreamPosition``, the stream position's one home;
- ``rejects``, ``breaker``, ``deadletter``: records the decoder refused, the reject breaker,
  the dead-letter writer;
- ``shuffle``: the shuffle window; ``pipeline``: ``PipelineSettings``;
- ``probe``: is a broker reachable (readiness); ``simulator``: the embedded simulator's
  shards and ``streamer simulate``'s producer;
- ``errors``: the errors of the input path above the consumers (the pipeline, the breaker).
"""
