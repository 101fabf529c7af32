"""The per-worker training loop that Ray Train runs on every worker (or a warm worker alone, ``ray_jobs.warm.pool``).

Reads top to bottom: set up (model, LoRA, the strategy, optimizer, schedule, resume), then steps, each
its math (:meth:`_Loop.step`) and its tail (:meth:`_Loop.tail`).
One step = ``grad_accum_steps`` micro-batches from this worker's Ray Data shard, a loss averaged
over the real (label) tokens of all workers, one optimizer step. Every ``log_every`` steps the loop
reports metrics, every ``eval_every`` it evaluates, every ``checkpoint_every`` it checkpoints; all
ranks take the same decisions, so all report the same number of times (``ray_jobs.train.session``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from ray_jobs.chaos import NO_CHAOS, Chaos
from ray_jobs.data.order import ROW_ID, CachedOrder, micro_batches
from ray_jobs.data.packing import shape_multiple
from ray_jobs.observe.collector import Collector
from ray_jobs.observe.metrics import StepMeter, step_counts
from ray_jobs.observe.profile import peak_flops
from ray_jobs.observe.torch_trace import StepTrace
from ray_jobs.train import checkpoint, compile_ahead, kernels, session
from ray_jobs.train import strategy as strategies
from ray_jobs.train.attention_mask import model_inputs
from ray_jobs.train.best import Best, snapshot_of
from ray_jobs.train.checkpoint import TrainState
from ray_jobs.train.evaluation import EvalBatches, evaluate
from ray_jobs.train.memory import MicroBatches, fit_plan, free_step
from ray_jobs.train.model import (
    LoadedBase,
    adapt,
    attention_for,
    autocast,
    checkpoint_activations,
    compile_layers,
    load_base_from,
    set_numerics,
)
from ray_jobs.train.samples import Answers
from ray_jobs.train.schedule import lr_scheduler
from rayft_contract.records import Progress, RunFacts, SetupTimes
from rayft_contract.spec import FineTuneSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """What the driver hands every worker (``train_loop_config={"loop": LoopConfig(...)}``)."""

    spec: FineTuneSpec
    total_steps: int
    """Optimizer steps of the whole run (``train.max_steps``, or counted from the epochs)."""
    start_time: float
    """Driver's ``time.time()`` at job start, for time-to-first-step."""
    identity: checkpoint.RunIdentity
    """Who started the run and from what spec: written into checkpoints, checked on resume."""
    has_eval: bool = False
    order: CachedOrder | None = None
    """Cache mode: the training split and its per-epoch order (``ray_jobs.data.order``). ``None``:
    streaming, from Ray Train's ``train`` shard through a seeded shuffle buffer."""
    eval_split: CachedOrder | None = None
    """Cache mode: the eval split's files, read directly by the workers that can (``ray_jobs.train.evaluation``)."""
    chaos: Chaos = NO_CHAOS
    """Test hooks: injected failures and the slowdowns the diagnosis must name (``ray_jobs.chaos``)."""
    resume_from: Any = None
    """A checkpoint a warm worker wrote (``ray_jobs.train.session.latest_in``): resumed from unless the runner has a
    later one of its own."""
    compiled_ahead: Any = None
    """The ``ObjectRef`` of the kernels being compiled ahead on the worker's node (``ray_jobs.train.compile_ahead``), waited
    for after the base's load; ``None``: nothing compiled ahead."""


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Set up, evaluate the baseline, then steps (the step's math, then its tail: evaluation, checkpoint,
    report), then one closing report."""
    started = time.time()
    loop = _Loop.set_up(config["loop"], started)
    try:
        loop.baseline()
        while not loop.done:
            loss, counts = loop.step()
            loop.tail(loss, counts)
        loop.close()
    finally:  # whatever ended the steps, the collector goes back as it was (ray_jobs.observe.collector)
        loop.meter.close()


@dataclasses.dataclass
class _Loop:
    """One worker's training state between steps. Every rank takes the same decisions, so all report the same
    number of times."""

    cfg: LoopConfig
    rank: int
    world: int
    device: Any
    state: TrainState
    batches: Iterator[dict[str, Any]]
    strategy: strategies.Strategy
    model: Any
    optimizer: Any
    scheduler: Any
    params: list[Any]
    best: Best
    snapshot: Any
    eval_batches: EvalBatches | None
    micro: MicroBatches
    facts: RunFacts
    answers: Answers
    setup: dict[str, float]
    """This worker's :class:`SetupTimes` so far; sent with the first report after setup, then emptied."""
    meter: StepMeter = dataclasses.field(default_factory=StepMeter)
    trace: Any = None
    first_step_s: float | None = None
    writing: threading.Event | None = None
    """Set when the last checkpoint's background write is over (``checkpoint.Pending.written``); rank 0."""
    stopped: bool = False
    """Early stopping: no lower eval loss within ``train.early_stopping_patience`` evaluations."""
    kept_base: LoadedBase | None = None
    """A base to keep in the node's cache (``LoadedBase.keeping``): written after the first step, its line by the last."""

    @classmethod
    def set_up(cls, cfg: LoopConfig, started: float) -> _Loop:
        """Model, kernels, LoRA, the strategy's wrapping, optimizer, schedule and the resume, timed from
        ``started``, when the training function began."""
        import psutil
        import torch

        spec, train, runner = cfg.spec, cfg.spec.train, session.current()  # Ray Train's worker, or a warm one
        rank, world = runner.rank, runner.world
        device = runner.device()
        set_numerics()  # TF32 matmuls; what compile_ahead's copy compiled under
        setup: dict[str, float] = {"worker_start_ts": started, "process_start_ts": psutil.Process().create_time()}
        # The data's position is the checkpoint's JSON (the weights are checked and restored below). A cache
        # this worker can open is read from here on, on a thread, beside the model load (WindowReader);
        # streaming starts at step 1. Pulling the first batch through Ray Data on a thread instead took step
        # 1's data wait from 1.5-2.3 s to 0 in the 2-core demo, but the worker's Ray Data threads then slowed
        # the first steps enough for the healthy-run diagnosis test to report warm-up.
        resumed = runner.resumed(cfg.resume_from)
        state = checkpoint.state_of(resumed) if resumed else TrainState()
        shard = runner.shard("train") if cfg.order is None else None
        multiple = shape_multiple(attention_for(spec, device.type), spec.data.max_seq_len)
        batches = micro_batches(spec, cfg.order, shard, state, device, rank, world, multiple)
        strategy = strategies.for_spec(spec, world)  # everything DDP/FSDP/single-specific goes through it
        cfg.chaos.cap_gpu_memory(device)
        with _timed(setup, "model_load_s"):
            base = (loaded := load_base_from(spec, device, strategy, keep=runner.local_rank == 0)).model
        with _timed(setup, "compile_wait_s"):  # before FP8's and the plan's reads of the free memory the copy holds
            if ahead := compile_ahead.wait(cfg.compiled_ahead):
                log.info("kernels compiled ahead: %s", ahead)
        with _timed(setup, "model_load_s"):
            adapted = adapt(base, spec, device, world)  # kernels, LoRA, FP8: what compile_ahead's first step runs
            model, shape, trainable = adapted.model, adapted.shape, adapted.trainable
            chosen = fit_plan(spec, shape, trainable, device, world)
            if chosen.gradient_checkpointing:
                checkpoint_activations(model)
                shape = dataclasses.replace(shape, gradient_checkpointing=True)
            compiled = compile_layers(model) if spec.model.compile else 0
            model = strategy.wrap(model)
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(params, lr=train.learning_rate, weight_decay=train.weight_decay, fused=True)
            scheduler = lr_scheduler(optimizer, train, cfg.total_steps)
        best, snapshot = Best(train), snapshot_of(strategy, model, rank)  # the lowest eval loss's adapter
        with _timed(setup, "resume_s"):
            if resumed:
                earlier = checkpoint.load(resumed, strategy, model, optimizer, scheduler, cfg.identity)
                best.weights = earlier if rank == 0 else None
                if state.best_step and state.best_step == state.step:  # the weights just restored are the best
                    best.weights = snapshot()
        log.info("rank %d/%d: %d of %d parameters trainable; from step %d", rank, world, trainable, adapted.total, state.step)
        width = shape_multiple(base.config._attn_implementation, spec.data.max_seq_len)
        held_out = runner.shard("eval") if cfg.has_eval else None
        eval_batches = held_out and EvalBatches(held_out, train.micro_batch_size, cfg.eval_split, rank, world, width)
        micro = MicroBatches(train.micro_batch_size, world)
        micro.follow(chosen)
        facts = RunFacts(
            world_size=world,
            trainable_params=trainable,
            model_shape=shape,
            peak_flops=peak_flops(device),
            kernels=kernels.describe(adapted.kernels, spec, compiled, adapted.fp8),
            attention=base.config._attn_implementation,
            quantized_base=loaded.quantized_line(),
            micro_batch=micro.describe(),
            worker=runner.describe() + loaded.held_line(micro.running),
            **strategies.describe(model, strategy),
        )
        model.train()
        answers = Answers(spec, strategy, model, device, rank, eval_batches)
        return cls(
            cfg, rank, world, device, state, batches, strategy, model, optimizer, scheduler, params, best, snapshot,
            eval_batches, micro, facts, answers, setup, StepMeter(device), kept_base=loaded if loaded.keeping else None,
        )  # fmt: skip

    @property
    def done(self) -> bool:
        return self.state.step >= self.cfg.total_steps or self.stopped

    def baseline(self) -> None:
        """A fresh run's eval loss before any training: what the run is judged against."""
        if self.cfg.has_eval and self.state.step == 0:
            with _timed(self.setup, "first_eval_s"):
                result = evaluate(self.model, self.eval_batches, self.cfg.spec, self.device)
                report = Progress(
                    0,
                    self.cfg.total_steps,
                    eval_loss=result.loss,
                    eval_token_accuracy=result.token_accuracy,
                    facts=self.facts,
                    eval_samples=self.answers.take(),
                )
                session.current().report(report.to_dict())
        collector = Collector.for_steps()  # the start-up frozen: no full collection walks it inside a step
        self.setup["loop_start_ts"] = time.time()  # setup goes out with the first step's report
        self.meter = StepMeter(self.device, collector)
        self.trace = StepTrace.from_env(self.rank, self.cfg.spec.run_dir)  # torch.profiler on a window of steps, if asked

    def step(self) -> tuple[float, Any]:
        """One optimizer step over ``grad_accum_steps`` micro-batches; the loss averaged over every worker's label
        tokens, and this step's counts summed over workers."""
        import torch

        cfg, spec, state, meter, chaos = self.cfg, self.cfg.spec, self.state, self.meter, self.cfg.chaos
        self.trace.before_step(state.step + 1)
        with meter.phase("data_wait"):
            group = [next(self.batches) for _ in range(spec.grad_accum_steps)]
        chaos.rows_seen(state.step + 1, self.rank, spec.run_dir, [b.pop(ROW_ID, None) for b in group])
        counts = step_counts(group)  # [label tokens, real tokens, examples, processed tokens, attention context]
        with meter.phase("h2d", gpu=True):
            group = [{k: v.to(self.device, non_blocking=True) for k, v in b.items()} for b in group]
            summed = strategies.all_reduce(counts.to(self.device))
            # HF's loss: the sum over tokens / this = the global mean. Made on the device, once: a copy from the host
            # inside the micro-batches waits for the GPU to finish everything queued, each micro-batch.
            tokens_per_rank = summed[0].clamp(min=1) / self.world
            counts = summed.cpu()
        with meter.phase("forward_backward", gpu=True):
            while True:
                try:
                    pieces = self.micro.pieces(group)
                    loss_sum = _forward_backward(self.model, self.strategy, pieces, spec, self.device, tokens_per_rank, chaos)
                    break
                except torch.OutOfMemoryError as oom:  # once, alone: halve the micro-batch (ray_jobs.train.memory)
                    free = functools.partial(free_step, oom, self.optimizer, self.device)
                    self.micro.back_off(oom, state.step + 1, free=free)
                    self.facts = dataclasses.replace(self.facts, micro_batch=self.micro.describe())
            chaos.slow_step(state.step + 1)
        with meter.phase("optimizer", gpu=True):
            self.strategy.step(self.optimizer, self.scheduler, self.params, spec.train.max_grad_norm)
            loss = float(strategies.all_reduce(loss_sum) / self.world)
        state.step += 1
        state.tokens += int(counts[1])
        state.samples += int(counts[2])
        if self.first_step_s is None:
            self.first_step_s = time.time() - cfg.start_time
        chaos.maybe_fail(state.step, self.rank, self.world, spec.run_dir)
        return loss, counts

    def tail(self, loss: float, counts: Any) -> None:
        """After a step: evaluate, checkpoint and report when they are due, then close the step's record."""
        cfg, train, state, meter = self.cfg, self.cfg.spec.train, self.state, self.meter
        at_end = state.step == cfg.total_steps
        found: dict[str, Any] = {}
        if cfg.has_eval and ((train.eval_every and state.step % train.eval_every == 0) or at_end):
            with meter.phase("eval"):
                result = evaluate(self.model, self.eval_batches, cfg.spec, self.device)
                eval_loss = cfg.chaos.eval_loss(state.step, result.loss)
                accuracy = cfg.chaos.eval_token_accuracy(state.step, result.token_accuracy)
                self.stopped = self.best.judge(state, eval_loss, accuracy, self.snapshot) and not at_end  # early stopping
                found.update(eval_loss=eval_loss, eval_token_accuracy=accuracy, eval_samples=self.answers.take())
        last = at_end or self.stopped
        ckpt = None
        saving = state.step % train.checkpoint_every == 0 or last  # on every rank; rank 0 alone gets ``ckpt``
        if saving:
            self._await_write()  # one checkpoint in flight at a time
            with meter.phase("checkpoint"):
                best = self.best.for_checkpoint(state)
                chaos = functools.partial(cfg.chaos.checkpoint_write, run_dir=cfg.spec.run_dir)
                ckpt = checkpoint.take(
                    self.strategy, self.model, self.optimizer, self.scheduler, state, cfg.identity, best, chaos
                )
        if last and cfg.has_eval:
            found.update(self.best.describe(state, self.stopped))
        reporting = state.step % train.log_every == 0 or last or found or saving
        if reporting and ckpt is None:
            self._await_write()  # Ray Train keeps reports in order: this one would wait for the write anyway
        if (kept := self.kept_base) is not None:  # its write starts after the first step; the summary says if it was kept
            kept.keeping.start()
            if kept.keeping.done() or last:
                with meter.phase("base_keep_wait"):
                    self.facts = dataclasses.replace(self.facts, quantized_base=kept.quantized_line(wait=True))
                self.kept_base = None
        with meter.phase("report"):
            if reporting:
                progress = Progress(
                    step=state.step,
                    total_steps=cfg.total_steps,
                    epoch=state.epoch,
                    loss=loss,
                    learning_rate=self.scheduler.get_last_lr()[0],
                    tokens=state.tokens,
                    samples=state.samples,
                    time_to_first_step_s=self.first_step_s,
                    checkpoint=ckpt is not None,
                    facts=self.facts,
                    setup=self._take_setup(),
                    **self._memory(),
                    **found,
                    **meter.window(),
                )
                if ckpt is None:  # SYNC: returns once the controller took the previous report; a crash loses this one
                    session.current().report(progress.to_dict())
                else:  # ASYNC (checkpoint.Pending.report): the next report or checkpoint waits for the write
                    self.writing = ckpt.report(progress.to_dict())
        with meter.phase("profiler"):
            self.trace.after_step(state.step)
        meter.end_step(
            state.step, tokens=int(counts[1]), processed=int(counts[3]), samples=int(counts[2]), attn_ctx=int(counts[4])
        )

    def close(self) -> None:
        """The last step's record (its report included) goes out with one closing report on every rank."""
        getattr(self.batches, "close", lambda: None)()  # the cache reader's thread ends with it (WindowReader)
        last = Progress(self.state.step, self.cfg.total_steps, final=True, worker_end_ts=time.time(), **self.meter.window())
        session.current().report(last.to_dict())
        self.trace.finish()

    def _await_write(self) -> None:
        """Wait for the checkpoint still being written, if any (this step's ``checkpoint_wait``)."""
        if self.writing is not None:
            with self.meter.phase("checkpoint_wait"):
                self.writing.wait()
            self.writing = None

    def _take_setup(self) -> SetupTimes | None:
        setup, self.setup = self.setup, {}
        return SetupTimes(**setup) if setup else None

    def _memory(self) -> dict[str, float]:
        import torch

        if self.device.type != "cuda":
            return {}
        return {
            "gpu_mem_peak_gb": torch.cuda.max_memory_allocated(self.device) / 2**30,
            "gpu_mem_total_gb": torch.cuda.get_device_properties(self.device).total_memory / 2**30,
        }


def _forward_backward(
    model: Any, strategy: Any, pieces: list[dict[str, Any]], spec: FineTuneSpec, device: Any, tokens_per_rank: Any, chaos: Chaos
) -> Any:
    """Forward and backward over one step's micro-batches, gradients synchronized on the last; the summed loss.
    ``tokens_per_rank`` is on ``device`` already, so nothing of the job's here waits for the GPU: the host queues the
    next micro-batch's forward while the GPU runs this one's backward, and a pause of the host's is absorbed by the
    queue instead of idling the GPU. The loss runs Liger's fused kernels without Liger's own three waits a micro-batch
    (``ray_jobs.train.fused_loss``). Flex attention's mask is made here, not by transformers, whose own asks the host
    whether the rows are packed (``ray_jobs.train.attention_mask``). ``tests/gpu/test_step_syncs.py`` allows no wait."""
    import torch

    attention = attention_for(spec, device.type)
    loss_sum = torch.zeros((), device=device)
    for i, batch in enumerate(pieces):
        chaos.check_memory(len(batch["num_tokens"]))
        with strategy.grad_sync(model, enabled=i == len(pieces) - 1), autocast(spec, device):
            out = model(**model_inputs(batch, attention), num_items_in_batch=tokens_per_rank, use_cache=False)
        strategy.backward(out.loss)
        loss_sum += out.loss.detach()
    return loss_sum


@contextlib.contextmanager
def _timed(into: dict[str, float], key: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        into[key] = into.get(key, 0.0) + time.perf_counter() - t0
