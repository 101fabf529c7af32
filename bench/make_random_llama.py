"""Build a random-weight Llama-2-7B-shaped model on the GPU and save it, with a small BPE tokenizer.

No downloads: the weights are random (throughput does not depend on their values) and the tokenizer
is rayft's tiny BPE (ids < 320; the model keeps Llama-2's 32000-row embedding and head).

    python bench/make_random_llama.py /tmp/llama-7b [--layers 32]
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ray_jobs.tiny import write_tokenizer

log = logging.getLogger("bench")

LLAMA2_7B = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=32)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if (args.out / "config.json").is_file():
        log.info("%s exists", args.out)
        return
    t0 = time.perf_counter()
    write_tokenizer(args.out)
    config = LlamaConfig(
        **{**LLAMA2_7B, "num_hidden_layers": args.layers},
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    log.info("built %.2fB params in %.1f s", sum(p.numel() for p in model.parameters()) / 1e9, time.perf_counter() - t0)
    model.save_pretrained(args.out)
    log.info("saved to %s in %.1f s total", args.out, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
