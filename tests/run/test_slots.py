"""Apply slots (issue 31, item 5 of "Why"; item 3 of "What to build"): the store keeps the cap on applies
at once, a killed holder's slot is freed with its connection, and a wait is said on the terminal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from deep_sleep.run.slots import apply_slot

HOLDER = """
import sys, time
from pathlib import Path
from deep_sleep.run.slots import apply_slot
with apply_slot(sys.argv[1], 1) as slot:
    Path(sys.argv[2]).write_text(str(slot))
    time.sleep(600)
"""


def _try(dsn: str, slots: int, seconds: float) -> int | None:
    """The slot got within ``seconds``, or None (the attempt is abandoned in a thread)."""
    got: list[int] = []
    done = threading.Event()
    release = threading.Event()

    def take():
        with apply_slot(dsn, slots, say_after=3600) as slot:
            got.append(slot)
            done.set()
            release.wait(30)

    t = threading.Thread(target=take, daemon=True)
    t.start()
    done.wait(seconds)
    release.set()
    return got[0] if got else None


def test_a_killed_holders_slot_is_freed_with_its_connection(store, tmp_path):
    script, marker = tmp_path / "hold.py", tmp_path / "holding"
    script.write_text(HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), store.dsn, str(marker)],
                            env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the holder never took its slot"
            time.sleep(0.05)
        assert _try(store.dsn, 1, 0.5) is None  # the one slot is held: the cap holds across processes
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert _try(store.dsn, 1, 15) == 0  # kill -9: no lease outlives the process


def test_two_slots_admit_two_holders_and_the_third_waits(store):
    with apply_slot(store.dsn, 2) as a, apply_slot(store.dsn, 2) as b:
        assert {a, b} == {0, 1}
        assert _try(store.dsn, 2, 0.5) is None
    assert _try(store.dsn, 2, 5) in (0, 1)


def test_a_wait_for_a_slot_is_said_with_the_holders(store, capfd):
    held = threading.Event()
    release = threading.Event()

    def hold():
        with apply_slot(store.dsn, 1):
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert held.wait(10)
    threading.Timer(0.8, release.set).start()
    with apply_slot(store.dsn, 1, say_after=0.2) as slot:
        assert slot == 0
    t.join(10)
    err = capfd.readouterr().err
    assert "waiting 0 s for one of 1 apply slot(s); held by pid " in err or "for one of 1 apply slot(s); held by pid " in err, err
    assert re.search(r"got apply slot 0 after \d+\.\d s", err), err
