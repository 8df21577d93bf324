#!/usr/bin/env bash
# How long CARMA held slurmstepd in its placement hook (init_post_opt) for
# each CARMA step of the suites just run: a benchmark's figures, printed,
# never pass/fail. The plugin writes `in_hook=Nms` on each step's line in
# carma.log, placed or not; this reads every node's log (run it where the
# cluster ran: the host, or `tests/releases.sh enter CODENAME ...`).
# The bound is timeouts.wait (30 s by default; the test cluster's first
# node waits 60 s) plus timeouts.lock and timeouts.gpu_read.
#
#   tests/hook-times.sh [SINCE]   SINCE: a UTC time, 2026-11-25T12:00:00;
#                                 only lines stamped at or after it
set -uo pipefail
since=${1:-}
logs=(/var/log/carma/carma*.log)
[ -e "${logs[0]}" ] || { echo "hook-times.sh: no carma.log here"; exit 0; }
series=$(dpkg-query -W -f '${Version}' slurmd 2>/dev/null || echo unknown)
cat "${logs[@]}" | awk -v series="$series" -v since="$since" '
    $1 >= since && / in_hook=[0-9]+ms$/ {
        match($0, / in_hook=[0-9]+ms$/)
        ms = substr($0, RSTART + 9, RLENGTH - 11) + 0
        placed = index($0, "not placed:") == 0
        all[n++] = ms
        if (placed) { p[np++] = ms } else { r[nr++] = ms }
        if (ms >= max) { max = ms; line = $0 }
    }
    function pct(a, k, q,   i, j, t) {
        for (i = 0; i < k; i++) for (j = i + 1; j < k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return k ? a[int((k - 1) * q)] : 0
    }
    END {
        if (n == 0) { print "hook-times.sh: no step line with in_hook= (an older plugin?)"; exit }
        printf "time in CARMA'"'"'s placement hook, Slurm %s: %d CARMA steps (%d placed, %d refused)\n", series, n, np, nr
        printf "  placed:  p50 %d ms  p99 %d ms  max %d ms\n", pct(p, np, 0.5), pct(p, np, 0.99), pct(p, np, 1)
        if (nr) printf "  refused: p50 %d ms  p99 %d ms  max %d ms\n", pct(r, nr, 0.5), pct(r, nr, 0.99), pct(r, nr, 1)
        printf "  longest: %d ms: %s\n", max, substr(line, 1, 240)
    }'
