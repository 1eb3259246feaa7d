"""GPT-2 124M trained in the GPU machine's own PyTorch, as the peer of
tools/gpu/check_gpt2_throughput.sh (run_checks.sh's pytorch_peer section).

The same model and batch as train's throughput run: 12 layers, hidden 768,
12 heads, sequence 1024, vocabulary 50304, learned positions, tied
embeddings, pre-LayerNorm, GELU (tanh), no dropout; random tokens; bf16
autocast, fused AdamW, F.scaled_dot_product_attention (causal). Timed eager,
then under torch.compile, each after warm-up steps, CUDA-synchronised.
Prints one line per mode and ends with one summary line:
  PYTORCH eager: 301234 tokens/s (micro-batch 16, 5 timed steps, step 54.4 ms)
  PYTORCH compile: 412345 tokens/s (...)
  PYTORCH PEER: ok (eager 301234 tokens/s, compile 412345 tokens/s)
  PYTORCH PEER: skipped (no torch: ...)

  python3 tools/gpu/torch_gpt2_peer.py --micro-batch 16 [--budget 90]
"""

import argparse
import math
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--budget", type=float, default=90.0,
                        help="seconds for everything; a mode not started in time is left out")
    args = parser.parse_args()
    start = time.time()

    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError as e:
        print(f"PYTORCH PEER: skipped (no torch: {e})")
        return 0
    if not torch.cuda.is_available():
        print("PYTORCH PEER: skipped (no CUDA device for torch "
              f"{torch.__version__})")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name(0)}", flush=True)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(args.hidden)
            self.qkv = nn.Linear(args.hidden, 3 * args.hidden)
            self.proj = nn.Linear(args.hidden, args.hidden)
            self.ln2 = nn.LayerNorm(args.hidden)
            self.fc = nn.Linear(args.hidden, 4 * args.hidden)
            self.fc2 = nn.Linear(4 * args.hidden, args.hidden)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
            shape = (b, s, args.heads, h // args.heads)
            q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, h))
            return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(args.vocab, args.hidden)
            self.wpe = nn.Embedding(args.seq, args.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.ln_f = nn.LayerNorm(args.hidden)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # Tied embeddings.
            return F.cross_entropy(logits.float().view(-1, args.vocab),
                                   targets.view(-1))

    results = {}
    for mode in args.modes.split(","):
        if time.time() - start > args.budget * 0.5 and results:
            print(f"PYTORCH {mode}: not run (half of the {args.budget:.0f} s budget spent)")
            continue
        torch.manual_seed(1234)
        model = Gpt().cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        step_model = torch.compile(model) if mode == "compile" else model
        gen = torch.Generator(device="cuda").manual_seed(5)
        tokens = torch.randint(0, args.vocab, (args.micro_batch, args.seq + 1),
                               device="cuda", generator=gen)
        idx, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        losses = []
        times = []
        try:
            for step in range(args.warmup + args.steps):
                torch.cuda.synchronize()
                t0 = time.time()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = step_model(idx, targets)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss.item())  # Synchronises.
                if step >= args.warmup:
                    times.append(time.time() - t0)
                if time.time() - start > args.budget:
                    break
        except torch.cuda.OutOfMemoryError:
            print(f"PYTORCH {mode}: out of memory at micro-batch {args.micro_batch}")
            del model, optimizer, step_model
            torch.cuda.empty_cache()
            continue
        if not times or not all(math.isfinite(v) for v in losses):
            print(f"PYTORCH {mode}: no timed step (losses {losses})")
            continue
        step_s = sum(times) / len(times)
        rate = args.micro_batch * args.seq / step_s
        results[mode] = rate
        print(f"PYTORCH {mode}: {rate:.0f} tokens/s (micro-batch {args.micro_batch}, "
              f"{len(times)} timed steps, step {step_s * 1e3:.1f} ms, "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, peak memory "
              f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB)", flush=True)
        del model, optimizer, step_model
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    if not results:
        print("PYTORCH PEER: FAILED (no mode ran)")
        return 1
    print("PYTORCH PEER: ok (" +
          ", ".join(f"{m} {r:.0f} tokens/s" for m, r in results.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
