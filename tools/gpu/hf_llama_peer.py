#!/usr/bin/env python3
"""The serving peer: a Llama-3-8B-shaped model (32 layers, hidden 4096, 32
heads over 8 KV groups, FFN 14336, vocabulary 128256) with random bf16
weights made on the GPU, generating greedily with transformers' generate
(SDPA attention) at each batch size; prints output tokens/s per batch:

  HF PEER batch 64: 1234.5 tokens/s (128 new tokens after 32 prompt tokens, 6.64 s)
  HF PEER: ok (batch 1: 30.1 tokens/s; batch 64: 1234.5 tokens/s)

Without torch, transformers or CUDA it prints "HF PEER: skipped (...)".
The shape flags exist for rehearsals with a tiny model.
"""
import argparse
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--batches", default="1 64")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    args = p.parse_args()
    try:
        import torch
        import transformers
    except Exception as e:  # noqa: BLE001
        print("HF PEER: skipped (no torch/transformers: %s)" % e)
        return 0
    if not torch.cuda.is_available():
        print("HF PEER: skipped (no CUDA device)")
        return 0
    cfg = transformers.LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
        max_position_embeddings=8192, rope_theta=500000.0,
        tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    start = time.time()
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg)
    model.eval()
    print("HF PEER model: %.2f B parameters on %s in %.1f s (transformers %s, "
          "torch %s)" % (sum(x.numel() for x in model.parameters()) / 1e9,
                         torch.cuda.get_device_name(0), time.time() - start,
                         transformers.__version__, torch.__version__))
    results = []
    for b in [int(x) for x in args.batches.split()]:
        ids = torch.randint(0, args.vocab, (b, args.prompt_tokens),
                            device="cuda")
        mask = torch.ones_like(ids)
        kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0,
                  eos_token_id=None)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
            torch.cuda.synchronize()
            t0 = time.time()
            out = model.generate(ids, max_new_tokens=args.new_tokens,
                                 min_new_tokens=args.new_tokens, **kw)
            torch.cuda.synchronize()
            dt = time.time() - t0
        new = (out.shape[1] - args.prompt_tokens) * b
        rate = new / dt
        results.append((b, rate))
        print("HF PEER batch %d: %.1f tokens/s (%d new tokens after %d "
              "prompt tokens, %.2f s)" % (b, rate, args.new_tokens,
                                          args.prompt_tokens, dt))
        sys.stdout.flush()
    print("HF PEER: ok (%s)" % "; ".join("batch %d: %.1f tokens/s" % r
                                        for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
