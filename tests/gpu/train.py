"""A small PyTorch training loop for the GPU checks (tests/gpu/check_monitor.sh).

    python3 train.py --model tiny|resnet18|resnet50|mobilenet --batch 64 --seconds 40

Prints one line per 20 steps: `step N images/s X peak_mib Y` (torch's own peak).
"""
import argparse
import time

import torch
import torch.nn as nn


def model_for(name):
    if name == "tiny":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 64), nn.ReLU(), nn.Linear(64, 10)), 32
    import torchvision

    ctor = {"resnet18": torchvision.models.resnet18, "resnet50": torchvision.models.resnet50,
            "mobilenet": torchvision.models.mobilenet_v2}[name]
    return ctor(num_classes=1000), 224


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=40)
    a = p.parse_args()
    net, size = model_for(a.model)
    net = net.cuda()
    opt = torch.optim.Adam(net.parameters())
    x = torch.randn(a.batch, 3, size, size, device="cuda")
    y = torch.randint(0, 10, (a.batch,), device="cuda")
    loss_fn = nn.CrossEntropyLoss()
    start, step, seen = time.time(), 0, 0
    while time.time() - start < a.seconds:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        step += 1
        seen += a.batch
        if step % 20 == 0:
            torch.cuda.synchronize()
            rate = seen / (time.time() - start)
            peak = torch.cuda.max_memory_allocated() >> 20
            print(f"step {step} images/s {rate:.1f} peak_mib {peak}", flush=True)


if __name__ == "__main__":
    main()
