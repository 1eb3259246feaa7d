#!/usr/bin/python3
"""PyTorch eager baseline for `tools/train --preset bench`.

The same GPT as models/gpt at the bench preset: pre-LayerNorm blocks, learned
position embeddings, GELU (tanh), biases on every linear layer, causal
self-attention, output layer tied to the word embedding; AdamW (betas 0.9 /
0.95, weight decay 0.01), global gradient-norm clip 1.0, micro-batch 4 x
sequence 512, vocabulary 8192, random tokens (as --mock-data). Written for this
project; run with Debian's /usr/bin/python3 and python3-torch (1.13).

Prints one line per precision:
  pytorch <fp32|bf16> tokens/s: <value> TFLOP/s: <value> step_ms: <value>
where TFLOP/s counts the same model FLOPs as tools/train's MFU.
"""

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):

  def __init__(self, hidden, heads):
    super().__init__()
    self.heads = heads
    self.qkv = nn.Linear(hidden, 3 * hidden)
    self.proj = nn.Linear(hidden, hidden)

  def forward(self, x):
    b, s, h = x.shape
    d = h // self.heads
    q, k, v = self.qkv(x).view(b, s, 3, self.heads, d).permute(2, 0, 3, 1, 4)
    if hasattr(F, "scaled_dot_product_attention"):  # PyTorch >= 2.0
      ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:  # 1.13: explicit causal softmax attention
      scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
      mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
      scores = scores.masked_fill(mask, float("-inf"))
      ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
    return self.proj(ctx.transpose(1, 2).reshape(b, s, h))


class Block(nn.Module):

  def __init__(self, hidden, heads, ffn):
    super().__init__()
    self.ln1 = nn.LayerNorm(hidden, eps=1e-5)
    self.attn = Attention(hidden, heads)
    self.ln2 = nn.LayerNorm(hidden, eps=1e-5)
    self.fc1 = nn.Linear(hidden, ffn)
    self.fc2 = nn.Linear(ffn, hidden)

  def forward(self, x):
    x = x + self.attn(self.ln1(x))
    return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):

  def __init__(self, layers, hidden, heads, vocab, seq):
    super().__init__()
    self.wte = nn.Embedding(vocab, hidden)
    self.wpe = nn.Embedding(seq, hidden)
    self.blocks = nn.ModuleList(
        [Block(hidden, heads, 4 * hidden) for _ in range(layers)])
    self.ln_f = nn.LayerNorm(hidden, eps=1e-5)
    for m in self.modules():
      if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
      if isinstance(m, nn.Linear):
        nn.init.zeros_(m.bias)

  def forward(self, tokens):
    pos = torch.arange(tokens.shape[1], device=tokens.device)
    x = self.wte(tokens) + self.wpe(pos)
    for block in self.blocks:
      x = block(x)
    return F.linear(self.ln_f(x), self.wte.weight)  # tied output layer


def flops_per_token(layers, hidden, vocab, seq):
  """Model FLOPs per token as training/metrics.cc counts them."""
  gemm = hidden * 3 * hidden + hidden * hidden + 2 * hidden * 4 * hidden
  attention = 2.0 * seq * hidden
  return 3.0 * 2.0 * (layers * (gemm + attention) + hidden * vocab)


def run(args, precision):
  torch.manual_seed(1234)
  model = GPT(args.layers, args.hidden, args.heads, args.vocab, args.seq)
  decay = [p for p in model.parameters() if p.dim() == 2]
  no_decay = [p for p in model.parameters() if p.dim() != 2]
  opt_kwargs = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
  try:
    opt = torch.optim.AdamW([{
        "params": decay,
        "weight_decay": 0.01
    }, {
        "params": no_decay,
        "weight_decay": 0.0
    }],
                            foreach=True,
                            **opt_kwargs)
  except TypeError:  # no foreach argument
    opt = torch.optim.AdamW([{
        "params": decay,
        "weight_decay": 0.01
    }, {
        "params": no_decay,
        "weight_decay": 0.0
    }], **opt_kwargs)
  gen = torch.Generator().manual_seed(1)

  def step():
    data = torch.randint(0, args.vocab, (args.batch, args.seq + 1),
                         generator=gen)
    tokens, labels = data[:, :-1], data[:, 1:]
    with torch.autocast(device_type="cpu",
                        dtype=torch.bfloat16,
                        enabled=(precision == "bf16")):
      logits = model(tokens)
    loss = F.cross_entropy(logits.float().view(-1, args.vocab),
                           labels.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()

  for _ in range(args.warmup):
    step()
  times = []
  for _ in range(args.iters):
    t0 = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - t0)
  seconds = sum(times) / len(times)
  tokens = args.batch * args.seq
  tflops = flops_per_token(args.layers, args.hidden, args.vocab,
                           args.seq) * tokens / seconds / 1e12
  print(f"pytorch {precision} tokens/s: {tokens / seconds:.1f} "
        f"TFLOP/s: {tflops:.4f} step_ms: {seconds * 1e3:.1f} "
        f"best_step_ms: {min(times) * 1e3:.1f} loss: {loss:.4f}",
        flush=True)


def blas_library():
  """The BLAS this process loaded (Debian's torch uses libblas.so.3)."""
  torch.ones(64, 64) @ torch.ones(64, 64)
  try:
    with open("/proc/self/maps") as maps:
      libs = {line.split()[-1] for line in maps if "blas" in line}
    return ", ".join(sorted(libs)) or "built in"
  except OSError:
    return "unknown"


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--precision", default="fp32,bf16",
                 help="comma list of fp32, bf16")
  p.add_argument("--threads", type=int, default=2)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--iters", type=int, default=5)
  p.add_argument("--layers", type=int, default=6)
  p.add_argument("--hidden", type=int, default=512)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--vocab", type=int, default=8192)
  p.add_argument("--seq", type=int, default=512)
  p.add_argument("--batch", type=int, default=4)
  args = p.parse_args()
  torch.set_num_threads(args.threads)
  print(f"pytorch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"BLAS: {blas_library()}",
        flush=True)
  for precision in args.precision.split(","):
    run(args, precision.strip())


if __name__ == "__main__":
  main()
