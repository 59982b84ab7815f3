"""Log lines through a bounded queue and one writer thread: a full pipe that
no one reads holds only the writer; lines past the bound are dropped, and
the writer says how many once the pipe takes lines again."""
import fcntl
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time

from tracehound.logsink import DroppingQueueHandler, DescriptorWriter

from .waiting import DEADLINE_S

F_SETPIPE_SZ = 1031


def test_a_full_unread_pipe_holds_no_logger_and_drops_are_told():
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, F_SETPIPE_SZ, 4096)
    handler = DroppingQueueHandler(queue.Queue(10))
    writer = DescriptorWriter(handler, logging.Formatter("t: %(message)s"), write_fd).start()
    os.close(write_fd)          # the writer has its own copy
    logger = logging.getLogger("tracehound.test.logsink")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        def flood():
            for n in range(2000):      # 2 MB: the pipe holds 4 KB, the queue 10 lines
                logger.warning("line %d %s", n, "x" * 1000)
        thread = threading.Thread(target=flood, daemon=True)
        thread.start()
        thread.join(DEADLINE_S)
        assert not thread.is_alive(), "logging blocked on the unread pipe"
        assert not writer.drain(0.2), "the pipe was not full: the test proves nothing"
        said = b""
        os.set_blocking(read_fd, False)
        deadline = time.monotonic() + DEADLINE_S
        while True:             # read until every queued line is written, then the rest
            done = writer.drain(0)
            try:
                said += os.read(read_fd, 65536)
            except BlockingIOError:
                if done:
                    break
                assert time.monotonic() < deadline, "the writer stopped writing"
                time.sleep(0.01)    # polling the pipe, not waiting out a guess
        assert b"t: line 0 " in said
        dropped = sum(int(line.split()[2]) for line in said.decode().splitlines()
                      if "log lines dropped" in line)
        written = sum(1 for line in said.decode().splitlines() if line.startswith("t: line"))
        assert dropped + written == 2000
    finally:
        logger.removeHandler(handler)
        os.close(read_fd)


JSON_LOGGING = r'''
import logging
from tracehound.detect import log_event
from tracehound.logsink import JsonFormatter, log_to_stderr
log_to_stderr(logging.WARNING, JsonFormatter())
log_event({"event": "job_stalled", "job_id": "7", "stalled_for_s": 310.0})
logging.getLogger("tracehound.agent").warning("a name with\na newline: %s", "x\x1b[2J")
'''


def test_json_logs_are_one_object_a_line_with_events_as_records():
    done = subprocess.run([sys.executable, "-c", JSON_LOGGING], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    event, plain = [json.loads(line) for line in done.stderr.splitlines()]
    assert event["logger"] == "tracehound.events" and event["level"] == "warning"
    assert event["event"] == {"event": "job_stalled", "job_id": "7", "stalled_for_s": 310.0}
    assert plain["message"] == "a name with\na newline: x\x1b[2J"
    assert plain["time"].endswith("+00:00") and "event" not in plain


def test_a_log_format_from_the_environment_is_checked():
    env = {**os.environ, "TRACEHOUND_LOG_FORMAT": "xml"}
    done = subprocess.run([sys.executable, "-m", "tracehound", "doctor"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "TRACEHOUND_LOG_FORMAT='xml': text or json" in done.stderr
