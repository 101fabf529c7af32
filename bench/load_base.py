"""Where a 7B base's load goes on one GPU: quantized from its bf16 files, quantized and kept (``quantization.cache``,
its write on a thread beside), or read already quantized; each in a fresh process, as a job's worker loads it.

    python bench/load_base.py /tmp/llama-7b [--rounds 2] [--spy]

Each round runs the three in turn, each in a process of its own: ``quantize`` (the cache off), ``keep`` (the cache on,
a new cache root: it quantizes and keeps), ``read`` (the cache on, the root ``keep`` filled). A process prints its
imports' seconds (a worker's, ``ray_jobs.warm.pool.WARM_IMPORTS``), its CUDA context's, the load's
(``load_base_from``, to the GPU's last kernel), and for ``keep`` the write's seconds beside (``quantized_line``).
``--spy`` records each process of the last round with py-spy (100 Hz, native frames off) and prints the functions
its samples spent most time in, by their own time and with what they call. Uses the 7B preset's quantization (NF4,
double quant, bf16), as ``bench/service_7b.sh`` runs it. The table comes last.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESET = Path(__file__).resolve().parents[1] / "ray_jobs" / "presets" / "qlora_7b_1gpu.yaml"
MODES = ("quantize", "keep", "read")


def one(mode: str, model: str) -> dict[str, float | str]:
    """In this process: the load as a worker does it, timed."""
    began = time.perf_counter()
    from ray_jobs.warm.pool import import_training_stack

    # What a worker imports before its load. Without them, the load imports transformers' modeling modules itself:
    # 3.7-4.1 s of a 6.0-8.6 s load on an H100 (bench/load_base_h100.txt).
    import_training_stack()
    import torch

    imported = time.perf_counter()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")  # CPU: checked here
    torch.zeros(1, device=device)
    context = time.perf_counter()

    from ray_jobs.train.model import load_base_from
    from ray_jobs.train.strategy import Single
    from rayft_contract.spec import FineTuneSpec

    sets = [f"model.path={model}", f"quantization.cache={'false' if mode == 'quantize' else 'true'}"]
    spec = FineTuneSpec.load(str(PRESET), sets)
    started = time.perf_counter()
    loaded = load_base_from(spec, device, Single())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    load_s = time.perf_counter() - started
    line = loaded.quantized_line(wait=True)
    return {
        "mode": mode,
        "imports_s": round(imported - began, 2),
        "cuda_context_s": round(context - imported, 2),
        "load_s": round(load_s, 2),
        "kept_line": line,
        "gpu_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else 0.0,
    }


def spied(raw: Path, top: int = 18, within: str = "load_base_from") -> str:
    """py-spy's raw (collapsed) stacks of the load (those with a frame named ``within``) as two lists: the frames with
    the most samples of their own, and with the most samples in them or below (each frame counted once a stack)."""
    own: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")" for f in stack.split(";")]
        if not any(f.startswith(within + " ") for f in frames):
            continue
        n = int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inside[frame] += n
    total = max(total, 1)
    lines = [f"  {total} samples in {within}; by own time:"]
    lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines.append("  with what they call:")
    lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in inside.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--spy", action="store_true")
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.model)), flush=True)
        os._exit(0)  # a daemon writer thread is done by now (quantized_line waited); skip the interpreter's teardown

    beside = Path(sys.executable).with_name("py-spy")  # a venv's; the device's bundle unpacks it under /tmp/site
    found = [beside] if beside.is_file() else [p for p in Path("/tmp/site").rglob("py-spy") if p.is_file()]
    pyspy = shutil.which("py-spy") or (str(found[0]) if found else None)
    results = []
    for round_ in range(1, args.rounds + 1):
        with tempfile.TemporaryDirectory(prefix="rayft-load-") as root:
            env = {**os.environ, "RAYFT_CACHE_DIR": root}
            for mode in MODES:
                command = [sys.executable, __file__, args.model, "--one", mode]
                raw = Path(root) / f"{mode}.txt"
                if args.spy and round_ == args.rounds and pyspy:
                    command = [pyspy, "record", "-r", "100", "--format", "raw", "-o", str(raw), "--", *command]
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                if not found:
                    print(f"round {round_} {mode} failed:\n{done.stderr[-3000:]}", flush=True)
                    continue
                result = {"round": round_, **json.loads(found[0][len("RESULT ") :])}
                results.append(result)
                print(json.dumps(result), flush=True)
                if raw.is_file():
                    print(f"py-spy, round {round_}, {mode}:\n{spied(raw)}", flush=True)
    print(f"{'round':>5} {'mode':>9} {'imports s':>10} {'CUDA s':>7} {'load s':>7} {'GiB':>6}  quantized base")
    for r in results:
        print(
            f"{r['round']:>5} {r['mode']:>9} {r['imports_s']:>10} {r['cuda_context_s']:>7} {r['load_s']:>7} {r['gpu_gib']:>6}  "
            f"{r['kept_line']}"
        )


if __name__ == "__main__":
    main()
