"""Train a real-size tokenizer: a 32k-vocabulary byte-level BPE, as Llama- and Mistral-class models use.

The tiny tokenizer (320 tokens, ``ray_jobs/tiny.py``) makes tokenizing look cheaper than it is: its merges
table is tiny and every word is a few tokens. This one is trained the same way (``tokenizers``, locally,
nothing from a hub) on ``bench/make_chat_data.py --lexicon zipf`` text, and saved as a transformers
tokenizer with the same ChatML template and special tokens, so a spec's ``model.path`` can point at it.

    python bench/real_tokenizer.py /tmp/tok32k --data /tmp/chat.jsonl [--vocab 32000] [--rows 50000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--data", type=Path, required=True, help="JSONL chat rows to learn from")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rows", type=int, default=50000, help="rows of --data to learn from")
    args = parser.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ray_jobs.data.template import CHATML_TEMPLATE
    from ray_jobs.tiny import SPECIAL

    def texts():
        with args.data.open() as fh:
            for line in itertools.islice(fh, args.rows):
                yield from (m["content"] for m in json.loads(line)["messages"])

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(args.out)
    print(f"{args.out}: {tok.get_vocab_size():,} tokens")


if __name__ == "__main__":
    main()
