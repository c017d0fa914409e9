"""Threads and devices (evidentia/runtime.py) and the settings that choose them."""

from __future__ import annotations

import subprocess
import threading
import sys

import pytest

from evidentia import runtime
from evidentia.config import ConfigError, Settings
from tests.utils.gates import slot_held


@pytest.mark.parametrize("cpus, threads", [(1, 1), (2, 1), (3, 1), (4, 2), (8, 4), (16, 4), (64, 4)])
def test_default_threads_leave_room_on_small_machines(cpus, threads):
    assert runtime.default_threads(cpus) == threads


@pytest.mark.parametrize("cpus, threads", [(1, 1), (2, 2), (3, 3), (8, 4), (64, 4)])
def test_batch_commands_use_every_cpu_up_to_four(cpus, threads):
    assert runtime.batch_threads(cpus) == threads


def test_batch_context_uses_every_cpu_unless_threads_are_set(monkeypatch):
    from evidentia.console import Context

    monkeypatch.delenv("EVIDENTIA_THREADS", raising=False)
    monkeypatch.delenv("EVIDENTIA_TORCH_THREADS", raising=False)
    assert Context(batch=True).settings.inference_threads == runtime.batch_threads()
    assert Context().settings.inference_threads == runtime.default_threads()
    monkeypatch.setenv("EVIDENTIA_THREADS", "1")
    assert Context(batch=True).settings.inference_threads == 1  # the user's choice wins


def test_usable_cpus_follow_the_affinity_mask():
    import os

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    assert runtime.usable_cpus() == len(os.sched_getaffinity(0))


def test_no_gpu_is_found_without_importing_torch():
    if runtime.nvidia_device_present():
        pytest.skip("an NVIDIA driver is present: torch is asked")
    code = ("import sys; from evidentia import runtime; "
            "assert runtime.cuda_available() is False; assert 'torch' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_set_torch_threads_never_imports_torch():
    code = ("import sys; from evidentia.runtime import set_torch_threads; set_torch_threads(1); "
            "assert 'torch' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_threads_setting_and_its_old_name():
    assert Settings.from_env({}).threads is None
    assert Settings.from_env({}).inference_threads == runtime.default_threads()
    assert Settings.from_env({"EVIDENTIA_THREADS": "3"}).inference_threads == 3
    assert Settings.from_env({"EVIDENTIA_TORCH_THREADS": "2"}).inference_threads == 2  # still honoured
    both = Settings.from_env({"EVIDENTIA_THREADS": "3", "EVIDENTIA_TORCH_THREADS": "2"})
    assert both.inference_threads == 3 and both.torch_threads == 3
    with pytest.raises(ConfigError, match="EVIDENTIA_THREADS"):
        Settings.from_env({"EVIDENTIA_THREADS": "zero"})


def test_dense_runtime_setting():
    assert Settings.from_env({}).dense_runtime == "auto"
    assert Settings.from_env({"EVIDENTIA_DENSE_RUNTIME": "Torch"}).dense_runtime == "torch"
    with pytest.raises(ConfigError, match="EVIDENTIA_DENSE_RUNTIME must be one of auto, onnx, torch"):
        Settings.from_env({"EVIDENTIA_DENSE_RUNTIME": "tensorrt"})


def test_default_stage_follows_dense_retrieval():
    assert Settings.from_env({}).stage == "hybrid"
    assert Settings.from_env({"EVIDENTIA_DENSE": "off"}).stage == "bm25"
    assert Settings.from_env({"EVIDENTIA_DENSE": "off", "EVIDENTIA_STAGE": "hybrid"}).stage == "hybrid"  # as asked
    assert Settings().stage == "hybrid" and Settings(dense=False).stage == "bm25"
    assert Settings().with_(dense=False).stage == "bm25"
    assert Settings(stage="dense").with_(dense=False).stage == "dense"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_freed_memory_goes_back_to_the_system():
    """What an indexing worker frees stays in its malloc arena until trimmed (the API's
    memory grew by 550 MB over eight large uploads, docs/BENCHMARKS.md section 8as)."""
    script = (
        "import psutil\n"
        "from evidentia.runtime import release_freed_memory\n"
        "rss = lambda: psutil.Process().memory_info().rss / 2**20\n"
        "blocks = [bytes(bytearray(50_000)) for _ in range(4000)]\n"
        "keep = blocks[::20]  # a block kept here and there: the heap cannot shrink from its top\n"
        "del blocks\n"
        "before = rss()\n"
        "print(release_freed_memory(), before - rss())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    released, freed_mb = out.stdout.split()
    assert released == "True" and float(freed_mb) > 100, out.stdout + out.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX modes")
def test_the_data_dir_a_command_makes_is_its_users_alone(tmp_path):
    """Under umask 022 the uploads, the index and the store were readable by every local
    user; a data dir that exists keeps its mode."""
    import os

    from evidentia.samples import write_sample_report

    pdf = write_sample_report(tmp_path / "report.pdf")
    data = tmp_path / "data"
    env = dict(os.environ, EVIDENTIA_DATA_DIR=str(data), EVIDENTIA_DENSE="off", EVIDENTIA_OCR="off")
    exe = [sys.executable, "-c", "import os, sys; os.umask(0o022); sys.argv[0] = 'evidentia'; "
           "from evidentia.cli import main; main()"]
    out = subprocess.run([*exe, "index", str(pdf)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert data.stat().st_mode & 0o777 == 0o700 and len(list(data.rglob("*"))) > 5
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    shared.chmod(0o750)
    env["EVIDENTIA_DATA_DIR"] = str(shared)
    assert subprocess.run([*exe, "index", str(pdf)], env=env, capture_output=True, timeout=120).returncode == 0
    assert shared.stat().st_mode & 0o777 == 0o750


def test_a_call_the_line_would_not_reach_in_time_is_refused_at_once():
    """Calls that waited until their deadline, or took a slot too late to end by it,
    computed answers no client received (bench/bench_overload.py: 1 answered in 30 s)."""
    import threading
    import time

    gate = runtime.ComputeGate(1)
    with gate.enter():
        time.sleep(0.2)  # the usual hold: 0.2 s
    assert 0.15 < gate.hold_s < 0.5
    with slot_held(gate) as release:
        t0 = time.monotonic()
        with pytest.raises(runtime.Overloaded) as refused:
            with gate.enter(deadline=time.monotonic() + 0.3):  # one ahead + its own: 0.4 s
                pass
        # at once: waiting for the deadline would have raised TimeoutError after 0.3 s
        assert time.monotonic() - t0 < 0.25 and refused.value.retry_after_s >= 1
        threading.Timer(0.1, release.set).start()
        with gate.enter(deadline=time.monotonic() + 5) as waited:  # time enough: it waits its turn
            assert waited > 0.05


def test_a_slow_call_does_not_have_every_later_one_refused():
    """The average is measured on the calls that run: a call that finds a free slot runs
    whatever the average says, or one slow call (the first, with cold caches) had every
    later one refused for good, on an idle server."""
    import time

    gate = runtime.ComputeGate(1)
    with gate.enter():
        time.sleep(0.5)
    answered = 0
    for _ in range(5):
        with gate.enter(deadline=time.monotonic() + 0.3):
            time.sleep(0.01)
            answered += 1
    assert answered == 5 and gate.hold_s < 0.25  # measured again, and down


def test_a_call_without_a_deadline_waits_its_turn():
    import threading
    import time

    gate = runtime.ComputeGate(1)
    order = []
    holding = threading.Event()

    def first():
        with gate.enter():
            holding.set()
            time.sleep(0.2)
            order.append("first")

    thread = threading.Thread(target=first)
    thread.start()
    assert holding.wait(5)
    with gate.enter() as waited:
        order.append("second")
    thread.join()
    assert order == ["first", "second"] and waited > 0.1


def test_keyed_locks_hold_one_key_and_leave_the_others_free():
    """A 2,000-page document's index write held one server-wide lock for 4.7 s, and every
    tenant's page reads and verdicts waited on it."""
    from evidentia.runtime import KeyedLocks

    locks = KeyedLocks()
    done: list[str] = []

    def take(key, name):
        with locks(key):
            done.append(name)

    with locks(("acme", "big")):
        other = threading.Thread(target=take, args=(("beta", "report"), "other key"))
        same = threading.Thread(target=take, args=(("acme", "big"), "same key"))
        other.start(), same.start()
        other.join(2.0)
        same.join(0.2)
        assert done == ["other key"] and same.is_alive()  # another key at once; the same one waits
    same.join(2.0)
    assert done == ["other key", "same key"]
    assert len(locks) == 0  # no lock kept for a key nobody holds
