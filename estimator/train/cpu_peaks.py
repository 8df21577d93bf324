"""Training memory of torchvision models measured on a CPU: the peak of live
tensor bytes during one Adam training step (fp32, random data; the second
step, so that Adam's state exists), read from the PyTorch profiler's memory
events, plus the weights and Adam state alive before it.

It is not a GPU peak: it has no CUDA context, no cuDNN/cuBLAS workspaces and
no caching-allocator rounding. Rows that the CARMA paper measured on an A100
(`workload` column) give the ratio between the two, which the estimator's
tests use to bound the GPU peak of the rows no GPU has measured yet
(estimator/tests/vision.rs). Re-run on a GPU machine for the real figures:
tests/gpu/ (docs/estimator.md).

    python3 estimator/train/cpu_peaks.py > data/cpu/training-memory.csv

Needs torch and torchvision (CPU is enough; no weights are downloaded).
"""
import sys
import torch
import torchvision
from torch.profiler import profile, ProfilerActivity

# (model, batch, image size, the paper's workload row measured on an A100)
ROWS = [
    ("resnet50", 32, 224, "resnet"),
    ("resnet50", 64, 224, "resnet2"),
    ("mobilenet_v2", 32, 224, "mobilenet"),
    ("mobilenet_v2", 64, 224, "mobilenet2"),
    ("vgg16", 32, 224, "vgg"),
    ("vgg16", 64, 224, "vgg2"),
    ("efficientnet_b0", 32, 224, "efficientNet"),
    ("efficientnet_b0", 64, 224, "efficientNet2"),
    ("inception_v3", 32, 299, "Inception"),
    ("vit_b_16", 32, 224, ""),
    ("vit_b_16", 64, 224, ""),
    ("swin_t", 32, 224, ""),
    ("swin_t", 64, 224, ""),
    ("convnext_tiny", 32, 224, ""),
    ("convnext_tiny", 64, 224, ""),
]


def measure(name, batch, size):
    torch.manual_seed(0)
    m = getattr(torchvision.models, name)().train()
    opt = torch.optim.Adam(m.parameters())
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        out = m(x)
        out = out[0] if isinstance(out, tuple) else out  # inception's aux logits
        torch.nn.functional.cross_entropy(out, y).backward()
        opt.step()

    params = sum(p.numel() for p in m.parameters())
    before = 3 * 4 * params + x.numel() * 4  # weights and Adam's two moments, fp32; the batch
    return params, (before + peak_live_bytes(step)) / 2**20


def peak_live_bytes(step):
    """Runs a training step twice (the second with Adam's state in place) and
    returns the peak of tensor bytes the second allocated beyond what was
    alive before it, from the profiler's memory events. (Frees of tensors
    allocated before profiling are not among them: the previous step's
    gradients, freed by zero_grad, are counted neither way.)"""
    step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, b in events:
        live += b
        peak = max(peak, live)
    return peak


def main():
    torch.set_num_threads(2)
    print("model,batch,image,params,cpu_peak_mib,workload")
    for name, batch, size, workload in ROWS:
        params, mib = measure(name, batch, size)
        print(f"{name},{batch},{size},{params},{mib:.0f},{workload}", flush=True)


if __name__ == "__main__":
    main()
