"""SM activity of one GPU over one second from NVML GPM (Hopper and newer),
read with pynvml, to compare with carma-monitor's published reading.

    python3 gpm_smutil.py [GPU_INDEX]     prints JSON: {"gpu": 0, "sm_util": 0.57, "sm_occupancy": 0.21}
"""
import json
import sys
import time

import pynvml as n


def main():
    index = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(index)
    s1, s2 = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()
    n.nvmlGpmSampleGet(h, s1)
    time.sleep(1.0)
    n.nvmlGpmSampleGet(h, s2)
    mg = n.c_nvmlGpmMetricsGet_t()
    mg.version = n.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = 2
    mg.sample1, mg.sample2 = s1, s2
    mg.metrics[0].metricId = n.NVML_GPM_METRIC_SM_UTIL
    mg.metrics[1].metricId = n.NVML_GPM_METRIC_SM_OCCUPANCY
    n.nvmlGpmMetricsGet(mg)
    print(json.dumps({"gpu": index, "sm_util": mg.metrics[0].value / 100.0, "sm_occupancy": mg.metrics[1].value / 100.0}))
    n.nvmlGpmSampleFree(s1)
    n.nvmlGpmSampleFree(s2)


if __name__ == "__main__":
    main()
