"""Write a chat dataset whose token lengths look like real instruction data.

Lengths follow a log-normal fitted to a 20k-example instruction set measured by the team (median 249
tokens, p90 about 790, p99 about 2000; ../shared/NOTES.md); the words are the tiny task's NATO words
(about 4.4 tokens a word with rayft's tiny tokenizer), so content is synthetic but the packing problem is real.

    python bench/make_chat_data.py /tmp/chat.jsonl --rows 20000
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
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with args.out.open("w") as fh:
        for _ in range(args.rows):
            words = max(8, min(3000, int(rng.lognormvariate(math.log(56), 0.85))))  # ~4.4 tokens/word
            prompt = max(4, int(words * rng.uniform(0.2, 0.6)))
            text = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
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


if __name__ == "__main__":
    main()
