"""The machine a measurement ran on, as the benchmark scripts and ``pyggml info`` name it:
the CPU's model (with its family and model numbers, which tell Zen 3 from Zen 4 where the
name is only "AMD EPYC") and the cores this process may use."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break                               # the first processor's block
                k, _, v = line.partition(":")
                fields[k.strip()] = v.strip()
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
