"""Summarises tests/gpu/check_guard.sh: each set's jobs' it/s over the
measured window (from train.py's step lines) and the monitor's window means,
written as guard.csv in data/h100/collocation.csv's format; then
`carma calibrate guard.csv` (the slowdown model job by job, and the guard's
verdict per set), PASS/FAIL lines and guard-summary.json.

    python3 guard_summary.py OUT_DIR CARMA_BINARY
"""
import json
import os
import re
import subprocess
import sys

WINDOW = (12.0, 22.0)  # seconds since each job's start: after warm-up, before the end


def windowed_its(log, batch):
    """Training steps per second between WINDOW's ends, from the step lines.

    train.py prints `step N images/s R` with R the mean since its start, so
    each line's time since start is N * batch / R."""
    points = []
    for line in open(log):
        m = re.match(r"step (\d+) images/s ([\d.]+)", line)
        if m and float(m.group(2)) > 0:
            n = int(m.group(1))
            points.append((n * batch / float(m.group(2)), n))
    inside = [p for p in points if WINDOW[0] <= p[0] <= WINDOW[1]]
    if len(inside) < 2:
        raise ValueError(f"{log}: fewer than two step lines between {WINDOW[0]} and {WINDOW[1]} s")
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / (t1 - t0)


def main(out, carma):
    rows, sets = [], []
    for line in open(os.path.join(out, "guard-sets.txt")):
        label, *jobs = line.split()
        readings = json.load(open(os.path.join(out, f"guard-{label}-readings.json")))["gpus"][0]
        its = [windowed_its(os.path.join(out, f"guard-{label}-{j}.log"), int(j.rsplit("_", 1)[1])) for j in jobs]
        rows.append(
            "timeslice,{},{},{:.1f},{:.1f},{:.1f},{:.1f}".format(
                "+".join(jobs),
                "+".join(f"{x:.2f}" for x in its),
                readings.get("power_w") or 0.0,
                100 * readings["busy"],
                100 * readings["sm_activity"],
                100 * (readings.get("sm_occupancy") or 0.0),
            )
        )
        sets.append({"label": label, "jobs": jobs, "its": its, "busy": readings["busy"], "sm": readings["sm_activity"]})
    csv = os.path.join(out, "guard.csv")
    with open(csv, "w") as f:
        f.write("mode,jobs,job_throughputs_it_s,power_w,nvml_utilization_gpu_pct,gpm_sm_activity_pct,gpm_sm_occupancy_pct\n")
        f.write("\n".join(rows) + "\n")
    report = subprocess.run([carma, "calibrate", csv], capture_output=True, text=True)
    open(os.path.join(out, "guard-calibrate.txt"), "w").write(report.stdout + report.stderr)
    print(report.stdout + report.stderr)
    checks = []

    def check(name, ok, detail):
        checks.append({"check": name, "pass": bool(ok), "detail": detail})
        print(("PASS" if ok else "FAIL"), name, "-", detail)

    summary = re.search(r"all: per-job error median ([\d.]+) %, p90 ([\d.]+) %, max ([\d.]+) %", report.stdout)
    check("calibrate ran", report.returncode == 0 and summary, report.stderr.strip() or "ok")
    if summary:
        med, p90, worst = (float(x) for x in summary.groups())
        # On another GPU than the H100 the model was fitted on: a looser bound.
        check("per-job error on this GPU", med <= 10 and p90 <= 20, f"median {med} %, p90 {p90} %, max {worst} %")
    verdicts = re.findall(r"timeslice\s+(\S+)\s+worst measured ([\d.]+)x: (\w+)\s+predicted ([\d.]+)x: (\w+)", report.stdout)
    for jobs, measured, should, predicted, would in verdicts:
        check(f"guard on {jobs}", should == would, f"measured {measured}x ({should}), predicted {predicted}x ({would})")
    # The set the SM cap alone admits (resnet50 joining mobilenet reads the
    # latter's SM activity): the guard must refuse it where it ran too slow.
    mob = next((s for s in sets if s["jobs"] == ["mobilenet_32"]), None)
    pair = next((v for v in verdicts if v[0] == "resnet50_64+mobilenet_32"), None)
    if mob and pair:
        check(
            "SM cap alone would admit resnet50 beside mobilenet",
            mob["sm"] <= 0.8,
            f"mobilenet alone read SM {mob['sm']:.2f}; the pair ran {pair[1]}x, the guard says {pair[4]}",
        )
    json.dump({"sets": sets, "checks": checks}, open(os.path.join(out, "guard-summary.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
