#!/usr/bin/env python3
"""Writes fixture.safetensors from the format's specification with the Python
standard library only (no safetensors or torch package), as an independent
check of //checkpoint:safetensors. safetensors_test.cc holds the same values.

Run: python3 checkpoint/testdata/make_safetensors_fixture.py
"""
import json
import os
import struct

tensors = []  # (name, dtype, shape, bytes)

f32 = [i * 0.5 - 1.0 for i in range(6)]
tensors.append(("layer.f32", "F32", [2, 3], struct.pack("<6f", *f32)))
bf16 = [1.0, -2.5, 0.15625, 3.0e38]
bf16_bits = [struct.unpack("<I", struct.pack("<f", v))[0] >> 16 for v in bf16]
tensors.append(("layer.bf16", "BF16", [4], struct.pack("<4H", *bf16_bits)))
f16 = [0.5, -1.0, 65504.0]
tensors.append(("f16", "F16", [3], struct.pack("<3e", *f16)))
i64 = [-7, 0, 1 << 40, 12345]
tensors.append(("ints.i64", "I64", [2, 2], struct.pack("<4q", *i64)))
i32 = [-3, -2, -1, 0, 1]
tensors.append(("ints.i32", "I32", [5], struct.pack("<5i", *i32)))
tensors.append(("empty", "F32", [0, 4], b""))

header = {}
data = b""
# Data in the order above; header keys in another order (readers must not
# care), with __metadata__ in the middle.
entries = {}
for name, dtype, shape, raw in tensors:
    entries[name] = {"dtype": dtype, "shape": shape,
                     "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
for name in sorted(entries, reverse=True)[:3]:
    header[name] = entries[name]
header["__metadata__"] = {"format": "pt", "note": "quote \" and \u00e9"}
for name in sorted(entries, reverse=True)[3:]:
    header[name] = entries[name]

text = json.dumps(header, separators=(",", ":")).encode("utf-8")
text += b" " * ((8 - len(text) % 8) % 8)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                   "fixture.safetensors")
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    f.write(data)
print("wrote", out, 8 + len(text) + len(data), "bytes")
