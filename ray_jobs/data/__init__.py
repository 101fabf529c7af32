"""Rows in, packed token rows out: sources and formats, the chat template, tokenizing and packing on Ray Data
(``pipeline``), bad-row accounting (``quality``), the dataset cache they fill (``cache``) and the order training
reads it in (``order``).

Imports ``ray_jobs.cache`` (a tokenizer is fetched as a model is) and the job's shared modules; never
``train``, ``observe`` or ``warm`` (``tests/unit/test_layering.py``).
"""
