"""Chat templating and tokenization, with the prompt masked out of the loss.

A conversation is rendered with the tokenizer's own Jinja chat template (or the spec's, or ChatML
when the tokenizer has none) and cut into segments at turn boundaries, found by rendering each
prefix of the conversation: the text a turn adds is the new render minus the previous one. An
assistant turn is cut once more, after its header (``add_generation_prompt``), so only the answer
and its end-of-turn marker are trained. Segments are tokenized separately and concatenated, so a
token never straddles a trained and an untrained segment.

Two shortcuts keep this near a bare tokenizer's speed (``bench/data_bench.py --real-tokenizer``):

- **ChatML without Jinja.** When the template is rayft's own ChatML, segments are built with string
  concatenation instead of 2-3 Jinja renders a turn (a test checks that both give the same segments).
- **One tokenizer call for many rows.** :meth:`ChatEncoder.encode_many` tokenizes every segment of a batch
  of rows in one ``encode_batch`` of the Rust tokenizer, instead of one ``tokenizer(...)`` call a row.
On the H200 host's 16 cores with a 32k BPE, one tokenizer actor did 40% of a bare ``encode_batch`` loop
before these (732 against 1,830 rows/s).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ray_jobs.data.formats import Turn

IGNORE_INDEX = -100
"""Label of tokens that carry no loss (PyTorch's cross-entropy default ``ignore_index``)."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""Used when neither the spec nor the tokenizer has a chat template."""


def load_tokenizer(path: str) -> Any:
    """A model directory's tokenizer, for tokenizing alone (the tokenizer actors).

    From its ``tokenizer.json`` when it has one, through the ``tokenizers`` library alone
    (:class:`RustTokenizer`): ``transformers`` imports torch on the H200 host's image, 2.7-4.9 s of every
    actor's start (5-6 s with 12 actors starting at once), inside the fill's fixed cost. ``AutoTokenizer`` took 2.2 s
    here even without torch. The ids, special tokens and chat template are the same (a test compares them
    with ``AutoTokenizer``'s); directories without a ``tokenizer.json`` (slow, Python tokenizers), or whose
    special tokens or template :class:`RustTokenizer` cannot read, go through ``AutoTokenizer``."""
    from pathlib import Path

    if (Path(path) / "tokenizer.json").is_file():
        light = RustTokenizer.load(path)
        if light is not None:
            return light
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class RustTokenizer:
    """What :class:`ChatEncoder` needs of a fast tokenizer, read from ``tokenizer.json`` and
    ``tokenizer_config.json`` (and ``chat_template.jinja``, where transformers 5 writes the template): the
    Rust core, the BOS, EOS and pad ids, the chat template. Rendering a template other than ChatML, or
    calling it as a Hugging Face tokenizer, loads the full ``PreTrainedTokenizerFast`` then."""

    def __init__(self, path: str, backend: Any, special: dict[str, int | None], chat_template: str | None):
        self.path = path
        self.backend_tokenizer = backend
        self.bos_token_id, self.eos_token_id, self.pad_token_id = special["bos"], special["eos"], special["pad"]
        self.chat_template = chat_template

    @classmethod
    def load(cls, path: str) -> RustTokenizer | None:
        """``None`` when the directory's configuration holds what only transformers can resolve: named chat
        templates, a special token given other than as text or missing from the vocabulary, added tokens
        that ``tokenizer.json`` lacks, or truncation or padding set in it."""
        import json
        from pathlib import Path

        from tokenizers import Tokenizer

        root = Path(path)
        config_file = root / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        map_file = root / "special_tokens_map.json"  # older directories name their special tokens here too
        for name, token in (json.loads(map_file.read_text()) if map_file.is_file() else {}).items():
            if config.setdefault(name, token) != token:
                return None  # which one transformers takes is its own rule: let it decide
        template = config.get("chat_template")
        if template is None and (root / "chat_template.jinja").is_file():
            template = (root / "chat_template.jinja").read_text()
        if template is not None and not isinstance(template, str):
            return None
        backend = Tokenizer.from_file(str(root / "tokenizer.json"))
        if backend.truncation or backend.padding:  # transformers sets these per call; let it
            return None
        for token_id, token in config.get("added_tokens_decoder", {}).items():  # tokens the config adds
            if not isinstance(token, dict) or backend.token_to_id(token.get("content", "")) != int(token_id):
                return None
        special: dict[str, int | None] = {}
        for name in ("bos", "eos", "pad"):
            token = config.get(f"{name}_token")
            if isinstance(token, dict):
                token = token.get("content")
            if token is not None and (not isinstance(token, str) or backend.token_to_id(token) is None):
                return None
            special[name] = None if token is None else backend.token_to_id(token)
        return cls(path, backend, special, template)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        return self._full.apply_chat_template(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._full(*args, **kwargs)

    @functools.cached_property
    def _full(self) -> Any:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(self.path)


class TemplateError(ValueError):
    """The chat template cannot be cut at turn boundaries."""


class ChatEncoder:
    """Turns conversations or plain text into ``(input_ids, labels)`` with a Hugging Face tokenizer."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None, completions_only: bool = True):
        self.tokenizer = tokenizer
        self.template = chat_template or getattr(tokenizer, "chat_template", None) or CHATML_TEMPLATE
        self.completions_only = completions_only
        self.chatml = self.template == CHATML_TEMPLATE
        self._rust = getattr(tokenizer, "backend_tokenizer", None)
        """The fast tokenizer's Rust core (``None`` for a slow, Python tokenizer)."""

    def segments(self, turns: Sequence[Turn]) -> list[tuple[str, bool]]:
        """The rendered conversation as ``(text, trained)`` pieces whose concatenation is the full render."""
        if self.chatml:
            return self._chatml_segments(turns)
        return self.jinja_segments(turns)

    def _chatml_segments(self, turns: Sequence[Turn]) -> list[tuple[str, bool]]:
        """What :meth:`jinja_segments` gives for :data:`CHATML_TEMPLATE`, without rendering it."""
        untrained = not self.completions_only
        pieces: list[tuple[str, bool]] = []
        for turn in turns:
            if turn.role == "assistant":
                pieces.append(("<|im_start|>assistant\n", untrained))
                pieces.append((turn.content + "<|im_end|>\n", True))
            else:
                pieces.append((f"<|im_start|>{turn.role}\n{turn.content}<|im_end|>\n", untrained))
        return pieces

    def jinja_segments(self, turns: Sequence[Turn]) -> list[tuple[str, bool]]:
        """Segments by rendering each prefix of the conversation with the template (any template)."""
        pieces: list[tuple[str, bool]] = []
        done = ""
        for i, turn in enumerate(turns):
            if turn.role == "assistant":
                header = self._render(turns[:i], add_generation_prompt=True)
                pieces.append((self._after(done, header), not self.completions_only))
                done = header
            full = self._render(turns[: i + 1])
            trained = turn.role == "assistant" or not self.completions_only
            pieces.append((self._after(done, full), trained))
            done = full
        return [(text, trained) for text, trained in pieces if text]

    def encode_turns(self, turns: Sequence[Turn]) -> tuple[list[int], list[int]]:
        return self._encode(self.segments(turns))

    def prompt_ids(self, turns: Sequence[Turn]) -> list[int]:
        """The tokens a model answers after: ``turns`` rendered with the assistant's header, as in training."""
        text = self._render(turns, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_text(self, text: str) -> tuple[list[int], list[int]]:
        """Plain text: BOS + text + EOS, every token trained."""
        (encoded,) = self.encode_many([(self.text_segments(text), True)])
        return encoded

    def text_segments(self, text: str) -> list[tuple[str, bool]]:
        """Plain text as one trained segment; :meth:`encode_many` adds BOS and EOS for it (``bos_eos``)."""
        return [(text, True)]

    def encode_many(self, rows: Sequence[tuple[list[tuple[str, bool]], bool]]) -> list[tuple[list[int], list[int]]]:
        """``(segments, bos_eos)`` of many rows -> each row's ``(input_ids, labels)``, in one tokenizer call.
        ``bos_eos``: wrap the row in BOS ... EOS, every token trained (plain text, as :meth:`encode_text`)."""
        texts = [text for segments, _ in rows for text, _ in segments]
        encoded = self._ids(texts)
        out, k = [], 0
        tok = self.tokenizer
        for segments, bos_eos in rows:
            ids: list[int] = []
            labels: list[int] = []
            if bos_eos and tok.bos_token_id is not None:
                ids.append(tok.bos_token_id)
                labels.append(tok.bos_token_id)
            for _, trained in segments:
                piece = encoded[k]
                k += 1
                ids.extend(piece)
                labels.extend(piece if trained else [IGNORE_INDEX] * len(piece))
            if bos_eos and tok.eos_token_id is not None:
                ids.append(tok.eos_token_id)
                labels.append(tok.eos_token_id)
            out.append((ids, labels))
        return out

    def _ids(self, texts: list[str]) -> list[list[int]]:
        if self._rust is not None:
            # encode_batch_fast: the same ids without each token's character offsets, which nothing here reads.
            # A conversation is 4 segments a row on average; their offsets cost 17% of a bare loop's rate on
            # the 32k BPE (2,194 against 2,616 rows/s on one core here, bench/RESULTS.md).
            encode = getattr(self._rust, "encode_batch_fast", self._rust.encode_batch)
            return [e.ids for e in encode(texts, add_special_tokens=False)]
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

    def _encode(self, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
        (encoded,) = self.encode_many([(pieces, False)])
        return encoded

    def _render(self, turns: Sequence[Turn], add_generation_prompt: bool = False) -> str:
        messages = [{"role": t.role, "content": t.content} for t in turns]
        if not messages and not add_generation_prompt:
            return ""
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.template, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    @staticmethod
    def _after(prefix: str, full: str) -> str:
        if not full.startswith(prefix):
            raise TemplateError(
                "the chat template renders a conversation differently from its prefix, so turns cannot be "
                "masked; set data.chat_template to a template that renders turn by turn (e.g. ChatML)"
            )
        return full[len(prefix) :]
