"""The node's caches of models: content-addressed entries committed atomically (``entries``), base models from
local dirs, ``s3://`` or the hub cache (``models``), and quantized bases kept so a later load is a read
(``quantized``), and a base's files checked before any cluster starts: safetensors weights, a tokenizer within the
embeddings, a LoRA's module names read from the weights' headers (``model_files``). The dataset cache is ``ray_jobs.data.cache``, since a fill is the data pipeline's.

Imports only the job's shared modules (``storage``).
"""
