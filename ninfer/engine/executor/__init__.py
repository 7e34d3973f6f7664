"""The executor: runs scheduled rows through the model on the device and samples them.

    backend.py  picks the op set (ReferenceOps / CudaOps) for the device
    runner.py   rows -> `ForwardBatch` -> model (eager or a graph replay) -> sampled ids
    graphs.py   CUDA graphs: decode per batch size, one-row prefill per bucket
    warmup.py   before serving: fast paths configured, every kernel path run once, captures

It owns the model, the op set, the `ModelCache` view of the pools and the captured graphs. It
knows nothing about requests, lanes or the prefix cache, and allocates no pool entry: rows name
their pages and state slots, and the warm-up borrows free ones and gives them back. It is the
only part of the engine that imports `ninfer.ops.cuda`.
"""
