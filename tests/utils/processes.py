"""Helpers for tests that watch child processes."""

import psutil


def running(pid: int) -> bool:
    """The process exists and is not a zombie (it may exit between the two questions)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
