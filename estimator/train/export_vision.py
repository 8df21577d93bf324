"""Weight-free ONNX exports of vision transformers and ConvNeXt, made as
data/onnx/README.md describes the other exports (torch 2.15, torchvision
0.29.2, onnx 1.23; TorchScript exporter, opset 20, eval mode, weights as
graph inputs, symbolic batch). CPU only; no weights are downloaded.

    python3 estimator/train/export_vision.py data/onnx
"""
import sys
import torch
import torchvision

MODELS = ["vit_b_16", "swin_t", "convnext_tiny"]


def main(out):
    torch.manual_seed(0)
    for name in MODELS:
        m = getattr(torchvision.models, name)().eval()
        x = torch.randn(1, 3, 224, 224)
        path = f"{out}/{name}.onnx"
        torch.onnx.export(
            m, (x,), path, dynamo=False, opset_version=20, export_params=False,
            input_names=["x"], dynamic_axes={"x": {0: "batch"}},
        )
        print(path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/onnx")
