"""What each step's record counts of the thread that ran it (``ray_jobs.observe.metrics``)."""

from __future__ import annotations

import resource
import threading
import time

import pytest

from ray_jobs.observe.metrics import StepMeter

linux = pytest.mark.skipif(
    not hasattr(resource, "RUSAGE_THREAD"),
    reason="only Linux counts one thread's context switches (getrusage RUSAGE_THREAD); the job runs on Linux",
)


def close(meter: StepMeter, step: int) -> None:
    meter.end_step(step, tokens=1, processed=1, samples=1, attn_ctx=1)


@linux
def test_a_step_that_waits_counts_each_wait_of_its_own_thread_and_the_next_step_starts_from_none():
    meter = StepMeter()
    for _ in range(20):
        time.sleep(0.001)  # each one blocks the thread: a voluntary switch
    close(meter, 1)
    close(meter, 2)
    waited, quiet = meter.window()["step_timing"]
    assert waited.waits >= 20
    assert quiet.waits < waited.waits, "counted once: the next step starts from its own"


@linux
def test_a_wait_on_another_thread_is_not_the_steps():
    meter = StepMeter()
    other = threading.Thread(target=lambda: [time.sleep(0.001) for _ in range(50)])
    other.start()
    other.join()  # one wait of this thread, however many the other made
    close(meter, 1)
    (step,) = meter.window()["step_timing"]
    assert step.waits < 50


def spin(cpu_s: float) -> None:
    """Burn ``cpu_s`` of this thread's CPU time, however long the host takes to give it."""
    until = time.thread_time() + cpu_s
    while time.thread_time() < until:
        pass


def test_cpu_another_thread_of_the_worker_burns_is_the_steps_process_cpu_and_keeps_the_host_busy():
    meter = StepMeter()
    other = threading.Thread(target=spin, args=(0.2,))
    other.start()
    other.join()
    close(meter, 1)
    (step,) = meter.window()["step_timing"]
    assert step.process_cpu_s >= 0.15, "the process's every thread, counted in 10 ms ticks"
    assert 0 < step.host_busy <= 1


def test_cpu_the_steps_own_thread_burns_is_its_thread_cpu_and_another_threads_is_not():
    meter = StepMeter()
    spin(0.2)
    close(meter, 1)
    other = threading.Thread(target=spin, args=(0.2,))
    other.start()
    other.join()
    close(meter, 2)
    own, beside = meter.window()["step_timing"]
    assert own.thread_cpu_s >= 0.2
    assert beside.thread_cpu_s < 0.1, "the other thread's CPU is the process's, not the step's thread's"
    assert beside.process_cpu_s >= 0.15


def test_a_cpu_step_asks_no_gpu_allocator_for_memory():
    meter = StepMeter()
    close(meter, 1)
    (step,) = meter.window()["step_timing"]
    assert (step.device_allocs, step.alloc_retries) == (0, 0)
