#!/usr/bin/env bash
# Prints the Slurm release series ("26.05") whose headers are in
# INCLUDE_DIR/slurm/ (default /usr/include), from SLURM_VERSION_NUMBER: the
# major.minor a SPANK plugin built against them loads into, and no other.
set -euo pipefail
inc=${1:-/usr/include}
v=$(sed -n 's/^#define SLURM_VERSION_NUMBER 0x\([0-9a-f]*\).*/\1/p' "$inc/slurm/slurm_version.h" 2>/dev/null) || true
[ -n "$v" ] || { echo "slurm-series.sh: no Slurm headers in $inc (install libslurm-dev)" >&2; exit 1; }
printf '%d.%02d\n' "0x${v:0:2}" "0x${v:2:2}"
