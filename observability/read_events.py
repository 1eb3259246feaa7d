"""An independent reader of TensorBoard event files, for the round-trip test.

Decodes the TFRecord framing and checks both masked CRC-32Cs with Debian's
python3-crc32c, and parses each record with Debian's python3-protobuf using
the schema below: TensorFlow's public Event/Summary field numbers, written
here rather than taken from the project's .proto so that a wrong field
number in either shows up.

usage: read_events.py EVENT_FILE TAG=VALUE@STEP ...
Exits non-zero, saying why, unless the file holds exactly the file-version
event followed by those scalars in that order (values compared as fp32).
       read_events.py --dump EVENT_FILE
prints every scalar as "STEP<tab>TAG<tab>VALUE" (CRCs checked the same way).
"""
import os
import struct
import subprocess
import sys
import tempfile

import crc32c

SCHEMA = """
syntax = "proto3";
package reader;
message Summary {
  message Value {
    string tag = 1;
    oneof value { float simple_value = 2; }
  }
  repeated Value value = 1;
}
message Event {
  double wall_time = 1;
  int64 step = 2;
  oneof what { string file_version = 3; Summary summary = 5; }
}
"""


def masked(data):
  crc = crc32c.crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(blob):
  pos = 0
  while pos < len(blob):
    if len(blob) - pos < 12:
      raise ValueError("truncated record header at byte %d" % pos)
    header = blob[pos:pos + 8]
    (length,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
    if header_crc != masked(header):
      raise ValueError("bad length CRC at byte %d" % pos)
    data = blob[pos + 12:pos + 12 + length]
    if len(data) != length or len(blob) < pos + 16 + length:
      raise ValueError("truncated record at byte %d" % pos)
    (data_crc,) = struct.unpack("<I", blob[pos + 12 + length:pos + 16 + length])
    if data_crc != masked(data):
      raise ValueError("bad data CRC at byte %d" % pos)
    yield data
    pos += 16 + length


def main():
  dump = sys.argv[1] == "--dump"
  if dump:
    del sys.argv[1]
  path, expected = sys.argv[1], sys.argv[2:]
  with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "reader.proto"), "w") as f:
      f.write(SCHEMA)
    subprocess.check_call(["protoc", "-I", tmp, "--python_out", tmp,
                           os.path.join(tmp, "reader.proto")])
    sys.path.insert(0, tmp)
    import reader_pb2  # pylint: disable=import-outside-toplevel
    with open(path, "rb") as f:
      blob = f.read()
    events = []
    for data in records(blob):
      e = reader_pb2.Event()
      e.ParseFromString(data)
      events.append(e)
  if not events or events[0].file_version != "brain.Event:2":
    sys.exit("first event is not the file version: %r" % events[:1])
  scalars = []
  for e in events[1:]:
    if e.WhichOneof("what") != "summary" or len(e.summary.value) != 1:
      sys.exit("not a one-scalar summary event: %r" % e)
    if e.wall_time <= 0:
      sys.exit("event without wall time: %r" % e)
    v = e.summary.value[0]
    scalars.append((v.tag, v.simple_value, e.step))
  if dump:
    for tag, value, step in scalars:
      print("%d\t%s\t%r" % (step, tag, value))
    return
  want = []
  for item in expected:
    tag, rest = item.split("=")
    value, step = rest.split("@")
    want.append((tag, struct.unpack("<f", struct.pack("<f", float(value)))[0],
                 int(step)))
  if scalars != want:
    sys.exit("scalars differ:\n got  %r\n want %r" % (scalars, want))
  print("read %d events, %d scalars, all CRCs good" % (len(events),
                                                        len(scalars)))


if __name__ == "__main__":
  main()
