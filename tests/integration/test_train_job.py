"""The training job end to end on a local Ray cluster, a tiny random Llama.

Each test runs a real Ray Data pipeline into real training: Ray Train's TorchTrainer over 2 CPU workers (gloo) where
the test is about several workers (DDP, FSDP, a rank that fails, Ray Train's storage), else one worker on its own
worker started at the connect (``ray_jobs.warm.early``, as a one-GPU job runs), at about half the cost on 2 cores
(bench/cpu_job_start.py). The session starts one cluster (``ray_cluster``); a run takes 15-90 s on 2 cores, mostly
worker start-up.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from ray_jobs.chaos import Chaos
from ray_jobs.run import run
from ray_jobs.tiny import write_dataset
from rayft.cli import main
from rayft_contract.phases import Phase
from rayft_contract.records import JobSummary, Progress

pytestmark = pytest.mark.integration


def with_train(spec, **changes):
    return spec.replace(train=dataclasses.replace(spec.train, **changes))


def one_worker(spec):
    return spec.replace(scaling=dataclasses.replace(spec.scaling, num_workers=1))


def heldout_loss(model, tokenizer, rows):
    """Mean answer-token loss of a model on chat rows (prompt masked), for before/after comparisons."""
    import torch

    from ray_jobs.data.formats import to_turns
    from ray_jobs.data.template import ChatEncoder

    encoder = ChatEncoder(tokenizer)
    losses = []
    for row in rows:
        ids, labels = encoder.encode_turns(to_turns(row, "chat"))
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels]))
        losses.append(float(out.loss))
    return sum(losses) / len(losses)


def test_ddp_two_workers_learn_and_the_adapter_loads(ray_cluster, tiny_spec, tiny, tokenizer, tmp_path, capsys):
    events = []
    result = run(tiny_spec, on_event=events.append)
    summary = result.summary

    assert summary.layout == "ddp"
    # model.kernels: auto, lora.fused: true (the defaults)
    assert (
        summary.kernels
        == "none (Liger's Triton kernels need a CUDA GPU, this worker has cpu); LoRA update inside its matmul (lora.fused)"
    )
    # The cached eval split is read straight from its Parquet files, so the first pass (the baseline) costs
    # about what the later two do from memory; streaming it through Ray Data made it about 25x a later one
    # and the demo's slow_eval. (The first also loads the tokenizer for the samples.)
    phases = summary.timing.phases
    assert phases["first_eval"] < 5 * phases["eval"] / 2, phases
    assert "slow_eval" not in [f.kind for f in summary.diagnosis]
    assert summary.steps == tiny_spec.train.max_steps
    assert summary.eval_loss < 0.5 * summary.initial_eval_loss, summary
    assert 0 <= summary.initial_eval_token_accuracy < summary.eval_token_accuracy <= 1, summary  # it learned the answers
    assert any("vLLM" in note for note in summary.adapter_notes)  # the tiny preset trains embed_tokens and lm_head too
    # At each evaluation (0, 30, 60) rank 0 answered 3 held-out prompts; the answers moved with training.
    lines = [json.loads(x) for x in (result.local_dir / "samples.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 0, 0, 30, 30, 30, 60, 60, 60]
    assert all(x["prompt"].endswith("assistant") and x["reference"] for x in lines), lines[0]
    shown = summary.eval_samples
    assert (shown.first_step, shown.last_step, len(shown.last)) == (0, 60, 3)
    assert [x.answer for x in shown.first] != [x.answer for x in shown.last]
    assert {e.kind for e in events} >= {"phase", "progress", "summary"}
    assert JobSummary.from_dict(json.loads((result.local_dir / "summary.json").read_text())) == summary
    adapter = Path(result.adapter_dir)
    assert (adapter / "adapter_model.safetensors").is_file()
    assert (adapter / "tokenizer.json").is_file()

    import random

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from ray_jobs.tiny import example

    rng = random.Random(1234)
    rows = [example(rng) for _ in range(16)]
    base = AutoModelForCausalLM.from_pretrained(tiny / "model")
    base_loss = heldout_loss(base, tokenizer, rows)
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny / "model"), adapter)
    tuned_loss = heldout_loss(tuned, tokenizer, rows)
    assert tuned_loss < 0.5 * base_loss, (base_loss, tuned_loss)

    # `rayft merge` folds the adapter into the base: same outputs as base + adapter, no PEFT needed.
    merged_dir = tmp_path / "merged"
    assert main(["merge", str(adapter), "--out", str(merged_dir)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert heldout_loss(merged, tokenizer, rows) == pytest.approx(tuned_loss, rel=1e-4)

    # `rayft generate RUN` answers with base + adapter: the greedy answer of the tuned model, not the base's.
    from ray_jobs.generate import answer, prompt_ids
    from ray_jobs.tiny import SYSTEM

    question = rows[0]["messages"][1]["content"]
    capsys.readouterr()
    assert main(["generate", str(result.local_dir), "--prompt", question, "--system", SYSTEM]) == 0
    printed = capsys.readouterr().out.strip()
    ids = prompt_ids(tokenizer, question, SYSTEM)
    assert printed == answer(tuned.eval(), tokenizer, ids) != answer(base.eval(), tokenizer, ids), printed


def test_qlora_nf4_runs_on_the_cpu_backend_and_the_next_job_reads_the_base_it_kept_and_trains_the_same(
    ray_cluster, tiny_spec, tmp_path
):
    base = tmp_path / "base"  # a base of this test's own, so that its cache entry is too
    shutil.copytree(tiny_spec.model.path, base)
    spec = with_train(one_worker(tiny_spec), max_steps=12, eval_every=None, checkpoint_every=12, log_every=4)
    spec = spec.replace(
        name="tiny-qlora",
        quantization=dataclasses.replace(spec.quantization, mode="nf4", cache=True),
        model=dataclasses.replace(spec.model, path=str(base), dtype="bfloat16"),
    )
    summary = run(spec).summary
    assert re.search(r", its base loaded before the job \(\d+\.\d s\)$", summary.worker), "NF4 loaded by the early worker"
    assert summary.quantized_layers > 0  # Linear4bit modules under the LoRA layers
    assert summary.eval_loss < summary.initial_eval_loss - 0.5, summary
    assert summary.quantized_base.startswith("quantized, then kept in the node's cache ("), summary.quantized_base

    again = run(spec.replace(name="tiny-qlora-again")).summary
    assert again.quantized_base == "read quantized from the node's cache"
    assert (again.final_loss, again.eval_loss) == (summary.final_loss, summary.eval_loss)


def test_a_step_out_of_memory_halves_the_micro_batch_once_and_the_job_trains_on(ray_cluster, tiny_spec):
    spec = with_train(tiny_spec, max_steps=20, micro_batch_size=4, global_batch_size=8, eval_every=None, log_every=5)
    spec = one_worker(spec).replace(name="tiny-oom")
    summary = run(spec, chaos=Chaos(oom_above_rows=2)).summary  # a micro-batch of 4 rows "does not fit"

    assert summary.micro_batch == "2 (step 1 ran out of GPU memory at micro-batch 4: halved, global batch unchanged)"
    assert summary.restarts == 0, "backed off in place, no Ray Train restart"
    assert summary.steps == 20 and summary.samples > 0
    assert summary.eval_loss < 0.7 * summary.initial_eval_loss, summary


def test_early_stopping_ends_a_job_whose_eval_loss_stopped_falling_and_exports_the_best_adapter(ray_cluster, tiny_spec):
    from safetensors.torch import load_file

    spec = with_train(
        one_worker(tiny_spec), max_steps=60, eval_every=5, log_every=5, checkpoint_every=30, early_stopping_patience=2
    )
    spec = spec.replace(name="tiny-early-stop")
    result = run(spec, chaos=Chaos(overfit_after_step=10))  # every eval after step 10 reads worse
    summary = result.summary

    assert summary.best_step in (5, 10) and summary.steps == summary.best_step + 10 < 60, summary
    assert summary.stopped_early == f"no lower eval loss in 2 evaluations since step {summary.best_step}"
    assert summary.best_eval_loss < summary.eval_loss
    best, last = (result.local_dir / name for name in ("adapter", "last_adapter"))
    for adapter in (best, last):
        assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == spec.model.path
    best_weights, last_weights = (load_file(str(a / "adapter_model.safetensors")) for a in (best, last))
    assert best_weights.keys() == last_weights.keys()
    assert any(not (best_weights[k] == last_weights[k]).all() for k in best_weights), "the best is not the last"


def test_stopping_by_token_accuracy_with_the_last_adapter_exported_and_the_specs_own_prompts_answered(ray_cluster, tiny_spec):
    from safetensors.torch import load_file

    spec = with_train(
        one_worker(tiny_spec),
        max_steps=60,
        eval_every=5,
        log_every=5,
        checkpoint_every=30,
        early_stopping_patience=2,
        early_stopping_metric="eval_token_accuracy",
        eval_samples=1,
        sample_prompts=("count to three",),
    )
    spec = spec.replace(name="tiny-accuracy-stop", output=dataclasses.replace(spec.output, adapter="last"))
    result = run(spec, chaos=Chaos(overfit_after_step=10))  # every eval after step 10 reads less accurate
    summary = result.summary

    assert summary.best_step in (5, 10) and summary.steps == summary.best_step + 10 < 60, summary
    assert summary.stopped_early == f"no higher eval token accuracy in 2 evaluations since step {summary.best_step}"
    assert summary.adapter_step == summary.steps, "output.adapter: last"
    last, best = (result.local_dir / name for name in ("adapter", "best_adapter"))
    assert not (result.local_dir / "last_adapter").exists()
    last_weights, best_weights = (load_file(str(a / "adapter_model.safetensors")) for a in (last, best))
    assert any(not (best_weights[k] == last_weights[k]).all() for k in best_weights), "the best is kept beside the last"
    lines = [json.loads(x) for x in (result.local_dir / "samples.jsonl").read_text().splitlines()]
    own = [x for x in lines if "count to three" in x["prompt"]]
    assert [x["step"] for x in own] == list(range(0, summary.steps + 1, 5)), "answered at every evaluation"
    assert all(x["reference"] == "" and isinstance(x["answer"], str) for x in own)


def test_a_failed_checkpoint_write_and_a_failed_worker_each_resume_from_the_last_persisted_checkpoint(ray_cluster, tiny_spec):
    """Checkpoints every 4 steps, each written beside training (issue 12) and 1.5 s slow (a slow store). The
    write of step 8's checkpoint fails: the worker fails, and Ray Train resumes from step 4's. Then rank 1
    dies after step 10: the group resumes from step 8's, written this time, and finishes. The steps that
    take checkpoints spend only the copy; the next report waits for the write in a phase of its own."""
    delay = 1.5
    spec = with_train(tiny_spec, max_steps=14, checkpoint_every=4, log_every=1, eval_every=None, max_failures=2)
    spec = spec.replace(name="tiny-chaos", data=dataclasses.replace(spec.data, val_fraction=0.0))
    events = []
    chaos = Chaos(checkpoint_delay_s=delay, checkpoint_write_fails_at_step=8, fail_at_step=10)
    summary = run(spec, on_event=events.append, chaos=chaos).summary

    kinds = [e.kind for e in events]
    assert summary.restarts == 2 and kinds.count("failure") == 2
    cuts = [i for i, kind in enumerate(kinds) if kind == "failure"]
    assert "injected failure writing the checkpoint of step 8" in json.dumps(events[cuts[0]].data)
    assert "injected failure at step 10 on rank 1" in json.dumps(events[cuts[1]].data)
    segments = [events[: cuts[0]], events[cuts[0] : cuts[1]], events[cuts[1] :]]
    progress = [[e.data for e in seg if e.kind == "progress"] for seg in segments]
    saved = [[p["step"] for p in seg if p.get("checkpoint")] for seg in progress]
    assert saved == [[4], [8], [12, 14]], "step 8's first write failed, so its report never went out"
    assert [p["step"] for p in progress[0]] == list(range(1, 8)), "step 9's report waited for step 8's write"
    assert [p["step"] for p in progress[1]] == list(range(5, 10)), "resumed from step 4's checkpoint"
    assert [p["step"] for p in progress[2]] == list(range(9, 15)), "resumed from step 8's checkpoint"
    assert summary.steps == 14
    # Six writes of 1.5 s each: none of it in the step that took one, nor hidden in a report; the report after
    # a save waits for it (checkpoint_wait) unless its own step took the whole 1.5 s, which the tiny model's
    # steps (tenths of a second on 2 busy cores) never do. Read step by step: the report phase summed over the
    # run's reports is a measure of the machine's speed (it reached 1.56 s on 2 busy cores), one write is not.
    records = [r for e in events if e.kind == "progress" for r in Progress.from_dict(e.data).step_timing]
    assert {r.step for r in records} == set(range(1, 14)), "all but the last, which the closing report keeps for the profile"
    assert max(r.seconds(Phase.CHECKPOINT) for r in records) < delay, records
    assert max(r.seconds(Phase.REPORT) for r in records) < delay, records
    assert sum(r.seconds(Phase.CHECKPOINT_WAIT) for r in records) > 0, records


def test_fsdp_on_two_cpu_workers_with_epochs(ray_cluster, tiny_spec, tmp_path):
    data = write_dataset(tmp_path / "small.jsonl", rows=300, seed=7)
    spec = with_train(tiny_spec, max_steps=None, epochs=1, log_every=2, eval_every=None, checkpoint_every=100)
    spec = spec.replace(
        name="tiny-fsdp",
        data=dataclasses.replace(spec.data, path=str(data)),
        scaling=dataclasses.replace(spec.scaling, strategy="fsdp"),
    )
    summary = run(spec).summary
    assert summary.layout == "fsdp"
    assert summary.steps > 3  # counted from one pass over the packed data
    assert summary.eval_loss < summary.initial_eval_loss, summary
    assert (tmp_path / "runs" / "tiny-fsdp" / "adapter" / "adapter_model.safetensors").is_file()


def test_output_to_s3(ray_cluster, s3_server, tiny_spec):
    """output.dir on S3: checkpoints (Ray Train storage), adapter, summary and metrics all land in the bucket,
    and metrics.jsonl is there while the job runs, as of its last checkpoint."""
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="rayft-runs")
    spec = with_train(tiny_spec, max_steps=6, eval_every=None, checkpoint_every=3, log_every=3)
    spec = spec.replace(
        name="tiny-s3",
        output=dataclasses.replace(spec.output, dir="s3://rayft-runs/team-a"),
        data=dataclasses.replace(spec.data, val_fraction=0.0),
    )
    live = {}

    def at_checkpoint(event):
        if event.kind == "progress" and event.data.get("checkpoint") and event.data["step"] == 3:
            body = s3.get_object(Bucket="rayft-runs", Key="team-a/tiny-s3/metrics.jsonl")["Body"].read().decode()
            live["steps"] = [json.loads(line).get("step") for line in body.splitlines()]

    result = run(spec, on_event=at_checkpoint)

    assert 3 in live["steps"], "metrics.jsonl in the bucket had the step-3 report while the job ran"
    assert result.adapter_dir == "s3://rayft-runs/team-a/tiny-s3/adapter"
    assert result.local_dir is None, "the local staging copy of an s3:// run is removed once uploaded"
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="rayft-runs", Prefix="team-a/tiny-s3/")["Contents"]}
    for name in (
        "adapter/adapter_model.safetensors",
        "adapter/adapter_config.json",
        "adapter/tokenizer.json",
        "summary.json",
        "metrics.jsonl",
    ):
        assert f"team-a/tiny-s3/{name}" in keys
    assert any(k.startswith("team-a/tiny-s3/tiny-s3/checkpoint_") and k.endswith("train_state.safetensors") for k in keys)
    summary = JobSummary.from_dict(
        json.loads(s3.get_object(Bucket="rayft-runs", Key="team-a/tiny-s3/summary.json")["Body"].read())
    )
    assert summary.steps == 6


def test_a_run_already_at_its_end_fails_with_the_reason_and_overwrite_starts_over(ray_cluster, tiny_spec):
    """Issue 11: a re-run that resumed past max_steps trained 0 steps and called itself SUCCEEDED."""
    from ray_jobs.run import NothingTrained

    spec = with_train(tiny_spec, max_steps=4, checkpoint_every=4, log_every=2, eval_every=None)
    spec = one_worker(spec)  # the driver's decision: one worker will do
    first = run(spec)
    (Path(first.run_dir) / "summary.json").unlink()  # as if the job died after its last checkpoint
    with pytest.raises(NothingTrained, match="trained 0 steps of 4: its checkpoint is already at step 4"):
        run(spec)
    again = run(spec, overwrite=True)  # starts over: every step trained again, from step 1
    assert again.summary.steps == 4 and again.summary.reported_steps[0] == 2


def write_sorted_halves(path: Path, rows: int) -> Path:
    """A dataset sorted into two very different halves: one word repeated (learnt in a few steps, then a
    low loss), then random words (a high loss whatever the model learns, higher still for a model that
    learnt to repeat)."""
    import random

    from ray_jobs.tiny import SYSTEM, WORDS

    rng = random.Random(3)
    with path.open("w") as out:
        for i in range(rows):
            n = rng.randint(4, 8)
            if i < rows // 2:
                prompt, answer = "repeat alpha", ["alpha"] * n
            else:
                prompt, answer = f"say {n} random words", rng.choices(WORDS, k=n)
            turns = [("system", SYSTEM), ("user", prompt), ("assistant", " ".join(answer))]
            out.write(json.dumps({"messages": [{"role": r, "content": c} for r, c in turns]}) + "\n")
    return path


def rows_seen(run_dir: Path) -> dict[int, list[dict]]:
    """rank -> the ``{"step", "rows"}`` records it wrote, in order (``Chaos(record_rows=True)``)."""
    return {
        int(f.stem.removeprefix("rank")): [json.loads(line) for line in f.read_text().splitlines()]
        for f in sorted((run_dir / "rows-seen").glob("rank*.jsonl"))
    }


def biggest_rise(losses: list[float]) -> float:
    """The largest ratio of a step's loss to the lowest loss before it (after 4 warm-up steps)."""
    return max(losses[s] / min(losses[:s]) for s in range(4, len(losses)))


def test_shuffled_epochs_mix_sorted_halves_differ_per_epoch_and_resume_in_the_same_order(ray_cluster, tiny_spec, tmp_path):
    """Issue 11. A dataset sorted into two halves, 2 epochs, shuffled (the default), a worker killed in
    the second epoch: the loss never jumps, each epoch trains every row once in its own order, and the
    steps re-run after the resume saw exactly the rows they saw the first time."""
    data = write_sorted_halves(tmp_path / "sorted.jsonl", rows=700)
    spec = with_train(tiny_spec, max_steps=None, epochs=2, log_every=1, eval_every=None, checkpoint_every=8)
    spec = spec.replace(name="shuffled", data=dataclasses.replace(spec.data, path=str(data), val_fraction=0.0))
    events = []
    summary = run(spec, on_event=events.append, chaos=Chaos(fail_at_step=36, record_rows=True)).summary
    per_epoch = summary.steps // 2
    assert 18 < per_epoch < 32 and summary.restarts == 1  # the failure (step 36) and the resume (32) in epoch 2

    seen = rows_seen(tmp_path / "runs" / "shuffled")
    for rank, records in seen.items():
        first = {r["step"]: r["rows"] for r in records[: [r["step"] for r in records].index(36) + 1]}
        again = {r["step"]: r["rows"] for r in records[len(first) :]}
        assert sorted(again) == list(range(33, 2 * per_epoch + 1)), rank  # resumed from the step-32 checkpoint
        assert [again[s] for s in range(33, 37)] == [first[s] for s in range(33, 37)], rank  # the same rows again
        seen[rank] = {**first, **again}
    epochs = [
        [i for rank in seen for s in range(1 + e * per_epoch, 1 + (e + 1) * per_epoch) for i in seen[rank][s]] for e in (0, 1)
    ]
    for rows in epochs:  # every row at most once an epoch; the few past the last whole batch differ per epoch
        assert len(set(rows)) == len(rows) == per_epoch * 8
    order = [[i for s in range(1 + e * per_epoch, 1 + (e + 1) * per_epoch) for i in seen[0][s]] for e in (0, 1)]
    assert order[0] != order[1]  # a new order each epoch

    losses = [e.data["loss"] for e in events if e.kind == "progress" and e.data["step"] <= per_epoch]
    assert biggest_rise(losses) < 1.5, losses


def test_with_shuffle_off_a_sorted_dataset_trains_in_its_order_and_the_loss_jumps_where_the_halves_meet(
    ray_cluster, tiny_spec, tmp_path
):
    """The control: ``data.shuffle: false`` (a curriculum) trains the halves one after the other."""
    data = write_sorted_halves(tmp_path / "sorted.jsonl", rows=700)
    spec = with_train(one_worker(tiny_spec), max_steps=None, epochs=1, log_every=1, eval_every=None, checkpoint_every=100)
    spec = spec.replace(name="in-order", data=dataclasses.replace(spec.data, path=str(data), val_fraction=0.0, shuffle=False))
    events = []
    run(spec, on_event=events.append, chaos=Chaos(record_rows=True))
    seen = rows_seen(tmp_path / "runs" / "in-order")
    assert [i for r in seen[0] for i in r["rows"]] == sorted(i for r in seen[0] for i in r["rows"])  # the data's order
    losses = [e.data["loss"] for e in events if e.kind == "progress"]
    assert biggest_rise(losses) > 1.5, losses
