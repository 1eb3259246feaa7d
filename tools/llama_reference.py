#!/usr/bin/python3
"""A plain PyTorch reference of Hugging Face's LlamaForCausalLM forward pass,
and of the family members built on it (--family): Llama 3.1's rope_scaling
(type llama3), Qwen2's q/k/v biases with tied embeddings, Qwen3's QK-norm,
Mixtral's sparse mixture-of-experts MLP (mixtral_moe), Qwen2-MoE's
(qwen2_moe_mlp: Qwen2's attention, experts every decoder_sparse_step-th
layer, top-k probabilities not renormalised, a shared expert behind a
sigmoid gate), Mistral's sliding window.

Written from the architecture's definition (no transformers import): token
embedding; per layer RMSNorm, rotary positions in the rotate-half form (dim i
paired with i + head_dim / 2), grouped-query causal attention (query head j
reads K/V head j // (heads / kv_heads)), residual, RMSNorm, SwiGLU MLP
(down(silu(gate(x)) * up(x))), residual; final RMSNorm; untied lm_head.
Computed in float64.

Llama 3.1's scaling, from its definition: with wavelength w = 2 pi / f of
each inverse frequency f and L = original_max_position_embeddings, w <
L / high_freq_factor keeps f, w > L / low_freq_factor gives f / factor, and
between them f is blended as (1 - s) f / factor + s f with s = (L / w -
low_freq_factor) / (high_freq_factor - low_freq_factor). Qwen2 adds biases
to q_proj, k_proj and v_proj (not o_proj). Qwen3 applies an RMSNorm over
each head's head_dim (weights q_norm and k_norm, shared by the heads) to
the projected queries and keys before the rotation. Mistral's
sliding_window W lets query i see keys i - W + 1 .. i only (W keys, itself
included; masking_utils' kv_idx > q_idx - sliding_window).

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

# What each family changes in CONFIG.
FAMILIES = {
    "llama": {},
    # original 64 puts the 8 frequencies of head_dim 16 (base 50000) in all
    # three bands: kept, blended, divided.
    "llama31": {"max_position_embeddings": 256,
                "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64,
                                 "rope_type": "llama3"}},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
              "tie_word_embeddings": True, "use_sliding_window": False},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "head_dim": 16, "attention_bias": False},
    # Every layer a mixture of 4 experts of intermediate_size, top-2.
    "mixtral": {"architectures": ["MixtralForCausalLM"],
                "model_type": "mixtral", "intermediate_size": 48,
                "num_local_experts": 4, "num_experts_per_tok": 2,
                "sliding_window": None, "output_router_logits": False},
    # Layer 1 (decoder_sparse_step 2) a mixture of 4 experts of
    # moe_intermediate_size, top-2, the softmax's top-2 as they are
    # (norm_topk_prob false), plus a shared expert scaled by
    # sigmoid(shared_expert_gate . x); layer 0 a dense MLP of
    # intermediate_size.
    "qwen2_moe": {"architectures": ["Qwen2MoeForCausalLM"],
                  "model_type": "qwen2_moe", "intermediate_size": 96,
                  "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 48,
                  "norm_topk_prob": False, "decoder_sparse_step": 2,
                  "mlp_only_layers": [], "use_sliding_window": False,
                  "output_router_logits": False},
    # A window of 6 keys, shorter than the 22 positions the test runs.
    "mistral": {"architectures": ["MistralForCausalLM"],
                "model_type": "mistral", "head_dim": 16, "sliding_window": 6},
}

# Seeds whose greedy continuations keep their top two logits apart (the
# test needs a margin over 1e-2); Qwen2's tied head repeats tokens, seed 3
# changes token once.
FAMILY_SEEDS = {"llama": 2, "llama31": 2, "qwen2": 3, "qwen3": 3,
                "mixtral": 2, "qwen2_moe": 7, "mistral": 8}

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

    # Tied: the embedding is the output layer too; smaller rows keep the
    # logits O(1).
    tied = c["tie_word_embeddings"]
    w = {"model.embed_tokens.weight": normal(v, h, std=0.2 if tied else 1.0)}
    # Llama 3.1: sharper attention, so that the positions (and the scaled
    # frequencies) move the logits well beyond the test's tolerance.
    # Mistral: the same, so that the keys the window hides matter.
    sharp = c.get("rope_scaling") or c.get("sliding_window")
    qk_std = (4.0 if sharp else 1.0) * h ** -0.5
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight()
        w[p + "self_attn.q_proj.weight"] = normal(h, h, std=qk_std)
        w[p + "self_attn.k_proj.weight"] = normal(kv, h, std=qk_std)
        w[p + "self_attn.v_proj.weight"] = normal(kv, h, std=h ** -0.5)
        w[p + "self_attn.o_proj.weight"] = normal(h, h, std=h ** -0.5)
        if c["model_type"] in ("qwen2", "qwen2_moe"):
            w[p + "self_attn.q_proj.bias"] = normal(h, std=0.5)
            w[p + "self_attn.k_proj.bias"] = normal(kv, std=0.5)
            w[p + "self_attn.v_proj.bias"] = normal(kv, std=0.5)
        if c["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = 1.0 + normal(d, std=0.2)
            w[p + "self_attn.k_norm.weight"] = 1.0 + normal(d, std=0.2)
        w[p + "post_attention_layernorm.weight"] = norm_weight()
        if c["model_type"] == "mixtral":
            m = p + "block_sparse_moe."
            # A sharper router, so each token's top two stand apart.
            w[m + "gate.weight"] = normal(c["num_local_experts"], h,
                                          std=2.0 * h ** -0.5)
            for e in range(c["num_local_experts"]):
                x = f"{m}experts.{e}."
                w[x + "w1.weight"] = normal(f, h, std=h ** -0.5)
                w[x + "w2.weight"] = normal(h, f, std=f ** -0.5)
                w[x + "w3.weight"] = normal(f, h, std=h ** -0.5)
            continue
        if is_qwen2_moe_layer(c, i):
            m = p + "mlp."
            fm, fs = c["moe_intermediate_size"], \
                c["shared_expert_intermediate_size"]
            w[m + "gate.weight"] = normal(c["num_experts"], h,
                                          std=2.0 * h ** -0.5)
            for e in range(c["num_experts"]):
                x = f"{m}experts.{e}."
                w[x + "gate_proj.weight"] = normal(fm, h, std=h ** -0.5)
                w[x + "up_proj.weight"] = normal(fm, h, std=h ** -0.5)
                w[x + "down_proj.weight"] = normal(h, fm, std=fm ** -0.5)
            x = m + "shared_expert."
            w[x + "gate_proj.weight"] = normal(fs, h, std=h ** -0.5)
            w[x + "up_proj.weight"] = normal(fs, h, std=h ** -0.5)
            w[x + "down_proj.weight"] = normal(h, fs, std=fs ** -0.5)
            w[m + "shared_expert_gate.weight"] = normal(1, h, std=h ** -0.5)
            continue
        w[p + "mlp.gate_proj.weight"] = normal(f, h, std=h ** -0.5)
        w[p + "mlp.up_proj.weight"] = normal(f, h, std=h ** -0.5)
        w[p + "mlp.down_proj.weight"] = normal(h, f, std=f ** -0.5)
    w["model.norm.weight"] = norm_weight()
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(v, h, std=h ** -0.5)
    # What the file holds is fp32: the reference computes with those values.
    return {k: t.to(torch.float32).to(torch.float64) for k, t in w.items()}


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def inverse_frequencies(c, d):
    f = 1.0 / (c["rope_theta"] ** (
        torch.arange(0, d, 2, dtype=torch.float64) / d))
    r = c.get("rope_scaling")
    if not r:
        return f
    assert r["rope_type"] == "llama3", r
    out = []
    for x in f.tolist():
        wavelen = 2 * math.pi / x
        big = r["original_max_position_embeddings"]
        if wavelen < big / r["high_freq_factor"]:
            out.append(x)
        elif wavelen > big / r["low_freq_factor"]:
            out.append(x / r["factor"])
        else:
            s = (big / wavelen - r["low_freq_factor"]) / (
                r["high_freq_factor"] - r["low_freq_factor"])
            out.append((1 - s) * x / r["factor"] + s * x)
    return torch.tensor(out, dtype=torch.float64)


def forward(w, c, ids):
    """Logits [s, vocab] of one sequence of token ids."""
    h = c["hidden_size"]
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    d = h // heads
    s = len(ids)
    eps = c["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    inv_freq = inverse_frequencies(c, d)
    angles = torch.outer(torch.arange(s, dtype=torch.float64), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)  # [s, d]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    causal = torch.full((s, s), float("-inf"), dtype=torch.float64).triu(1)
    window = c.get("sliding_window")
    if window:  # Keys j <= i - window are hidden too.
        causal = causal + torch.full(
            (s, s), float("-inf"), dtype=torch.float64).tril(-window)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        y = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = y @ w[p + "self_attn.q_proj.weight"].T
        k = y @ w[p + "self_attn.k_proj.weight"].T
        v = y @ w[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in w:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q, k, v = q.view(s, heads, d), k.view(s, kv_heads, d), \
            v.view(s, kv_heads, d)
        if p + "self_attn.q_norm.weight" in w:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = heads // kv_heads
        k = k.repeat_interleave(rep, dim=1)  # query head j -> kv head j//rep
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d) + causal
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
        x = x + attn.reshape(s, h) @ w[p + "self_attn.o_proj.weight"].T
        y = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if c["model_type"] == "mixtral":
            x = x + mixtral_moe(w, c, p + "block_sparse_moe.", y)
            continue
        if is_qwen2_moe_layer(c, i):
            x = x + qwen2_moe_mlp(w, c, p + "mlp.", y)
            continue
        gate = y @ w[p + "mlp.gate_proj.weight"].T
        up = y @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ \
            w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def mixtral_moe(w, c, m, y):
    """Mixtral's sparse MLP: softmax over the router's logits, the top
    num_experts_per_tok experts with their probabilities renormalised to 1,
    and each chosen expert's SwiGLU MLP (w2(silu(w1 y) * w3 y)) summed with
    those weights."""
    probs = (y @ w[m + "gate.weight"].T).softmax(-1)
    top, chosen = probs.topk(c["num_experts_per_tok"], dim=-1)
    top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(y)
    for t in range(y.shape[0]):
        for j in range(chosen.shape[1]):
            x = f"{m}experts.{int(chosen[t, j])}."
            hidden = torch.nn.functional.silu(y[t] @ w[x + "w1.weight"].T) * \
                (y[t] @ w[x + "w3.weight"].T)
            out[t] += top[t, j] * (hidden @ w[x + "w2.weight"].T)
    return out


def is_qwen2_moe_layer(c, i):
    """Qwen2-MoE's sparse layers: every decoder_sparse_step-th, counted from
    1, that mlp_only_layers does not name."""
    return c["model_type"] == "qwen2_moe" and \
        i not in c["mlp_only_layers"] and \
        (i + 1) % c["decoder_sparse_step"] == 0


def swiglu_mlp(w, x, y):
    return (torch.nn.functional.silu(y @ w[x + "gate_proj.weight"].T) *
            (y @ w[x + "up_proj.weight"].T)) @ w[x + "down_proj.weight"].T


def qwen2_moe_mlp(w, c, m, y):
    """Qwen2-MoE's sparse MLP: the softmax over the router's logits, its top
    num_experts_per_tok probabilities (renormalised to 1 only with
    norm_topk_prob), each chosen expert's SwiGLU MLP summed with them; plus
    the shared expert's SwiGLU MLP times sigmoid(y . shared_expert_gate)."""
    probs = (y @ w[m + "gate.weight"].T).softmax(-1)
    top, chosen = probs.topk(c["num_experts_per_tok"], dim=-1)
    if c["norm_topk_prob"]:
        top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(y)
    for t in range(y.shape[0]):
        for j in range(chosen.shape[1]):
            x = f"{m}experts.{int(chosen[t, j])}."
            out[t] += top[t, j] * swiglu_mlp(w, x, y[t])
    gate = torch.sigmoid(y @ w[m + "shared_expert_gate.weight"].T)  # [s, 1]
    return out + gate * swiglu_mlp(w, m + "shared_expert.", y)


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
    c.update(FAMILIES[args.family])
    seed = args.seed if args.seed is not None else FAMILY_SEEDS[args.family]
    w = random_weights(c, seed)
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
    w.add_argument("--seed", type=int, default=None)
    w.add_argument("--family", choices=sorted(FAMILIES), default="llama")
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
