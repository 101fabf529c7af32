"""Where a job's time goes: per-step timing (``metrics``), the phase table and MFU (``profile``), the bottleneck
rules (``diagnosis``), ``report.png`` (``visuals``), live trackers (``tracking``) and the optional torch.profiler
window (``torch_trace``).

Imports only the job's shared modules: the loop and the driver call it, it calls neither.
"""
