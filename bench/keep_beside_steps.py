"""What writing a 7B quantized base beside training costs the training's steps, on one GPU (``quantization.cache``).

    python bench/keep_beside_steps.py [--steps-before 3] [--modes none,pageable,pinned,pinned-ahead,chunked]

The job writes its NF4 base (3.9 GB in 1,411 tensors for a 7B Llama) from a thread, after its first step
(``ray_jobs.cache.quantized``). On an H100 that write made the job's second step 2.3 s longer (5.67 s against 3.33 s,
``bench/RESULTS.md``). This script stands in a GPU-bound loop of many launches for the job's steps (32 bf16 layers of
4096, forward and backward, one host sync a step) and, once its steps are steady, runs the real writer
(``quantized._write``, through ``Keeping``) on a state of the 7B base's tensor names, shapes and dtypes on the GPU,
while it keeps stepping. For each mode it prints the median step before the write, the steps while it ran, their
excess over that median (what the write cost the steps), and the write's own seconds:

- ``none``: no write (the loop's noise),
- ``pageable``: each tensor copied with ``tensor.to("cpu")`` on the writer's stream (what the job did up to 2026-12-06),
- ``pinned``: into one pinned buffer of the largest file's size (2 GB), non-blocking, one wait a file (commit d8dff73),
- ``pinned-ahead``: the same with its buffer pinned before the write, outside the steps (what pinning 2 GB costs them),
- ``chunked``: the writer as it is (``quantized._Staging``): through a pinned chunk of 256 MiB into a pageable buffer.

One JSON line a mode, then a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig

from ray_jobs.cache import quantized

HIDDEN, INTER, VOCAB, LAYERS = 4096, 11008, 32000, 32
PROJECTIONS = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN, HIDDEN),
               "self_attn.v_proj": (HIDDEN, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
               "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN), "mlp.down_proj": (HIDDEN, INTER)}  # fmt: skip


def base_state(device: torch.device) -> dict[str, torch.Tensor]:
    """A 7B Llama's NF4 state dict as ``keep`` takes it (double quantization): names, shapes and dtypes; random."""
    state: dict[str, torch.Tensor] = {}

    def put(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        state[name] = torch.randint(0, 100, shape, device=device).to(dtype)

    put("model.embed_tokens.weight", (VOCAB, HIDDEN), torch.bfloat16)
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        for proj, (out, inp) in PROJECTIONS.items():
            blocks = out * inp // 64
            put(prefix + proj + ".weight", (out * inp // 2, 1), torch.uint8)
            put(prefix + proj + ".weight.absmax", (blocks,), torch.uint8)
            put(prefix + proj + ".weight.nested_absmax", (blocks // 256,), torch.float32)
            put(prefix + proj + ".weight.nested_quant_map", (256,), torch.float32)
            put(prefix + proj + ".weight.quant_map", (16,), torch.float32)
            put(prefix + proj + ".weight.quant_state.bitsandbytes__nf4", (130,), torch.uint8)
        put(prefix + "input_layernorm.weight", (HIDDEN,), torch.bfloat16)
        put(prefix + "post_attention_layernorm.weight", (HIDDEN,), torch.bfloat16)
    put("model.norm.weight", (HIDDEN,), torch.bfloat16)
    put("lm_head.weight", (VOCAB, HIDDEN), torch.bfloat16)
    return state


class Pageable(quantized._Staging):
    """The writer's copies as they were: ``tensor.to("cpu")`` each, on its stream; nothing pinned."""

    def __init__(self, gpu: torch.device, loaded: torch.cuda.Event, files: object, state: object) -> None:
        self.side, self.buffer, self.pinned = torch.cuda.Stream(gpu), None, None
        self.side.wait_event(loaded)

    def on_cpu(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with torch.cuda.stream(self.side):
            return {name: tensor.to("cpu").contiguous() for name, tensor in tensors.items()}


class Pinned(quantized._Staging):
    """Into one pinned buffer of the largest file's size, non-blocking, one wait a file (the writer at d8dff73)."""

    def __init__(self, gpu: torch.device, loaded: torch.cuda.Event, files: object, state: dict) -> None:
        largest = max(sum(quantized._aligned(state[name]) for name in names) for names in files)
        self.side, self.buffer = torch.cuda.Stream(gpu), None
        self.side.wait_event(loaded)
        self.pinned = self.pinned_now(largest)  # close() gives it back, as the writer does

    def pinned_now(self, size: int) -> torch.Tensor:
        return torch.empty(size, dtype=torch.uint8, pin_memory=True)

    def on_cpu(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        views = quantized._laid_out(self.pinned, tensors)
        with torch.cuda.stream(self.side):
            for name, view in views.items():
                view.copy_(tensors[name], non_blocking=True)
        self.side.synchronize()
        return views


AHEAD: list[torch.Tensor] = []


class PinnedAhead(Pinned):
    """The same, its buffer pinned by the script before the write (``AHEAD``)."""

    def pinned_now(self, size: int) -> torch.Tensor:
        return AHEAD.pop()


STAGINGS = {"pageable": Pageable, "pinned": Pinned, "pinned-ahead": PinnedAhead, "chunked": quantized._Staging}


class Steps:
    """A GPU-bound stand-in for training steps: many launches, one host sync a step."""

    def __init__(self, device: torch.device, tokens: int = 4096, passes: int = 8) -> None:
        self.layers = [torch.nn.Linear(HIDDEN, HIDDEN, bias=False, device=device, dtype=torch.bfloat16) for _ in range(LAYERS)]
        self.x = torch.randn(tokens, HIDDEN, device=device, dtype=torch.bfloat16)
        self.passes = passes

    def step(self) -> float:
        began = time.perf_counter()
        for _ in range(self.passes):
            h = self.x
            for layer in self.layers:
                h = torch.nn.functional.silu(layer(h)) + h * 0.5
            h.float().pow(2).mean().backward()
        for layer in self.layers:
            layer.weight.grad = None
        torch.cuda.synchronize()
        return time.perf_counter() - began


def run(mode: str, steps: Steps, steps_before: int, root: Path) -> dict[str, object]:
    device = torch.device("cuda")
    if mode == "pinned-ahead":
        AHEAD.append(torch.empty(2 * 2**30, dtype=torch.uint8, pin_memory=True))
    before = [steps.step() for _ in range(steps_before)]
    median = statistics.median(before)
    if mode == "none":
        during = [steps.step() for _ in range(6)]
        return {"mode": mode, "median_before_s": round(median, 3), "during_s": [round(s, 3) for s in during],
                "excess_s": round(sum(during) - median * len(during), 2), "write_s": None}  # fmt: skip
    state = base_state(device)
    torch.cuda.synchronize()
    model_dir = Path(tempfile.mkdtemp(prefix=f"base-{mode}-", dir=root))
    (model_dir / "config.json").write_text("{}")
    entry = quantized._entry(str(model_dir), {"mode": mode}, str(root / "cache"))
    config = LlamaConfig()  # what the writer saves beside the weights
    loaded = torch.cuda.Event()
    loaded.record(torch.cuda.current_stream(device))
    original = quantized._Staging
    quantized._Staging = STAGINGS[mode]  # what _write stages with, looked up when it runs
    try:
        keeping = quantized.Keeping(state, config, None, entry, device, loaded, f"bench {mode}")
        del state
        keeping.start()
        during = []
        while not keeping.done():
            during.append(steps.step())
        during.append(steps.step())  # the step the write ended in may have started before; one after it
        kept = keeping.wait()
    finally:
        quantized._Staging = original
    return {"mode": mode, "median_before_s": round(median, 3), "during_s": [round(s, 3) for s in during],
            "excess_s": round(sum(during) - median * len(during), 2), "write_s": kept.seconds,
            "gb": round(kept.bytes / 1e9, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps-before", type=int, default=3)
    parser.add_argument("--modes", default="none,pageable,pinned,pinned-ahead,chunked,pinned,chunked")
    args = parser.parse_args()
    steps = Steps(torch.device("cuda"))
    for _ in range(2):
        steps.step()  # kernels chosen, the allocator grown
    rows = []
    with tempfile.TemporaryDirectory(prefix="rayft-keep-beside-") as root:
        for mode in args.modes.split(","):
            rows.append(run(mode, steps, args.steps_before, Path(root)))
            print(json.dumps(rows[-1]), flush=True)
    print(f"{'mode':>12} {'median step s':>14} {'steps during':>13} {'excess s':>9} {'write s':>8}")
    for row in rows:
        during, write = len(row["during_s"]), row["write_s"] or ""
        print(f"{row['mode']:>12} {row['median_before_s']:>14} {during:>13} {row['excess_s']:>9} {write:>8}")


if __name__ == "__main__":
    main()
