"""The README and docs/ name flags a reader will type: each one named must
be a flag of a tracehound command, or of one of our scripts, or of another
tool the docs show by name (kept in a list, so a new one is a decision)."""
import argparse
import glob
import os
import re

from tests.conftest import ROOT
from tracehound.cli import build_parser

DOCS = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9.-]*[a-z0-9]")
# flags of other tools the docs use, by tool
FOREIGN = {
    "curl": {"--cacert", "--connect-to"},
    "kubectl create secret": {"--from-file", "--from-literal"},
    "prometheus": {"--enable-feature"},
    "pip": {"--no-build-isolation", "--no-deps"},
    "nsenter": {"--net"},
    "systemctl": {"--now"},
    "srun, scancel": {"--jobid", "--overlap", "--exclusive", "--signal", "--mem"},
    "slurm's configure": {"--enable-multiple-slurmd"},
    "dcgmi": {"--inject"},
}
SCRIPTS = ("scripts/install", "scripts/gpu-check", "scripts/build-image", "bench/scrape/__main__.py")


def cli_flags() -> set[str]:
    out: set[str] = set()

    def walk(parser):
        for action in parser._actions:
            out.update(s for s in action.option_strings if s.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
    walk(build_parser())
    return out


def script_flags() -> set[str]:
    out: set[str] = set()
    for name in SCRIPTS:
        with open(os.path.join(ROOT, name)) as f:
            # the flags a script's case statement or argument parser takes
            out.update(re.findall(r"^\s*(--[a-z][a-z-]*)[)|]", f.read(), re.M))
            f.seek(0)
            out.update(re.findall(r"add_argument\(\"(--[a-z][a-z-]*)\"", f.read()))
    return out


def test_every_flag_the_docs_name_exists():
    known = cli_flags() | script_flags() | set().union(*FOREIGN.values())
    unknown = {}
    for path in DOCS:
        with open(path) as f:
            for flag in FLAG.findall(f.read()):
                if flag not in known:
                    unknown.setdefault(flag, os.path.relpath(path, ROOT))
    assert unknown == {}


def test_the_install_flags_the_readme_shows_are_the_scripts():
    assert {"--wheel", "--dev", "--run"} <= script_flags()
    assert "--pack" in script_flags()
