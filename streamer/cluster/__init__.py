"""cluster: one model trained by N workers in lock-step (MultiWorkerMirroredStrategy).

- ``worker``: ``DistributedWorker``, the cluster loop (rounds of a control all-reduce and a
  step; the life it shares with a worker of its own is ``streamer.lifecycle``);
- ``plan``: how a cluster's worker builds its parts (``streamer.parts``): the strategy first,
  its partitions, the chief's checkpoint broadcast; what a cluster refuses at start;
- ``topology``: who the workers are, which partitions are whose, each round's decision;
- ``strategy``: the strategy and the compiled steps of a round;
- ``padding``: batches that never wait past the idle window; ``launch``: ``streamer launch``.
"""
