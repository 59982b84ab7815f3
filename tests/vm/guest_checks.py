"""What every guest program writes: RESULTS_DIR/checks.json, each check as
it is decided (so a guest that dies midway still says how far it got), and
the timings it measured. Imported by the guest programs, inside the VM."""
import json
from pathlib import Path


class Checks:
    def __init__(self, results: Path):
        self.path = results / "checks.json"
        self.data = {"checks": {}, "timings": {}}

    def record(self, name: str, ok: bool, detail="") -> bool:
        self.data["checks"][name] = {"ok": bool(ok), "detail": str(detail)[:6000]}
        self.path.write_text(json.dumps(self.data, indent=1))
        print(f"CHECK {name} {'ok' if ok else 'FAIL'}: {str(detail)[:300]}", flush=True)
        return bool(ok)

    def timing(self, name: str, seconds: float) -> None:
        self.data["timings"][name] = round(seconds, 3)
        self.path.write_text(json.dumps(self.data, indent=1))
