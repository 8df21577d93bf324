"""What NVML's buffered GPU-utilization samples hold, read with pynvml, to
compare with what carma-monitor makes of them (busy time).

    python3 nvml_samples.py [GPU_INDEX] [SECONDS]

Prints JSON: the instantaneous utilization.gpu, and for lastSeenTimeStamp
0 and now - SECONDS: the count, the first and last timestamps, the clock
they are read against, and the values' mean.
"""
import json
import sys
import time

import pynvml as n


def main():
    index = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(index)
    out = {"utilization_gpu": n.nvmlDeviceGetUtilizationRates(h).gpu,
           "now_realtime_us": int(time.time() * 1e6), "now_monotonic_us": int(time.monotonic() * 1e6)}
    for label, since in [("all", 0), (f"last_{seconds}s", int((time.time() - seconds) * 1e6))]:
        try:
            vtype, samples = n.nvmlDeviceGetSamples(h, n.NVML_GPU_UTILIZATION_SAMPLES, since)
        except n.NVMLError as e:
            out[label] = {"error": str(e)}
            continue
        vals = [s.sampleValue.uiVal for s in samples]
        ts = [s.timeStamp for s in samples]
        out[label] = {"value_type": vtype, "count": len(vals), "first_ts": ts[0] if ts else None,
                      "last_ts": ts[-1] if ts else None, "mean": sum(vals) / len(vals) if vals else None,
                      "values": vals[-40:], "gaps_us": [b - a for a, b in zip(ts[-40:], ts[-40:][1:])]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
