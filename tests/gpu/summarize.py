"""Checks of tests/gpu/check_monitor.sh's output directory; prints one line
per check and writes summary.json beside the files.

    python3 summarize.py OUT_DIR
"""
import csv
import json
import pathlib
import sys

from checklist import Checklist


def gpu0(readings):
    return next(g for g in readings["gpus"] if g["index"] == 0)


def main():
    out = pathlib.Path(sys.argv[1])
    checklist, figures = Checklist(), {}
    check = checklist.check

    figures["device"] = (out / "device.txt").read_text().strip()
    for label in ["light", "heavy"]:
        r = gpu0(json.loads((out / f"readings-{label}.json").read_text()))
        gpm = json.loads((out / f"gpm-{label}.json").read_text())
        util, used = next(csv.reader((out / f"smi-{label}.csv").open()))
        apps = {int(p): int(m) for p, m in csv.reader((out / f"apps-{label}.csv").open(), skipinitialspace=True)}
        figures[label] = {"monitor_sm": r["sm_activity"], "monitor_busy": r["busy"],
                          "monitor_occupancy": r.get("sm_occupancy"), "gpm_sm": gpm["sm_util"],
                          "smi_busy": int(util) / 100.0, "smi_used_mib": int(used)}
        check(f"{label}: monitor SM activity near pynvml GPM",
              abs(r["sm_activity"] - gpm["sm_util"]) <= 0.10, f"{r['sm_activity']:.3f} vs {gpm['sm_util']:.3f}")
        check(f"{label}: monitor busy near nvidia-smi", abs(r["busy"] - int(util) / 100.0) <= 0.15,
              f"{r['busy']:.3f} vs {int(util) / 100.0:.2f}")
        mine = {p["pid"]: p["used_mib"] for p in r["processes"]}
        same = all(abs(mine.get(pid, -1) - mib) <= max(2, mib // 50) for pid, mib in apps.items())
        check(f"{label}: per-process memory matches nvidia-smi --query-compute-apps", same and set(mine) == set(apps),
              f"{mine} vs {apps}")
    minor = (out / "minor.txt").read_text().strip()
    reported = gpu0(json.loads((out / "readings-light.json").read_text())).get("minor")
    figures["minor"] = {"nvidia_smi": minor, "monitor": reported}
    check("GPU 0's minor number (its /dev/nvidiaN) as nvidia-smi gives it",
          str(reported) == minor and pathlib.Path(f"/dev/nvidia{minor}").exists(), f"{reported} vs {minor}")
    light, heavy = figures["light"], figures["heavy"]
    check("light pair: SM activity < 0.10", light["monitor_sm"] < 0.10, f"{light['monitor_sm']:.3f}")
    check("light pair: busy > 0.8", light["monitor_busy"] > 0.8, f"{light['monitor_busy']:.3f}")
    dry = (out / "dryrun-light.txt").read_text()
    check("light pair: carma place --dry-run accepts another job under the SM metric",
          "would place on gpu_indices=0" in dry, dry.strip().splitlines()[1] if "\n" in dry else dry.strip())
    check("resnet50 batch 64: SM activity >= 0.6", heavy["monitor_sm"] >= 0.6, f"{heavy['monitor_sm']:.3f}")
    direct = [float(x) for x in (out / "direct-read-seconds.txt").read_text().split()]
    figures["carma_status_direct_nvml_s"] = direct
    figures["carma_status_published_s"] = [float((out / f"status-seconds-{l}.txt").read_text()) for l in ["light", "heavy"]]
    checklist.finish(out / "summary.json", figures)


if __name__ == "__main__":
    main()
