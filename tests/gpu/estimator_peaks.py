"""Training peaks for the estimator's validation table (#14), measured on a GPU.

Each case trains a model with Adam on random data in a child process for a few
steps; the parent polls NVML for the child's own memory (CUDA context
included, what CARMA reserves) and keeps the highest reading. The child
reports PyTorch's max allocated and reserved memory too. Cases name the model
file the estimator reads (data/onnx/*.onnx exports, data/hf/*/config.json),
so the table can be checked in CI against `carma estimate` (docs/estimator.md).

    python3 tests/gpu/estimator_peaks.py [OUTDIR]      # writes OUTDIR/estimator-peaks.csv

Needs torch, torchvision, transformers and pynvml; about 10 minutes on an H100.
A case that runs out of memory is recorded as `oom`, never retried.
"""
import csv
import json
import os
import subprocess
import sys
import time

# (model file, kind, batch, sequence or image size, precision)
CASES = []
for model in ["resnet50", "mobilenet_v2", "efficientnet_b0", "vgg16", "convnext_tiny"]:
    for batch in [32, 64, 128]:
        CASES.append((f"data/onnx/{model}.onnx", "torchvision", batch, 224, "fp32"))
    CASES.append((f"data/onnx/{model}.onnx", "torchvision", 64, 224, "mixed"))
for model in ["vit_b_16", "swin_t"]:
    for batch in [32, 64]:
        CASES.append((f"data/onnx/{model}.onnx", "torchvision", batch, 224, "fp32"))
    CASES.append((f"data/onnx/{model}.onnx", "torchvision", 64, 224, "mixed"))
for model, batch, seqs in [
    ("bert-base", 16, [128, 512]),
    ("gpt2", 8, [512, 1024]),
    ("qwen2-0.5b-shape", 4, [1024, 2048]),
    ("tinyllama-shape", 2, [1024, 2048]),
]:
    for seq in seqs:
        for precision in ["fp32", "mixed"]:
            CASES.append((f"data/hf/{model}/config.json", "hf", batch, seq, precision))
    CASES.append((f"data/hf/{model}/config.json", "hf", batch, seqs[0], "bf16"))

STEPS = 6


def child(case):
    """Runs in the child: trains, prints one JSON line."""
    import torch

    path, kind, batch, size, precision = case
    torch.manual_seed(0)
    dev = torch.device("cuda")
    if kind == "torchvision":
        import torchvision

        name = os.path.basename(path)[: -len(".onnx")]
        model = getattr(torchvision.models, name)()
        x = torch.randn(batch, 3, size, size, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)

        def loss_of(m):
            out = m(x)
            out = out[0] if isinstance(out, tuple) else out
            return torch.nn.functional.cross_entropy(out, y)
    else:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

        cfg = AutoConfig.from_pretrained(os.path.dirname(path))
        auto = AutoModelForMaskedLM if cfg.model_type == "bert" else AutoModelForCausalLM
        model = auto.from_config(cfg)
        ids = torch.randint(0, cfg.vocab_size, (batch, size), device=dev)

        def loss_of(m):
            return m(input_ids=ids, labels=ids).loss
    model = model.to(dev).train()
    if precision == "bf16":
        model = model.to(torch.bfloat16)
        if kind == "torchvision":
            x = x.to(torch.bfloat16)
    opt = torch.optim.Adam(model.parameters())
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "mixed"):
            loss = loss_of(model)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    mib = 2**20
    print(json.dumps({
        "allocated": torch.cuda.max_memory_allocated() / mib,
        "reserved": torch.cuda.max_memory_reserved() / mib,
        "params": sum(p.numel() for p in model.parameters()),
    }), flush=True)


def measure(case):
    import pynvml

    proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(case)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    peak = 0
    while proc.poll() is None:
        try:
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == proc.pid and p.usedGpuMemory:
                    peak = max(peak, p.usedGpuMemory)
        except pynvml.NVMLError:
            pass
        time.sleep(0.02)
    out, err = proc.communicate()
    if proc.returncode != 0:
        status = "oom" if "out of memory" in err.lower() else "failed: " + err.strip().splitlines()[-1][:200]
        return {"status": status, "nvml_peak_mib": round(peak / 2**20)}
    r = json.loads(out.strip().splitlines()[-1])
    return {
        "status": "ok",
        "nvml_peak_mib": round(peak / 2**20),
        "torch_reserved_mib": round(r["reserved"]),
        "torch_allocated_mib": round(r["allocated"]),
        "params": r["params"],
    }


def main():
    import pynvml
    import torch

    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/carma-gpu-check")
    os.makedirs(out_dir, exist_ok=True)
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    device = pynvml.nvmlDeviceGetName(h)
    driver = pynvml.nvmlSystemGetDriverVersion()
    path = os.path.join(out_dir, "estimator-peaks.csv")
    fields = ["model_file", "kind", "batch", "seq_or_image", "precision", "status", "nvml_peak_mib",
              "torch_reserved_mib", "torch_allocated_mib", "params"]
    with open(path, "w", newline="") as f:
        f.write(f"# {device}, driver {driver}, torch {torch.__version__}; {STEPS} Adam steps per case\n")
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for case in CASES:
            row = dict(zip(fields, case))
            row.update(measure(case))
            w.writerow(row)
            f.flush()
            print(row, flush=True)
    print(f"wrote {path}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
    else:
        main()
