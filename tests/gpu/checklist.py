"""The GPU checks' verdicts, shared by summarize.py and summarize_mps.py:
one PASS or FAIL line per check, then a summary file and the exit status."""
import json
import sys


class Checklist:
    def __init__(self):
        self.checks = []

    def check(self, name, ok, detail):
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")

    def finish(self, path, figures):
        """Writes the checks and figures to `path`; exits 0 if every check passed."""
        path.write_text(json.dumps({"checks": self.checks, "figures": figures}, indent=2))
        sys.exit(0 if all(c["ok"] for c in self.checks) else 1)
