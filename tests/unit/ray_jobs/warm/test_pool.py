"""A warm worker's process (ray_jobs.warm.pool), on CPU: what it imports before any job. The pool's life on a cluster is
tests/integration/test_warm_pool.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_a_job_set_up_in_a_warm_worker_s_process_registers_no_pytree_node_after_the_worker_s_imports(tiny_spec, tmp_path):
    """Every compiled function guards the count of pytree node types, so a module the job imports after the worker's
    compiles that registers one (transformers output classes do; Liger's did) makes the job's first step compile them
    all again. A fresh process, as a worker's is: the job's load, adaptation and one step after ``import_training_stack``."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(tiny_spec.to_dict()))
    code = f"""
import json, torch
import torch.utils._pytree as pytree
from ray_jobs.warm.pool import import_training_stack
import_training_stack()
before = len(pytree.SUPPORTED_NODES)
from ray_jobs.data.packing import rows_of_job_shape
from ray_jobs.train.model import adapt, autocast, load_base_from
from ray_jobs.train.strategy import Single
from rayft_contract.spec import FineTuneSpec
spec, device = FineTuneSpec.load({str(spec_file)!r}), torch.device("cpu")
model = adapt(load_base_from(spec, device, Single()).model, spec, device, world=1).model
batch = rows_of_job_shape(spec, model.config.vocab_size, "sdpa", device, 2)
with autocast(spec, device):
    model(**batch).loss.backward()
print(json.dumps([before, len(pytree.SUPPORTED_NODES)]))
"""
    env = {**os.environ, "RAYFT_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert before > 0
    assert after == before, "the job registered pytree nodes after the worker's imports: add their module to WARM_IMPORTS"
