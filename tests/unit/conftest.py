import pytest

from tracehound.chaos import faults as catalog


@pytest.fixture
def no_faults_touched(monkeypatch):
    """Every prepare/apply/rollback a fault gets, recorded instead of run:
    a test asserts the list stays empty when nothing may be applied."""
    calls = []
    for fault in catalog.catalog().values():
        for step in ("prepare", "apply", "rollback"):
            monkeypatch.setattr(fault, step, lambda *a, _s=step, **k: calls.append(_s))
    return calls
