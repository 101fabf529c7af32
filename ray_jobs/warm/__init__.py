"""Workers that exist before their job: the operator's pool (``pool``, ``settings``, ``control``) and a one-GPU
job's own early worker (``early``). Both run ``ray_jobs.train.loop`` in a process that already imported the
training stack.

Imports ``train`` and below; nothing imports it but the driver (``ray_jobs.run``) and the CLI.
"""
