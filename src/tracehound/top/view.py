"""rich renderables for a Snapshot: the I/O table and the job, RDMA and GPU panels.

Every name shown (cgroup, workload, mount point, device, process) is chosen
by someone on the node: it goes into a cell as plain Text, never as rich
markup ("[bold]" or "[/x]" in a name is shown, not applied or raised), and
with its control characters written as escapes, so a name cannot move the
cursor, clear the screen or send the terminal an escape sequence.
"""
from __future__ import annotations

from typing import Optional

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..printable import escaped
from .model import Snapshot
from .state import HELP, PANEL_TITLES, PANELS, ViewState

IO_COLUMNS = (
    # (header, sort column it shows, right-aligned)
    ("WORKLOAD", "name", False), ("KIND", None, False), ("FILE SYSTEM", None, False),
    ("READ/s", "read", True), ("WRITE/s", "write", True), ("IOPS", "iops", True),
    ("p50", None, True), ("p99", "p99", True), ("ERR/s", "errors", True),
)


def shown(text: str) -> Text:
    """A name as plain Text, its unprintable characters escaped."""
    return Text(escaped(text))


def fmt_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return ""  # not reached


def fmt_count(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) < 10:
        return f"{value:.1f}"
    if abs(value) < 1000:
        return f"{value:.0f}"
    if abs(value) < 1e6:
        return f"{value / 1e3:.1f}k"
    return f"{value / 1e6:.1f}M"


def fmt_seconds(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.0f}µs"
    if value < 1:
        return f"{value * 1e3:.1f}ms"
    return f"{value:.2f}s"


def io_table(rows: list, state: ViewState) -> Table:
    table = Table(box=box.SIMPLE_HEAD, expand=False, pad_edge=False)
    for header, column, right in IO_COLUMNS:
        if column is not None and column == state.sort:
            # an arrow pointing the way the rows are ordered
            descending = column != "name"
            if state.reverse:
                descending = not descending
            header += " ▼" if descending else " ▲"
        table.add_column(header, justify="right" if right else "left", no_wrap=True,
                         overflow="ellipsis")
    for r in rows:
        table.add_row(shown(r.name), shown(r.kind), shown(f"{r.mountpoint} ({r.fstype})"),
                      fmt_bytes(r.read_bytes_per_second), fmt_bytes(r.write_bytes_per_second),
                      fmt_count(r.ops_per_second), fmt_seconds(r.latency_p50_seconds),
                      fmt_seconds(r.latency_p99_seconds), fmt_count(r.errors_per_second))
    return table


def _no_data(what: str) -> Text:
    return Text(f"{what}: no data", style="dim")


def _titled_table(title: str, rows: Optional[list], headers: tuple, cells):
    """None is a source that does not export the metric; [] is one that
    exports it with nothing to show."""
    if rows is None:
        return _no_data(title)
    if not rows:
        return Text(f"{title}: none", style="dim")
    t = Table(*headers, box=box.SIMPLE_HEAD, title=title, title_justify="left")
    for r in rows:
        t.add_row(*cells(r))
    return t


def rdma_panel(objects: Optional[list], errors: Optional[list]):
    return Group(
        _titled_table("RDMA objects", objects, ("CGROUP", "DEVICE", "TYPE", "OBJECTS"),
                      lambda r: (shown(r.cgroup), shown(r.device), shown(r.type),
                                 fmt_count(r.count))),
        _titled_table("RDMA verb errors", errors, ("OP", "ERRNO", "ERR/s", "TOTAL"),
                      lambda r: (shown(r.op), shown(r.errno), fmt_count(r.errors_per_second),
                                 fmt_count(r.errors_total))))


def jobs_panel(jobs: list):
    """One row per job: CPU from its topmost cgroups, the rest summed."""
    if not jobs:
        return Text("Jobs: none (no series names a job, pod, VM or unit)", style="dim")
    with_nodes = any(j.nodes for j in jobs)
    headers = ["JOB", "KIND", *(["NODES"] if with_nodes else []), "CGROUPS", "CPU",
               "MEMORY", "PROCS", "STOPPED", "READ/s", "WRITE/s", "IO ERR/s"]
    t = Table(*headers, box=box.SIMPLE_HEAD, title="Jobs", title_justify="left")
    for j in jobs:
        stopped = Text(fmt_count(j.stopped_processes),
                       style="bold red" if j.stopped_processes else "")
        t.add_row(shown(j.name), shown(j.kind),
                  *([shown(",".join(j.nodes))] if with_nodes else []), str(j.cgroups),
                  "-" if j.cpu_cores is None else f"{j.cpu_cores:.2f}",
                  "-" if j.memory_rss_bytes is None else fmt_bytes(j.memory_rss_bytes),
                  "-" if j.processes is None else fmt_count(j.processes), stopped,
                  fmt_bytes(j.read_bytes_per_second), fmt_bytes(j.write_bytes_per_second),
                  fmt_count(j.io_errors_per_second))
    return t


def gpu_panel(gpus: Optional[list]):
    if gpus is None:
        return _no_data("GPU")
    if not gpus:
        return Text("GPU: none", style="dim")
    with_nodes = any(g.node for g in gpus)
    headers = (["NODE"] if with_nodes else []) + [
        "GPU", "MODEL", "TEMP", "MEM TEMP", "THROTTLE", "XIDS", "XID/s"]
    t = Table(*headers, box=box.SIMPLE_HEAD, title="GPUs", title_justify="left")
    for g in gpus:
        temp = "-" if g.temperature_celsius is None else f"{g.temperature_celsius:.0f}°C"
        mem = "-" if g.memory_temperature_celsius is None \
            else f"{g.memory_temperature_celsius:.0f}°C"
        xids = shown(", ".join(f"{x}×{n:.0f}" for x, n in sorted(g.xids.items()) if n) or "0")
        throttle = shown(", ".join(g.throttle_reasons) or "-")
        if _slowdown(g.throttle_reasons):
            throttle.stylize("bold red")
        cells = [shown(g.gpu), shown(g.model), temp, mem, throttle, xids,
                 fmt_count(g.xid_errors_per_second)]
        t.add_row(*([shown(g.node)] if with_nodes else []), *cells)
    return t


def _slowdown(reasons: list) -> bool:
    # idle clocks and the power cap at full load are normal, not trouble
    return any(r not in ("gpu_idle", "sw_power_cap", "applications_clocks_setting")
               for r in reasons)


def header(state: ViewState, snap: Optional[Snapshot], source: str, every: float) -> Text:
    text = Text()
    text.append("tracehound top", style="bold")
    text.append(f"  {source}  every {every:g}s")
    if snap is not None and snap.interval_seconds:
        # scrapes of a busy agent drift; the rates cover what really elapsed
        text.append(f" (last {snap.interval_seconds:.1f}s)", style="dim")
    text.append("  ")
    for p in PANELS:
        title = f" {PANEL_TITLES[p]} "
        text.append(title, style="reverse bold" if p == state.panel else "dim")
    text.append(f"  sort {state.sort}{' (reversed)' if state.reverse else ''}")
    if state.editing is not None:
        text.append(f"  filter: {state.editing}▏", style="bold yellow")
    elif state.filter:
        text.append(f"  filter: {state.filter}", style="yellow")
    if not state.show_idle:
        text.append("  (idle rows hidden)", style="dim")
    return text


def screen(state: ViewState, snap: Optional[Snapshot], source: str, every: float,
           height: int = 0) -> Group:
    """The whole screen; with a height, I/O rows that would push the key
    help off the bottom are counted instead of drawn."""
    parts = [header(state, snap, source, every)]
    if state.error:
        parts.append(shown(state.error))
        parts[-1].stylize("bold red")
    if snap is None:
        parts.append(Text("collecting: rates need two scrapes…", style="dim"))
    elif state.panel == "io":
        rows = state.io_rows(snap)
        # header, help, "more" line, and the table's head, rule and blank edges
        room = max(1, height - len(parts) - 6) if height else len(rows)
        parts.append(io_table(rows[:room], state))
        if len(rows) > room:
            parts.append(Text(f"… {len(rows) - room} more rows (/ to filter)", style="dim"))
        if not rows:
            parts.append(Text("no I/O rows match" if snap.io else "I/O: no data", style="dim"))
    elif state.panel == "jobs":
        parts.append(jobs_panel(state.job_rows(snap)))
    elif state.panel == "rdma":
        parts.append(rdma_panel(state.rdma_objects(snap), snap.rdma_errors))
    else:
        parts.append(gpu_panel(snap.gpus))
    parts.append(Text(HELP, style="dim"))
    return Group(*parts)
