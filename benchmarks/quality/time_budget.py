"""A training that fits a wall-time budget: transformers' linear learning-rate schedule whose length is planned from
the first timed steps, and a trainer callback that plans it, then stops at the schedule's end, at a given step, or
before the deadline. ``scale_run.py`` trains both of its models under it."""

from __future__ import annotations

import statistics
import time

__all__ = ["LinearSchedule", "guard_callback", "planned_total"]


class LinearSchedule:
    """transformers' linear schedule (warm-up from 0, then a linear decay to 0 at ``total``) with ``total`` open to
    change: (d) plans it once its steps are timed. Changed during the warm-up, which does not depend on ``total``,
    it gives every step the learning rate it would have had with that ``total`` from the start."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup, self.total = warmup, total

    def factor(self, step: int) -> float:
        if step < self.warmup:
            return step / max(1, self.warmup)
        return max(0.0, (self.total - step) / max(1, self.total - self.warmup))


def planned_total(step: int, seconds_left: float, step_s: float, cap: int, margin: float = 0.9) -> int:
    """The schedule's length once ``step`` steps are done: the steps that fit in ``seconds_left`` at ``step_s`` a
    step (with a margin for slower steps later), at most ``cap``, never fewer than those done."""
    fit = step + int(margin * max(0.0, seconds_left) / step_s) if step_s > 0 else cap
    return max(step, min(cap, fit))


def guard_callback(deadline_from, stop_at: int | None, stop_reason: str, schedule: LinearSchedule, plan_at: int | None):
    """The trainer callback that times the steps, plans ``schedule``'s length at step ``plan_at`` and stops the
    training at the schedule's end, at ``stop_at`` or before the deadline (see :func:`train_one`)."""
    from transformers import TrainerCallback

    class Guard(TrainerCallback):
        def __init__(self) -> None:
            self.first_step_at: float | None = None
            self.deadline = float("inf")
            self.step_times: list[float] = []
            self.last = None
            self.stopped_by = "the schedule's end"  # until another stop; also the trainer's own max_steps
            self.plan: dict | None = None

        def on_step_begin(self, args, state, control, **kwargs):
            now = time.monotonic()
            if self.first_step_at is None:
                self.first_step_at, self.deadline = now, deadline_from(now)
            self.last = now

        def on_step_end(self, args, state, control, **kwargs):
            now = time.monotonic()
            self.step_times.append(now - self.last)
            # the first step carries one-off costs (CUDA context, kernel choice): later steps predict the next
            recent = self.step_times[1:][-20:] or self.step_times
            if plan_at is not None and state.global_step == plan_at:
                step_s = statistics.median(recent)
                cap = schedule.total
                schedule.total = planned_total(state.global_step, self.deadline - now, step_s, cap)
                self.plan = {
                    "at_step": plan_at,
                    "step_s": round(step_s, 4),
                    "seconds_left": round(self.deadline - now, 1),
                    "cap": cap,
                    "total": schedule.total,
                }
            if state.global_step >= schedule.total:
                control.should_training_stop, self.stopped_by = True, "the schedule's end"
            elif stop_at is not None and state.global_step >= stop_at:
                control.should_training_stop, self.stopped_by = True, f"{stop_reason} ({stop_at})"
            elif now + statistics.median(recent) > self.deadline:
                control.should_training_stop, self.stopped_by = True, "its wall-time share"

    return Guard()
