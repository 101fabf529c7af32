"""Chat templating: the rendered text is the tokenizer's template, and only answers carry labels."""

from __future__ import annotations

import pytest

from ray_jobs.data.formats import Turn
from ray_jobs.data.template import IGNORE_INDEX, ChatEncoder, TemplateError

CONVERSATION = [
    Turn("system", "You count."),
    Turn("user", "count from golf"),
    Turn("assistant", "golf hotel"),
    Turn("user", "again from kilo"),
    Turn("assistant", "kilo lima"),
]


def trained_text(tokenizer, ids, labels):
    return tokenizer.decode([i for i, lab in zip(ids, labels) if lab != IGNORE_INDEX])


def test_concatenated_segments_equal_the_full_render(tokenizer):
    encoder = ChatEncoder(tokenizer)
    full = tokenizer.apply_chat_template([t._asdict() for t in CONVERSATION], tokenize=False)
    assert "".join(text for text, _ in encoder.segments(CONVERSATION)) == full


def test_only_assistant_answers_are_trained(tokenizer):
    ids, labels = ChatEncoder(tokenizer).encode_turns(CONVERSATION)
    assert len(ids) == len(labels)
    assert trained_text(tokenizer, ids, labels) == "golf hotel<|im_end|>\nkilo lima<|im_end|>\n"
    assert tokenizer.decode(ids).count("<|im_start|>") == 5


def test_train_on_everything(tokenizer):
    ids, labels = ChatEncoder(tokenizer, completions_only=False).encode_turns(CONVERSATION)
    assert ids == labels


def test_chatml_is_the_fallback_template(tokenizer):
    class NoTemplate:
        chat_template = None

        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __call__(self, *args, **kwargs):
            return tokenizer(*args, **kwargs)

    encoder = ChatEncoder(NoTemplate())
    assert "<|im_start|>" in encoder.template


def test_spec_template_overrides(tokenizer):
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
    ids, labels = ChatEncoder(tokenizer, chat_template=template).encode_turns(CONVERSATION[1:3])
    assert tokenizer.decode(ids) == "[user] count from golf\n[assistant] golf hotel\n"
    assert trained_text(tokenizer, ids, labels) == "golf hotel\n"


def test_template_that_rewrites_history_is_refused(tokenizer):
    # Renders only the last message: each prefix is not a prefix of the next render.
    template = "{{ messages[-1]['content'] }}"
    with pytest.raises(TemplateError, match="data.chat_template"):
        ChatEncoder(tokenizer, chat_template=template).encode_turns(CONVERSATION[1:3])


def test_text_gets_bos_and_eos_and_all_labels(tokenizer):
    ids, labels = ChatEncoder(tokenizer).encode_text("alpha bravo")
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert labels == ids


def test_chatml_without_jinja_cuts_every_conversation_as_the_template_does(tokenizer):
    """The string-built ChatML segments are the Jinja ones, text and training flags alike, for any turns."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    roles = st.sampled_from(["system", "user", "assistant", "tool"])
    text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
    # Opening with a system or user turn: the Jinja path cannot cut before an opening assistant turn (an empty
    # conversation does not render), where the string-built one can.
    opening = st.builds(Turn, st.sampled_from(["system", "user"]), text)
    conversations = st.tuples(opening, st.lists(st.builds(Turn, roles, text), max_size=5)).map(lambda c: [c[0], *c[1]])

    @settings(max_examples=200, deadline=None)
    @given(conversations, st.booleans())
    def same(turns, completions_only):
        encoder = ChatEncoder(tokenizer, completions_only=completions_only)
        assert encoder.chatml
        assert encoder.segments(turns) == [s for s in encoder.jinja_segments(turns) if s[0]]

    same()


def test_many_rows_tokenized_at_once_equal_each_row_alone(tokenizer):
    encoder = ChatEncoder(tokenizer)
    rows = [(encoder.segments(CONVERSATION[: k + 1]), False) for k in range(len(CONVERSATION))] + [
        (encoder.text_segments("golf hotel india"), True)
    ]
    alone = [encoder.encode_turns(CONVERSATION[: k + 1]) for k in range(len(CONVERSATION))]
    alone.append(encoder.encode_text("golf hotel india"))
    assert encoder.encode_many(rows) == alone
    assert encoder.encode_many([]) == []


def test_the_batched_ids_are_the_tokenizers_own_for_each_segment(tokenizer):
    """``encode_many`` asks the Rust core for ids without offsets (``encode_batch_fast``); they must be the
    ids the tokenizer gives each segment when called as a Hugging Face tokenizer."""
    encoder = ChatEncoder(tokenizer)
    segments = encoder.segments(CONVERSATION) + [("  spaced\tout, ünïcode 😀 and <|im_end|> inside\n", True)]
    ((ids, _),) = encoder.encode_many([(segments, False)])
    assert ids == [i for text, _ in segments for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def test_the_actors_tokenizer_is_the_models_without_importing_transformers(tiny):
    """``load_tokenizer`` (each tokenizer actor's) gives what ``AutoTokenizer`` gives, in a process that never
    imports transformers or torch (2.7 s of every actor's start on the H200 host)."""
    import json
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from ray_jobs.data.template import load_tokenizer

    path = str(tiny / "model")
    fast, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(path)
    text = ChatEncoder(auto).segments(CONVERSATION)
    assert ChatEncoder(fast).encode_turns(CONVERSATION) == ChatEncoder(auto).encode_turns(CONVERSATION) and text
    assert (fast.bos_token_id, fast.eos_token_id, fast.pad_token_id) == (auto.bos_token_id, auto.eos_token_id, auto.pad_token_id)
    assert fast.chat_template == auto.chat_template
    code = (
        f"import sys; from ray_jobs.data.template import load_tokenizer; load_tokenizer({path!r}); "
        "print(json.dumps(['torch' in sys.modules, 'transformers' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [False, False]
    # A template other than ChatML renders through transformers, loaded then.
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    assert ChatEncoder(fast, template).encode_turns(CONVERSATION) == ChatEncoder(auto, template).encode_turns(CONVERSATION)
