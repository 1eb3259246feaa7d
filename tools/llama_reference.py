#!/usr/bin/python3
"""A plain PyTorch reference of Hugging Face's LlamaForCausalLM forward pass.

Written from the architecture's definition (no transformers import): token
embedding; per layer RMSNorm, rotary positions in the rotate-half form (dim i
paired with i + head_dim / 2), grouped-query causal attention (query head j
reads K/V head j // (heads / kv_heads)), residual, RMSNorm, SwiGLU MLP
(down(silu(gate(x)) * up(x))), residual; final RMSNorm; untied lm_head.
Computed in float64.

  llama_reference.py write DIR --prompt-ids '1 5 9' --new 8
      random weights saved as a Hugging Face model directory (config.json,
      two safetensors shards and model.safetensors.index.json, written by
      hand with struct and json); prints one JSON line: the prompt's
      next-token loss, the greedy continuation and its smallest top-1/top-2
      logit margin.
  llama_reference.py same DIR_A DIR_B
      exits 0 when both directories hold the same tensors, bit for bit.
"""

import argparse
import json
import math
import os
import struct
import sys

import torch

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 50000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}

_DTYPES = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2),
           "F16": (torch.float16, 2)}


def random_weights(c, seed):
    """Weights scaled so activations and logits are O(1): greedy choices
    are then far from ties."""
    g = torch.Generator().manual_seed(seed)
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    d = h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * d

    def normal(*shape, std):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    def norm_weight():
        return 1.0 + normal(h, std=0.1)

    w = {"model.embed_tokens.weight": normal(v, h, std=1.0)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight()
        w[p + "self_attn.q_proj.weight"] = normal(h, h, std=h ** -0.5)
        w[p + "self_attn.k_proj.weight"] = normal(kv, h, std=h ** -0.5)
        w[p + "self_attn.v_proj.weight"] = normal(kv, h, std=h ** -0.5)
        w[p + "self_attn.o_proj.weight"] = normal(h, h, std=h ** -0.5)
        w[p + "post_attention_layernorm.weight"] = norm_weight()
        w[p + "mlp.gate_proj.weight"] = normal(f, h, std=h ** -0.5)
        w[p + "mlp.up_proj.weight"] = normal(f, h, std=h ** -0.5)
        w[p + "mlp.down_proj.weight"] = normal(h, f, std=f ** -0.5)
    w["model.norm.weight"] = norm_weight()
    w["lm_head.weight"] = normal(v, h, std=h ** -0.5)
    # What the file holds is fp32: the reference computes with those values.
    return {k: t.to(torch.float32).to(torch.float64) for k, t in w.items()}


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def forward(w, c, ids):
    """Logits [s, vocab] of one sequence of token ids."""
    h = c["hidden_size"]
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    d = h // heads
    s = len(ids)
    eps = c["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    inv_freq = 1.0 / (c["rope_theta"] ** (
        torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = torch.outer(torch.arange(s, dtype=torch.float64), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)  # [s, d]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    causal = torch.full((s, s), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        y = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (y @ w[p + "self_attn.q_proj.weight"].T).view(s, heads, d)
        k = (y @ w[p + "self_attn.k_proj.weight"].T).view(s, kv_heads, d)
        v = (y @ w[p + "self_attn.v_proj.weight"].T).view(s, kv_heads, d)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = heads // kv_heads
        k = k.repeat_interleave(rep, dim=1)  # query head j -> kv head j//rep
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d) + causal
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
        x = x + attn.reshape(s, h) @ w[p + "self_attn.o_proj.weight"].T
        y = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = y @ w[p + "mlp.gate_proj.weight"].T
        up = y @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ \
            w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = t.to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, size = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype)
        out[name] = t.reshape(info["shape"]) if info["shape"] else t
    return out


def read_dir(path):
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors(os.path.join(path, "model.safetensors"))
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for name in files:
        out.update(read_safetensors(os.path.join(path, name)))
    return out


def write(args):
    c = dict(CONFIG)
    w = random_weights(c, args.seed)
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    # Two shards and their index, as save_pretrained writes large models.
    names = list(w)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(args.dir, file),
                          {n: w[n] for n in part})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * 4 for t in w.values())
    with open(os.path.join(args.dir, "model.safetensors.index.json"),
              "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": weight_map}, f, indent=2)

    ids = [int(x) for x in args.prompt_ids.split()]
    logits = forward(w, c, ids)
    loss = torch.nn.functional.cross_entropy(
        logits[:-1], torch.tensor(ids[1:])).item()
    tokens, margin = list(ids), float("inf")
    for _ in range(args.new):
        last = forward(w, c, tokens)[-1]
        top2 = last.topk(2).values
        margin = min(margin, (top2[0] - top2[1]).item())
        tokens.append(int(last.argmax()))
    print(json.dumps({"loss": loss, "greedy": tokens[len(ids):],
                      "margin": margin}))


def same(args):
    a, b = read_dir(args.a), read_dir(args.b)
    if sorted(a) != sorted(b):
        print("tensor names differ:", sorted(set(a) ^ set(b)))
        return 1
    bad = [n for n in a
           if a[n].shape != b[n].shape or not torch.equal(a[n], b[n])]
    if bad:
        print("tensors differ:", bad)
        return 1
    print(f"{len(a)} tensors identical")
    return 0


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir")
    w.add_argument("--prompt-ids", required=True)
    w.add_argument("--new", type=int, default=8)
    w.add_argument("--seed", type=int, default=2)
    s = sub.add_parser("same")
    s.add_argument("a")
    s.add_argument("b")
    args = parser.parse_args()
    if args.command == "write":
        write(args)
        return 0
    return same(args)


if __name__ == "__main__":
    sys.exit(main())
