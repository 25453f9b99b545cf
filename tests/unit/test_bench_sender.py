"""A benchmark's traffic sender ends with its run, however the run ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ops.bench.ceiling import finish_sender


def test_a_sender_past_its_timeout_is_stopped_before_the_run_fails(tmp_path: Path) -> None:
    sender = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(subprocess.TimeoutExpired):
        finish_sender(sender, tmp_path / "sent.json", timeout_s=0.2)
    assert sender.poll() is not None, "the sender outlived its run"


def test_a_failed_sender_raises_with_its_log(tmp_path: Path) -> None:
    report = tmp_path / "sent.json"
    report.with_suffix(".log").write_text("cannot reach the broker")
    sender = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match="code 3:\ncannot reach the broker"):
        finish_sender(sender, report, timeout_s=30)
