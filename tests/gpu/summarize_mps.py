"""Checks of tests/gpu/check_mps.sh's output; prints one line per check and
writes mps-summary.json beside the files.

    python3 summarize_mps.py OUT_DIR
"""
import json
import os
import pathlib
import sys

from checklist import Checklist


def gpu0(doc):
    return next(g for g in doc["gpus"] if g["index"] == 0)


def load_json_line(path):
    text = path.read_text().strip()
    return json.loads(text.splitlines()[-1]) if text else None


def main():
    out = pathlib.Path(sys.argv[1])
    checklist, figures = Checklist(), {}
    check = checklist.check

    uid = int((out / "mps-user-uid.txt").read_text())
    control = {int(p) for p in (out / "mps-control.pid").read_text().split()}
    servers = [line.split() for line in (out / "mps-servers.txt").read_text().splitlines() if line.strip()]
    figures["servers"] = servers
    check("one MPS server runs for the user", len(servers) == 1, f"{servers}")
    for pid, ruid, exe, ppid, pruid, pexe, pfile in servers:
        owner, mode = pfile.split(":")
        check("the server's parent is the root control daemon started for the GPU",
              int(ppid) in control and pruid == "0" and os.path.basename(pexe) == "nvidia-cuda-mps-control",
              f"server {pid} parent {ppid} (uid {pruid}, {pexe}); control daemon {sorted(control)}")
        check("the daemon's file is root's alone (owner 0, not group/other-writable)",
              owner == "0" and int(mode, 8) & 0o022 == 0, f"{pexe}: owner {owner}, mode {mode}")
        check("the server runs as the user it serves", int(ruid) == uid, f"real uid {ruid}, user {uid}; {exe}")
    small = load_json_line(out / "mps-client-1g.json")
    big = load_json_line(out / "mps-client-3g.json")
    figures["clients"] = [small, big]
    check("a client within its fence (0=2048M) allocates 1 GiB", small and small["allocated"], f"{small}")
    check("a client past its fence fails to allocate 3 GiB with CUDA's OOM",
          big and not big["allocated"] and "memory" in (big["error"] or "").lower(), f"{big}")
    for label, name in [("monitor's readings", "mps-readings.json"), ("carma status --json (direct NVML)", "mps-status-direct.json")]:
        try:
            g = gpu0(json.loads((out / name).read_text()))
        except (OSError, ValueError, StopIteration) as e:
            check(f"{label}: readable", False, str(e))
            continue
        figures[name] = {k: g.get(k) for k in ["mps_uid", "minor", "used_mib", "sm_activity", "sm_occupancy", "processes"]}
        check(f"{label}: the GPU's MPS server serves the user", g.get("mps_uid") == uid, f"mps_uid {g.get('mps_uid')}, user {uid}")
        pids = {p["pid"]: p["used_mib"] for p in g["processes"]}
        clients = [c["pid"] for c in (small, big) if c]
        check(f"{label}: the clients are listed with their memory",
              all(pids.get(pid, 0) > 0 for pid in clients), f"processes {pids}, clients {clients}")
    checklist.finish(out / "mps-summary.json", figures)


if __name__ == "__main__":
    main()
