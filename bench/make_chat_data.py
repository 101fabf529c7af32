"""Write a chat dataset whose token lengths look like real instruction data.

Lengths follow a log-normal fitted to a 20k-example instruction set measured by the team (median 249
tokens, p90 about 790, p99 about 2000; ../shared/NOTES.md). The words come from one of two lexicons:

- ``--lexicon nato`` (the default): the tiny task's 26 NATO words, about 4.4 tokens a word with rayft's
  tiny tokenizer. The content is synthetic, but the packing problem is real.
- ``--lexicon zipf``: 60,000 pseudo-words built from syllables, drawn with Zipf frequencies (exponent 1.1,
  as in natural text). A 32k-vocabulary BPE trained on it (``bench/real_tokenizer.py``) learns whole
  common words and splits rare ones, as a real tokenizer does on real text. This is the lexicon for
  measuring tokenizer throughput at a real vocabulary size.

    python bench/make_chat_data.py /tmp/chat.jsonl --rows 20000 [--lexicon zipf]
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

from ray_jobs.tiny import WORDS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lexicon", choices=("nato", "zipf"), default="nato")
    parser.add_argument(
        "--jobs", type=int, default=1, help="processes writing parts at once (1: the same rows as always for a seed)"
    )
    args = parser.parse_args()
    if args.jobs <= 1:
        write_rows(args.out, args.rows, args.seed, args.lexicon)
        return
    import multiprocessing
    import shutil

    sizes = [args.rows // args.jobs + (k < args.rows % args.jobs) for k in range(args.jobs)]
    parts = [args.out.with_name(f"{args.out.name}.part{k}") for k in range(args.jobs)]
    with multiprocessing.Pool(args.jobs) as pool:
        pool.starmap(write_rows, [(part, n, args.seed * 1000 + k, args.lexicon) for k, (part, n) in enumerate(zip(parts, sizes))])
    with args.out.open("wb") as out:
        for part in parts:
            with part.open("rb") as src:
                shutil.copyfileobj(src, out)
            part.unlink()


def write_rows(out: Path, rows: int, seed: int, lexicon_name: str) -> None:
    rng = random.Random(seed)
    if lexicon_name == "zipf":
        lexicon, weights = zipf_lexicon(random.Random(1))
        median_words, draw = 249 / 1.2, lambda n: rng.choices(lexicon, cum_weights=weights, k=n)  # noqa: E731 - ~1.2 tokens a word
    else:
        median_words, draw = 56, lambda n: [rng.choice(WORDS) for _ in range(n)]  # noqa: E731 - ~4.4 tokens a word
    with out.open("w") as fh:
        for _ in range(rows):
            words = max(8, min(3000, int(rng.lognormvariate(math.log(median_words), 0.85))))
            prompt = max(4, int(words * rng.uniform(0.2, 0.6)))
            text = lambda n: " ".join(draw(n))  # noqa: E731
            fh.write(
                json.dumps(
                    {
                        "messages": [
                            {"role": "system", "content": "You are a helpful assistant."},
                            {"role": "user", "content": text(prompt)},
                            {"role": "assistant", "content": text(words - prompt)},
                        ]
                    }
                )
                + "\n"
            )


SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


def zipf_lexicon(rng: random.Random, size: int = 60_000, exponent: float = 1.1) -> tuple[list[str], list[float]]:
    """``size`` distinct pseudo-words of 1-4 syllables (shorter ones commoner, as in text), and the cumulative
    Zipf weights to draw them with."""
    words: dict[str, None] = {}
    while len(words) < size:
        n = min(4, 1 + int(rng.expovariate(0.9)))
        words["".join(rng.choice(SYLLABLES) for _ in range(n))] = None
    ordered = sorted(words, key=lambda w: (len(w), rng.random()))
    cum, total = [], 0.0
    for rank in range(1, size + 1):
        total += rank**-exponent
        cum.append(total)
    return ordered, cum


if __name__ == "__main__":
    main()
