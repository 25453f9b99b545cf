"""Logs of the local stack's children roll over at a size and keep a few old files: a child that writes far more
than the cap leaves at most `1 + backups` files of about the cap each, the newest lines in `NAME.log`."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ops.kafka_service import LocalKafka
from ops.logpipe import RollingFile
from ops.process import ManagedProcess, ServiceError, free_ports
from ops.settings import PROJECT_ROOT, Settings
from tests.conftest import DEPS_DIR

pytestmark = pytest.mark.integration

# 400 lines of 1,000 bytes: 400 kB through a log capped at 50 kB with 2 old files.
WRITER = (
    "import sys\nfor n in range(400):\n    sys.stdout.write(f'{n:06d} ' + 'x' * 992 + '\\n')\n    sys.stdout.flush()\n"
)


def test_a_child_writing_400_kb_leaves_three_files_of_about_50_kb(tmp_path: Path) -> None:
    child = ManagedProcess(
        name="chatty",
        command=[sys.executable, "-c", WRITER],
        run_dir=tmp_path / "run",
        log_dir=tmp_path / "logs",
        log_max_bytes=50_000,
        log_backups=2,
    )
    child.start()
    assert child.popen is not None and child.popen.wait(timeout=60) == 0
    tail = child.log_tail(1)  # waits for the writer to copy the last lines
    assert tail.startswith("000399 ")
    files = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert files == ["chatty.log", "chatty.log.1", "chatty.log.2"]
    for name in files:
        assert (tmp_path / "logs" / name).stat().st_size <= 50_000 + 64 * 1024
    newest_old = (tmp_path / "logs" / "chatty.log.1").read_text().splitlines()
    current = (tmp_path / "logs" / "chatty.log").read_text().splitlines()
    assert int(newest_old[-1][:6]) + 1 == int(current[0][:6]), "no line lost at the roll-over"
    assert child.writer is not None and child.writer.poll() == 0, "the writer ended with the child"
    child.stop()


def test_rolling_keeps_no_more_than_the_backups_asked(tmp_path: Path) -> None:
    log = RollingFile(tmp_path / "a.log", max_bytes=10, backups=1)
    for n in range(5):
        log.write(f"line {n} of the log\n".encode())
    log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.log", "a.log.1"]
    # Each line is longer than the 10 bytes: each write rolls the file that holds one over before it writes.
    assert (tmp_path / "a.log").read_text() == "line 4 of the log\n"
    assert (tmp_path / "a.log.1").read_text() == "line 3 of the log\n"
    with pytest.raises(ValueError):
        RollingFile(tmp_path / "b.log", max_bytes=0, backups=1)


def test_a_write_that_fills_the_file_to_its_size_leaves_it_the_newest_lines(tmp_path: Path) -> None:
    """Lines that fill the file to exactly its size stay in it (the child above writing 50 lines of 1,000 bytes a
    file, each read on its own, once left `chatty.log` empty after its last line); the next line rolls it over."""
    log = RollingFile(tmp_path / "c.log", max_bytes=45, backups=1)
    for n in range(5):
        log.write(f"line {n:03d}\n".encode())  # 9 bytes: 45 in all
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.log"]
    assert (tmp_path / "c.log").read_text().splitlines()[-1] == "line 004"
    log.write(b"line 005\n")
    log.close()
    assert (tmp_path / "c.log").read_text() == "line 005\n"
    assert len((tmp_path / "c.log.1").read_text().splitlines()) == 5


def test_the_stack_passes_its_log_settings_and_kafka_rolls_its_own_log() -> None:
    settings = Settings.from_env({"ADBILL_LOG_MAX_BYTES": "1000", "ADBILL_LOG_BACKUPS": "5"})
    assert (settings.log_max_bytes, settings.log_backups) == (1000, 5)
    with pytest.raises(ValueError):
        Settings.from_env({"ADBILL_LOG_BACKUPS": "-1"})
    config = ET.parse(PROJECT_ROOT / "ops" / "kafka-log4j2.xml").getroot()
    rolling = config.find("./Appenders/RollingFile")
    assert rolling is not None and rolling.get("fileName", "").endswith("/server.log")
    assert config.find("./Appenders/RollingFile/Policies/SizeBasedTriggeringPolicy") is not None
    assert config.find("./Appenders/File") is None, "no appender that grows without bound"


def test_the_broker_writes_its_own_log_and_a_broker_that_cannot_start_says_why(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    # Kafka logs through SLF4J 1.7: without the binding of that version every line was dropped, server.log empty.
    assert "Kafka Server started" in (kafka.data_dir / "logs" / "server.log").read_text()
    port, controller_port = free_ports(2)
    broker = LocalKafka(
        data_dir=tmp_path / "kafka", port=port, controller_port=controller_port, deps_dir=DEPS_DIR, run_dir=tmp_path
    )
    broker.write_config()
    broker.format_storage()
    meta = broker.data_dir / "data" / "meta.properties"
    meta.write_text(meta.read_text().replace("node.id=1", "node.id=7"))  # storage of another node
    try:
        why = r"(?s)exited with code 1 .*server\.log:\n[^\n]* ERROR .*Stored node id 7 doesn't match"
        with pytest.raises(ServiceError, match=why):
            broker.start(timeout_s=120)
    finally:
        broker.stop()


def test_a_roll_over_never_splits_a_line_that_a_read_of_the_pipe_cut(tmp_path: Path) -> None:
    """The pipe is read in chunks that end anywhere: a line cut between two reads stays whole in one file."""
    log = RollingFile(tmp_path / "d.log", max_bytes=20, backups=2)
    log.write(b"first line\nsecond ")  # 18 bytes, the file ends inside "second line"
    log.write(b"line\nthird line\n")  # would pass 20: "line\n" completes the file's line, then the roll-over
    log.write(b"fourth ")
    log.write(b"and fifth ")  # no line end: the line goes on in the same file, past the size
    log.write(b"line\n")  # completes the line; the file is not left empty by a roll-over now
    assert (tmp_path / "d.log.1").read_text() == "first line\nsecond line\n"
    assert (tmp_path / "d.log").read_text() == "third line\nfourth and fifth line\n"
    log.write(b"sixth\n")
    log.close()
    assert (tmp_path / "d.log.2").read_text() == "first line\nsecond line\n"
    assert (tmp_path / "d.log.1").read_text() == "third line\nfourth and fifth line\n"
    assert (tmp_path / "d.log").read_text() == "sixth\n"
    reopened = RollingFile(tmp_path / "e.log", max_bytes=5, backups=1)
    reopened.write(b"abc")
    reopened.close()
    again = RollingFile(tmp_path / "e.log", max_bytes=5, backups=1)  # a file left inside a line by an earlier run
    again.write(b"def\nnext\n")
    again.close()
    assert (tmp_path / "e.log.1").read_text() == "abcdef\n"
    assert (tmp_path / "e.log").read_text() == "next\n"


def test_kafkas_tools_log_warnings_to_stderr_and_never_into_the_brokers_log(kafka: LocalKafka) -> None:
    """`adbill kafka TOOL` runs Kafka's own tools: they once wrote their INFO lines (their client's whole
    configuration) into the broker's `server.log`, a file a second process then rolled over too."""
    server_log = kafka.data_dir / "logs" / "server.log"
    before = server_log.stat().st_size
    listed = subprocess.run(
        kafka.tool_command("topics", "--bootstrap-server", kafka.bootstrap, "--list"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert "AdminClientConfig values" not in listed.stdout + listed.stderr  # INFO: not shown
    with server_log.open("rb") as log:
        log.seek(before)
        added = log.read().decode("utf-8", "replace")
    assert "AdminClientConfig values" not in added, "a tool wrote into the broker's log"
    missing = subprocess.run(
        kafka.tool_command("topics", "--bootstrap-server", kafka.bootstrap, "--describe", "--topic", "no-such-topic"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode != 0 and "no-such-topic" in missing.stdout + missing.stderr  # the error is shown
