"""The application probe reads libibverbs' structs by offset
(probes/verbs_abi.h): each offset must be the one <infiniband/verbs.h> gives."""
import os
import re
import shutil
import subprocess

import pytest

from tracehound.probes import object_path

PROBES = os.path.dirname(object_path("rdma"))
HEADER = "/usr/include/infiniband/verbs.h"
# our struct -> the real one
PAIRS = {"uv_device": "ibv_device", "uv_context": "ibv_context", "uv_pd": "ibv_pd",
         "uv_cq": "ibv_cq", "uv_srq": "ibv_srq", "uv_qp": "ibv_qp", "uv_mr": "ibv_mr"}


def fields() -> list[tuple[str, str]]:
    """(struct, field) of every field verbs_abi.h declares."""
    text = open(os.path.join(PROBES, "verbs_abi.h")).read()
    out = []
    for name, body in re.findall(r"struct (uv_\w+) \{(.*?)\};", text, re.DOTALL):
        for line in body.splitlines():
            m = re.match(r"\s*__u\d+ (\w+)(\[\d+\])?;", line)
            if m:
                out.append((name, m.group(1)))
    return out


@pytest.mark.skipif(not os.path.exists(HEADER) or not shutil.which("gcc"),
                    reason="needs gcc and libibverbs-dev (apt-get install libibverbs-dev)")
def test_every_offset_matches_the_real_header(tmp_path):
    checks = []
    for ours, field in fields():
        real = PAIRS[ours]
        # _ops is private in the real header: our ops[2] stands for it
        real_field = "_ops" if field == "ops" else field
        checks.append(f"_Static_assert(offsetof(struct {ours}, {field}) == "
                      f"offsetof(struct {real}, {real_field}), \"{ours}.{field}\");")
    assert len(checks) >= 20
    src = tmp_path / "abi.c"
    src.write_text("#include <stddef.h>\n#include <infiniband/verbs.h>\n"
                   f'#include "{PROBES}/verbs_abi.h"\n' + "\n".join(checks) + "\n")
    out = subprocess.run(["gcc", "-c", "-o", os.devnull, str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
