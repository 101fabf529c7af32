"""What runs on each training worker: the base and its adapter (``model``, ``kernels``, ``lora_fused``, ``fp8``),
the parallel strategy (``strategy``), the step loop (``loop``), memory planning, evaluation, checkpoints and the
kernels compiled ahead of the first step (``compile_ahead``, ``kernel_store``).

Imports ``data``, ``cache`` and ``observe``; never ``warm``, which builds on it.
"""
