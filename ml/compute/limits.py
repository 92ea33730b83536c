"""What a provider lets its compute node take (docs/adr/0198, 0220): the hours of the day it works, the
longest task it accepts, how many CUDA devices it lends (0: CPU tasks only), how many CPU cores its
training uses and how much memory a task's training state may take. Set in ``[compute]`` and changed
live from the dashboard (``POST /dashboard/limits``, for the running node). A task outside them is
rejected with the reason, as a paused node's are (ADR 0195), rather than left to time out: hours,
length and device when the task is assigned, memory once the dry run has built the model (its
parameter count gives the training state: weights, gradients and two optimizer moments in fp32).
The cores limit is torch's intra-op thread count for the node's process (`apply_cores`).
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import asdict, dataclass

from consensus.task_info import TaskInfo

log = logging.getLogger(__name__)
HOURS = re.compile(r"^(\d{1,2})-(\d{1,2})$")


class LimitsError(ValueError):
    pass


def parse_hours(text: str) -> tuple[int, int] | None:
    """``"22-7"`` (from 22:00 to 07:00 local time, across midnight) as (22, 7); ``""`` is any hour."""
    if text == "":
        return None
    match = HOURS.match(text.strip())
    if not match or not all(0 <= int(h) <= 24 for h in match.groups()) or match[1] == match[2]:
        raise LimitsError(f"hours must be like 22-7 (from 22:00 to 07:00) or empty for any hour, not {text[:20]!r}")
    return int(match[1]) % 24, int(match[2]) % 24


def within(hours: tuple[int, int] | None, hour: int) -> bool:
    if hours is None:
        return True
    start, end = hours
    return start <= hour < end if start < end else hour >= start or hour < end


@dataclass
class Limits:
    hours: str = ""          # local hours when new tasks are taken, "22-7"; "" any
    max_task_s: int = 0      # the longest task taken, by its declared expected_s; 0 any
    cuda_devices: int = -1   # CUDA devices lent: -1 all the node has, 0 none (CPU tasks only)
    cpu_cores: int = 0       # CPU cores (torch threads) the node's training uses; 0 all
    memory_mb: int = 0       # the largest training state (MB) a task may need; 0 any

    def __post_init__(self) -> None:
        if not isinstance(self.hours, str):
            raise LimitsError("hours must be a string like 22-7")
        parse_hours(self.hours)
        if type(self.max_task_s) is not int or self.max_task_s < 0:
            raise LimitsError("max_task_s must be a whole number of seconds, 0 for any")
        if type(self.cuda_devices) is not int or self.cuda_devices < -1:
            raise LimitsError("cuda_devices must be -1 (all), 0 (none) or a count")
        if type(self.cpu_cores) is not int or not 0 <= self.cpu_cores <= MAX_CORES:
            raise LimitsError(f"cpu_cores must be 0 (all) or a count up to {MAX_CORES}")
        if type(self.memory_mb) is not int or self.memory_mb < 0:
            raise LimitsError("memory_mb must be a whole number of megabytes, 0 for any")

    def refusal(self, task: TaskInfo, hour: int) -> str | None:
        """Why a task assigned to this node is outside the limits (the rejection's reason), or None."""
        if not within(parse_hours(self.hours), hour):
            return f"outside its provider's hours {self.hours}"
        expected = task.spec_field("expected_s", 0)
        if self.max_task_s and isinstance(expected, int) and expected > self.max_task_s:
            return f"longer than its provider's limit of {self.max_task_s} s"
        device = task.device or task.spec_field("device")
        if self.cuda_devices == 0 and device == "cuda":
            return "its provider lends no GPU"
        return None

    def memory_refusal(self, params: int) -> str | None:
        """Why a task whose model has ``params`` trainable parameters needs more memory than lent, or None."""
        need = training_state_mb(params)
        if self.memory_mb and need > self.memory_mb:
            return f"needs about {need} MB for its training state; its provider lends {self.memory_mb} MB"
        return None

    def updated(self, changes: object) -> Limits:
        """A copy with ``changes`` (a JSON object of some of the fields) applied; LimitsError if invalid."""
        if not isinstance(changes, dict) or not changes or not set(changes) <= set(asdict(self)):
            raise LimitsError(f"expected an object with some of {', '.join(asdict(self))}")
        return Limits(**{**asdict(self), **changes})

    def to_json(self) -> dict:
        return asdict(self)


MAX_CORES = 4096
STATE_COPIES = 4   # weights, gradients and the optimizer's two moments (Adam), in fp32


def training_state_mb(params: int) -> int:
    """Megabytes of a model's training state: STATE_COPIES fp32 copies of its ``params`` parameters."""
    return -(-params * 4 * STATE_COPIES // (1 << 20))


class LimitsControl:
    """The running node's limits, as the compute role reads them and the dashboard shows and sets them."""

    def __init__(self, config: dict) -> None:
        self.current = Limits(str(config.get("hours", "")), int(config.get("max_task_s", 0)),
                              int(config.get("cuda_devices", -1)), int(config.get("cpu_cores", 0)),
                              int(config.get("memory_mb", 0)))
        self._all_threads: int | None = None   # torch's thread count before a cores limit changed it
        self.apply_cores()

    def refusal(self, task: TaskInfo) -> str | None:
        return self.current.refusal(task, time.localtime().tm_hour)

    def memory_refusal(self, params: int) -> str | None:
        return self.current.memory_refusal(params)

    def apply_cores(self) -> None:
        """Make torch use at most ``cpu_cores`` threads (process-wide: the node's training and audits), or
        as many as before a limit was set."""
        if not self.current.cpu_cores and self._all_threads is None:
            return   # never limited: leave torch as it is (and not imported by a node without tasks yet)
        import torch

        if self._all_threads is None:
            self._all_threads = torch.get_num_threads()
        torch.set_num_threads(self.current.cpu_cores or self._all_threads)

    def set(self, changes: object) -> dict:
        self.current = self.current.updated(changes)
        self.apply_cores()
        log.warning("compute limits set from the dashboard: %s", self.current.to_json())
        return self.current.to_json()

    async def section(self) -> dict:
        return self.current.to_json()
