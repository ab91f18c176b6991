"""What the benchmark scripts share to describe a run: the code measured, the machine and
its filesystem, and a sample's median line and percentiles."""

from __future__ import annotations

import math
import platform
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rate_line(samples: list[float], unit: str = "/s") -> str:
    return (
        f"{statistics.median(samples):,.0f}{unit} (range {min(samples):,.0f}-{max(samples):,.0f})"
    )


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def git_state() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "status",
                "--porcelain",
                "--",
                "catalytic_cassette",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    changed = [line[3:] for line in dirty if line.strip()]
    return head + (f" + uncommitted changes to {', '.join(changed)}" if changed else "")


def filesystem(path: Path) -> str:
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                mount = fields[1]
                if str(path.resolve()).startswith(mount) and len(mount) > len(best):
                    best, kind = mount, f"{fields[2]} on {fields[0]}"
    except OSError:
        pass
    return kind


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"
