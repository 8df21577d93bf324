"""Training memory of transformer language models measured on a CPU, in the
three precisions `--carma-precision` names: the peak of live tensor bytes
during one Adam training step (the second, so that Adam's state exists),
read from the PyTorch profiler's memory events, plus the weights, Adam state
and batch alive before it: cpu_peaks.py's measurement (image models).

- fp32: the model and Adam in fp32;
- mixed: fp32 model and Adam, the forward pass under bf16 autocast (the CPU's
  autocast: its op lists are close to, not the same as, CUDA's);
- bf16: the model, and so Adam's state, in bf16.

Rows named by a `workload` are the CARMA paper's, built as its scripts build
them (github.com/ehsanyousefzadehasl/CARMA, workloads/BERT_*_on_wiki.py:
BertForMaskedLM from a BertConfig, vocabulary 28996, sequences padded to
512). The A100 measured them at batch 32 and 8, which does not fit this
machine's memory and time, so those are measured at two smaller batches and
extrapolated linearly to the paper's batch (`extrapolated_from`); their
ratio to the A100's peak bounds the GPU peak of the other rows
(estimator/tests/lm_cpu.rs).

Attention runs as PyTorch's fused kernel, as on the GPU that measured the
paper's rows (SDPA modules in their listings; memory-efficient attention
takes padding masks and dropout and keeps no probabilities). A CPU has only
a flash kernel, without masks or dropout: so no mask is passed and attention
dropout is off here (the other dropouts stay). With either, the CPU falls
back to composite attention and keeps every probability: the paper's
BERT-base then measures 935-992 MiB per sample here against 535 on the
A100.

XLNet rows (the paper's xlnet-*-cased jobs: XLNetForSequenceClassification,
sequences of 512) are measured with dropout as CUDA keeps it: a CPU's
dropout saves float32 noise (4 B per element) where CUDA's fused kernel
saves a bool mask (1 B), so these rows run torch.native_dropout, which
saves the bool mask on a CPU too (`dropout_kept`: bool). The other rows keep
the CPU's float noise (`float32`): their figures read higher than a GPU
keeps. XLNet's attention has no fused kernel: it keeps its probabilities on
a GPU as here. Measured at batches 1 and 2, extrapolated to 32.

    python3 estimator/train/cpu_peaks_lm.py > data/cpu/lm-training-memory.csv

Needs torch and transformers (CPU is enough; no weights are downloaded).
"""
import json
import os
import sys

import torch

from cpu_peaks import peak_live_bytes  # the same measurement as for image models

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

# The paper's BERT rows: (model file the estimator reads, BertConfig fields,
# the A100's batch, two batches measured here, workload).
PAPER = [
    ("data/carma/model-summaries/BERT_base.model", dict(hidden_size=768, num_hidden_layers=12,
     num_attention_heads=12, intermediate_size=3072), 32, (4, 8), "BERT_base"),
    ("data/carma/model-summaries/BERT_large.model", dict(hidden_size=1024, num_hidden_layers=24,
     num_attention_heads=16, intermediate_size=4096), 8, (2, 4), "BERT_large"),
]

# The paper's XLNet rows: (model file, XLNetConfig fields, batch extrapolated to, batches measured).
XLNET = [
    ("data/carma/model-summaries/xlnet_base_cased.model", dict(d_model=768, n_layer=12, n_head=12, d_inner=3072),
     32, (1, 2)),
    ("data/carma/model-summaries/xlnet_large_cased.model", dict(d_model=1024, n_layer=24, n_head=16, d_inner=4096),
     32, (1, 2)),
]

# Our configs (data/hf/), each precision: (directory, batch, sequence).
OURS = [
    ("data/hf/bert-base", 8, 128),
    ("data/hf/bert-base", 4, 512),
    ("data/hf/gpt2", 8, 128),
    ("data/hf/gpt2", 4, 512),
    ("data/hf/qwen2-0.5b-shape", 1, 256),
]
PRECISIONS = ["fp32", "mixed", "bf16"]


def paper_model(fields):
    from transformers import BertConfig, BertForMaskedLM

    cfg = fused_attention(BertConfig(vocab_size=28996, max_position_embeddings=512, type_vocab_size=2, **fields))
    return BertForMaskedLM(cfg), cfg.vocab_size


def our_model(directory):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    with open(os.path.join(REPO, directory, "config.json")) as f:
        kind = json.load(f)["model_type"]
    cfg = fused_attention(AutoConfig.from_pretrained(os.path.join(REPO, directory)))
    auto = AutoModelForMaskedLM if kind == "bert" else AutoModelForCausalLM
    return auto.from_config(cfg), cfg.vocab_size


def fused_attention(cfg):
    """Attention dropout off, so that the CPU's fused kernel runs."""
    for key in ("attention_probs_dropout_prob", "attn_pdrop", "attention_dropout", "attention_dropout_prob"):
        if hasattr(cfg, key):
            setattr(cfg, key, 0.0)
    return cfg


def xlnet_model(fields):
    from transformers import XLNetConfig, XLNetForSequenceClassification

    cfg = XLNetConfig(vocab_size=32000, ff_activation="gelu", **fields)
    return XLNetForSequenceClassification(cfg), cfg.vocab_size


def cuda_like_dropout(input, p=0.5, training=True, inplace=False):
    """F.dropout as CUDA runs it: the autograd node keeps a bool mask."""
    if not training or p == 0.0:
        return input
    return torch.native_dropout(input, p, True)[0]


def measure(model, vocab, batch, seq, precision, classify=False):
    torch.manual_seed(0)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    opt = torch.optim.Adam(model.parameters())
    ids = torch.randint(0, vocab, (batch, seq))
    # A classifier's inputs as the paper's Trainer passes them (a padding
    # mask, segment ids, one label per sequence); a language model learns
    # its own tokens.
    inputs = dict(input_ids=ids, labels=ids)
    if classify:
        inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids),
                      labels=torch.ones(batch, dtype=torch.long))

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "mixed"):
            # The output kept through the backward pass, as training loops
            # keep theirs (its logits stay alive).
            out = model(**inputs)
        out.loss.backward()
        opt.step()

    params = sum(p.numel() for p in model.parameters())
    width = 2 if precision == "bf16" else 4
    before = 3 * width * params + ids.numel() * 8  # weights, Adam's two moments; the token ids
    return params, (before + peak_live_bytes(step)) / 2**20


def extrapolated(make, small, batch, classify=False):
    """fp32 at 512 tokens, measured at the two batches `small` and
    extrapolated linearly to `batch`: (params, MiB, the points as
    `b1:m1;b2:m2`)."""
    points = []
    for b in small:
        model, vocab = make()
        params, mib = measure(model, vocab, b, 512, "fp32", classify)
        points.append((b, mib))
        del model
    (b1, m1), (b2, m2) = points
    mib = m1 + (m2 - m1) / (b2 - b1) * (batch - b1)
    return params, mib, f"{b1}:{m1:.0f};{b2}:{m2:.0f}"


def main():
    torch.set_num_threads(os.cpu_count() or 1)
    only = sys.argv[1:]  # optional model files/directories to run
    print("model,batch,seq,precision,params,cpu_peak_mib,workload,extrapolated_from,dropout_kept")
    for file, fields, batch, small, workload in PAPER:
        if only and file not in only:
            continue
        params, mib, points = extrapolated(lambda: paper_model(fields), small, batch)
        print(f"{file},{batch},512,fp32,{params},{mib:.0f},{workload},{points},float32", flush=True)
    for file, fields, batch, small in XLNET:
        if only and file not in only:
            continue
        plain = torch.nn.functional.dropout
        torch.nn.functional.dropout = cuda_like_dropout
        try:
            params, mib, points = extrapolated(lambda: xlnet_model(fields), small, batch, classify=True)
        finally:
            torch.nn.functional.dropout = plain
        print(f"{file},{batch},512,fp32,{params},{mib:.0f},,{points},bool", flush=True)
    for directory, batch, seq in OURS:
        if only and directory not in only:
            continue
        for precision in PRECISIONS:
            model, vocab = our_model(directory)
            params, mib = measure(model, vocab, batch, seq, precision)
            del model
            print(f"{directory},{batch},{seq},{precision},{params},{mib:.0f},,,float32", flush=True)


if __name__ == "__main__":
    main()
