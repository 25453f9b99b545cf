"""`ops.process.interrupt_on_sigterm`: a command stopped with SIGTERM runs its `finally` blocks, as on Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHILD = """
import sys, time
from pathlib import Path
from ops.process import interrupt_on_sigterm
if sys.argv[2] == "on":
    interrupt_on_sigterm()
marker = Path(sys.argv[1])
try:
    marker.write_text("started")
    time.sleep(60)
finally:
    marker.write_text("cleaned up")
"""


def _stopped_with_sigterm(tmp_path: Path, handler: str) -> tuple[str, int]:
    marker = tmp_path / "marker"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(marker), handler], cwd=Path(__file__).parents[2])
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text() == "started"):
        assert time.monotonic() < deadline, "the child did not start"
        assert child.poll() is None, "the child ended early"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    code = child.wait(timeout=30)
    return marker.read_text(), code


@pytest.mark.parametrize(("handler", "expected"), [("on", "cleaned up"), ("off", "started")])
def test_sigterm_runs_the_commands_finally_blocks_only_with_the_handler(
    tmp_path: Path, handler: str, expected: str
) -> None:
    """Without the handler Python ends at once and leaves what it started (the `off` case shows the test can
    tell the difference)."""
    text, code = _stopped_with_sigterm(tmp_path, handler)
    assert text == expected
    assert code != 0
