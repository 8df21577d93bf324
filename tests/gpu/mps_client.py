"""An MPS client for tests/gpu/check_mps.sh: allocates GiBs on the GPU,
holds them while running kernels, and prints one JSON line.

    python3 mps_client.py --gib 1 --hold 12

`{"pid": 123, "gib": 1, "allocated": true, "error": null}`; a failed
allocation (the MPS fence, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) prints
`"allocated": false` and the error's last line.
"""
import argparse
import json
import os
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=1)
    p.add_argument("--hold", type=float, default=12)
    a = p.parse_args()
    torch.cuda.init()
    x = torch.ones(1024, 1024, device="cuda")
    result = {"pid": os.getpid(), "gib": a.gib, "allocated": False, "error": None}
    try:
        block = torch.empty(int(a.gib * (1 << 30)), dtype=torch.uint8, device="cuda")
        block.fill_(1)
        torch.cuda.synchronize()
        result["allocated"] = True
    except Exception as e:  # the fence answers with CUDA's OOM
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    print(json.dumps(result), flush=True)
    end = time.time() + a.hold
    while time.time() < end:
        x = x @ x
        x = x / x.norm()
        torch.cuda.synchronize()
        time.sleep(0.05)


if __name__ == "__main__":
    main()
