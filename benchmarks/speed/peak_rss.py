"""Peak resident memory of a block of code, for the CPU benchmarks (bench_loss.py, bench_gpu.py)."""

from __future__ import annotations

import threading
import time


class PeakRSS:
    """Samples the process's RSS in a thread (torch kernels release the GIL) and keeps the maximum in ``peak``."""

    def __init__(self, interval: float = 0.001) -> None:
        import psutil

        self._process = psutil.Process()
        self.interval, self.peak, self._stop = interval, self._process.memory_info().rss, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)
