"""rayft's contract: what the service, the job on the cluster and the clients agree on.

- ``spec``: the typed, validated fine-tuning spec (standard library and PyYAML only).
- ``v1``: the gRPC code generated from ``proto/rayft_contract/v1/finetune.proto`` (``make proto``).
- ``convert``: the one mapping between those protobuf messages and the Python types here.
- ``events``: the events a job emits; ``states``: a job's states and their transitions.

It imports none of ``service``, ``ray_jobs`` or ``rayft``, and never torch or Ray: a client that only
submits and watches jobs installs this and gRPC, nothing of the training stack
(``tests/unit/test_layering.py`` holds that line).
"""
