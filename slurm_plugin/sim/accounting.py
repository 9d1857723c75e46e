"""What a simulator run accounts while it runs: GPUs allocated, GPUs' effective work and
busy cores, integrated over fixed bins of the trace's busy window."""

from __future__ import annotations

import numpy as np

from slurm_plugin.sim.cluster import busy_window
from slurm_plugin.sim.traces import Trace

__all__ = ["Utilisation"]


class Utilisation:
    """Integrals per bin of what is held now; the holders change ``now_*`` as jobs start,
    end or change rate, and :meth:`advance` integrates up to each event's time."""

    def __init__(self, trace: Trace, bins: int) -> None:
        self.w0, self.horizon = busy_window(trace)
        self.bins = bins
        self.bin_w = (self.horizon - self.w0) / self.bins
        self.alloc_gpu_s = np.zeros(self.bins)
        """GPU-seconds allocated per bin."""
        self.eff_gpu_s = np.zeros(self.bins)
        """GPU-seconds × progress rate per bin."""
        self.core_s = np.zeros(self.bins)
        self.now_alloc = 0.0
        """GPUs allocated now (a shared GPU once)."""
        self.now_eff = 0.0
        """GPUs allocated now, each times its job's progress rate."""
        self.now_cores = 0.0
        self.last_t = 0.0

    def advance(self, t: float) -> None:
        """Integrate what is held now from the last event up to ``t``."""
        a, b = max(self.last_t, self.w0), min(t, self.horizon)
        if b > a and (self.now_alloc or self.now_cores):
            w = self.bin_w
            i = int((a - self.w0) // w)
            while a < b and i < self.bins:
                edge = min(b, self.w0 + (i + 1) * w)
                d = edge - a
                self.alloc_gpu_s[i] += self.now_alloc * d
                self.eff_gpu_s[i] += self.now_eff * d
                self.core_s[i] += self.now_cores * d
                a = edge
                i += 1
        self.last_t = max(self.last_t, t)

    def edges_s(self) -> np.ndarray:
        return np.linspace(self.w0, self.horizon, self.bins + 1)
