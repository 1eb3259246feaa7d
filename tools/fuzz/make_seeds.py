#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets that are made from test data
rather than copied from it: the store's request sequences, a slice of GPT-2's vocabulary (data/gpt2), the
jsonl fixture's records, and .idx/.bin pairs like the ones the tests build.
Run from the repository root; the output is checked in under
<pkg>/fuzz/corpus/<target>/."""

import json
import os
import struct

SEP = b"\n~~~~~~~~\n"  # core/testing/fuzz/fuzz_input.h kPartSeparator


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def gpt2_slice(merges_wanted):
    """The 256 byte tokens, <|endoftext|> and the first merges of GPT-2."""
    with open("data/gpt2/encoder.json", encoding="utf-8") as f:
        encoder = json.load(f)
    with open("data/gpt2/vocab.bpe", encoding="utf-8") as f:
        lines = [l for l in f.read().split("\n") if l and not l.startswith("#")]
    by_id = sorted(encoder.items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in by_id[:256]]
    merges = []
    for line in lines[:merges_wanted]:
        left, right = line.split(" ")
        merges.append(line)
        if left + right not in tokens:
            tokens.append(left + right)
    tokens.append("<|endoftext|>")
    vocab = json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False)
    merge_text = "#version: 0.2\n" + "\n".join(merges) + "\n"
    return vocab.encode("utf-8"), merge_text.encode("utf-8")


def idx_bin(docs, dtype_code=8, item=2, fmt="<H"):
    """Megatron MMIDIDX index and .bin for documents of one sequence each."""
    bin_bytes = b"".join(struct.pack(fmt, t) for d in docs for t in d)
    lengths, pointers, ptr = [], [], 0
    for d in docs:
        lengths.append(len(d))
        pointers.append(ptr)
        ptr += len(d) * item
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, dtype_code, len(docs),
                                           len(docs) + 1)
    idx += b"".join(struct.pack("<i", n) for n in lengths)
    idx += b"".join(struct.pack("<q", p) for p in pointers)
    idx += b"".join(struct.pack("<q", i) for i in range(len(docs) + 1))
    return idx + SEP + bin_bytes


def hf_slice(name, merges_wanted):
    """data/testdata/<name>.json (a tokenizer.json) cut to its first merges,
    with the added tokens renumbered after them."""
    with open(f"data/testdata/{name}.json", encoding="utf-8") as f:
        doc = json.load(f)
    model = doc["model"]
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    vocab = {t: i for t, i in by_id[:256]}
    merges = model["merges"][:merges_wanted]
    for m in merges:
        a, b = m.split(" ") if isinstance(m, str) else m
        vocab.setdefault(a + b, len(vocab))
    model["vocab"], model["merges"] = vocab, merges
    for n, t in enumerate(doc["added_tokens"]):
        t["id"] = len(vocab) + n
        if t["content"] in model["vocab"]:
            model["vocab"][t["content"]] = t["id"]
    return json.dumps(doc, ensure_ascii=False).encode("utf-8")


def store_message(op, args):
    """core/comm/store_message.h's wire format."""
    out = op.encode() + struct.pack("<I", len(args))
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += struct.pack("<I", len(a)) + a
    return out


def store_service_seeds():
    """Request sequences for core/comm/fuzz/store_service_fuzz.cc: a config
    byte, then (selector, request) records; selector 0x80 | rank << 2 | s
    authenticates session s, 0x40 | s ends it."""
    records = b"".join(b"\x00" + r for r in (
        store_message("S", ["k", "v"]), store_message("G", ["0", "k"]),
        store_message("A", ["n", "5"]), store_message("W", ["0", "k", "n"]),
        store_message("C", ["k", "x"]), store_message("D", ["k"]),
        store_message("L", []), store_message("B", [])))
    base = "core/comm/fuzz/corpus/store_service/"
    write(base + "open_store_ops", b"\x00" + records)
    write(base + "secret_unauthenticated_ops", b"\x01" + records)
    write(base + "secret_authenticated_ops",
          b"\x01" + bytes([0x80 | 3 << 2]) + records +
          b"\x41" + b"\x01" + store_message("S", ["k", "v"]))
    write(base + "small_cap",
          b"\x02\x00" + store_message("S", ["a", "x" * 3000]) +
          b"\x00" + store_message("S", ["b", "y" * 3000]) +
          b"\x00" + store_message("A", ["a", "1"]))
    write(base + "bad_hellos",
          b"\x01\x00" + store_message("N", []) +
          b"\x00" + store_message("H", ["1", "fuzz-job", "x" * 32]) +
          b"\x01" + store_message("H", ["1"]) +
          b"\x02" + store_message("G", ["5"]))
    write(base + "get_without_key", b"\x00\x00" + store_message("G", ["5"]))


def main():
    store_service_seeds()
    texts = []
    with open("data/testdata/gpt2_encoder_fixture.jsonl", encoding="utf-8") as f:
        for n, line in enumerate(f):
            texts.append(json.loads(line)["text"])
            write(f"data/fuzz/corpus/preprocess_record/fixture_{n:02d}",
                  line.rstrip("\n").encode("utf-8"))

    for merges in (0, 20, 60):
        vocab, merge_text = gpt2_slice(merges)
        for n, text in enumerate(texts[:4]):
            write(f"data/fuzz/corpus/tokenizer/gpt2_{merges}_merges_{n}",
                  vocab + SEP + merge_text + SEP + text.encode("utf-8"))

    with open("data/testdata/multilingual.txt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    for name in ("hf_gpt2_small", "hf_llama3_small", "hf_qwen2_small"):
        for merges in (0, 40):
            for n, text in enumerate(lines[:4]):
                write(f"data/fuzz/corpus/hf_tokenizer/{name}_{merges}_{n}",
                      hf_slice(name, merges) + SEP + text.encode("utf-8"))
    write("data/fuzz/corpus/hf_tokenizer/hf_llama3_small_special",
          hf_slice("hf_llama3_small", 40) + SEP +
          "<|begin_of_text|>Hi<|eot_id|> x<|eot|>tool_call\n\n 123456".encode())

    write("data/fuzz/corpus/indexed_dataset/uint16_two_docs",
          idx_bin([[1, 2, 3], [4, 5]]))
    write("data/fuzz/corpus/indexed_dataset/uint16_empty_doc",
          idx_bin([[7], [], [8, 9, 10]]))
    write("data/fuzz/corpus/indexed_dataset/int32",
          idx_bin([[70000, 1], [2]], dtype_code=4, item=4, fmt="<i"))
    write("data/fuzz/corpus/indexed_dataset/uint8",
          idx_bin([[255, 0, 1]], dtype_code=1, item=1, fmt="<B"))


if __name__ == "__main__":
    main()
