"""The job on the Ray cluster: ``run`` (the phases in order) and ``submitted`` (a service job's entrypoint) at the
top, over five subpackages that depend one way (``tests/unit/test_layering.py``)::

    warm -> train -> data -> cache
            train -> observe

and the shared modules every one of them may use (``storage``, ``chaos``, ``events``, ``background``,
``local_ray``, ``node_gpus``), which import no subpackage.
"""
