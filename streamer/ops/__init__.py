"""ops: what an operator sees and the process needs, beside the data path.

- ``metrics``: the Prometheus metric set (``python -m streamer.ops.metrics``: its reference);
- ``health``: liveness, readiness and the HTTP server of /metrics, /healthz, /readyz;
- ``status``: the status line; ``tboard``: TensorBoard summaries and the profiler window;
- ``signals``: SIGTERM/SIGINT, one clean stop however it arrives; ``audit``: the audit log;
- ``tfstart``: TensorFlow's start without its noise; ``gctune``: the garbage collector;
- ``cost``: cost per record (CPU per process, the GIL held; ``_gilprobe.c`` samples it).
"""
