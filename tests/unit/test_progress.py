"""Plain progress lines when not on a terminal."""
import io

from tracehound.terminal_progress import steps


def test_plain_lines_count_steps_and_estimate_time_left():
    out = io.StringIO()
    with steps(3, "bench", stream=out) as bar:
        bar.advance("one")
        bar.advance("two")
        bar.advance()
    lines = out.getvalue().splitlines()
    assert [ln.split(" (")[0] for ln in lines] == ["bench: [1/3] one", "bench: [2/3] two",
                                                  "bench: [3/3] "]
    assert lines[-1].endswith("~0 s left)") and bar.done == 3
