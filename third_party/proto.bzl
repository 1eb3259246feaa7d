"""cc_proto: runs the system protoc and yields a cc_library.

Bazel 4's native proto rules need the protobuf source repository, which we do
not download; Debian's protoc and libprotobuf do the same job.
"""

PROTOC = "/usr/bin/protoc"

def cc_proto(name, srcs, deps = [], **kwargs):
    """srcs: .proto files in this package; deps: other cc_proto targets."""
    pkg = native.package_name()
    outs = []
    for src in srcs:
        stem = src.rsplit(".", 1)[0]
        outs += [stem + ".pb.h", stem + ".pb.cc"]
    native.filegroup(
        name = name + "_protos",
        srcs = srcs + [d + "_protos" for d in deps],
        visibility = kwargs.get("visibility"),
    )
    # From another workspace (local_repository(name = "megatron_cpp")) the
    # sources sit under external/megatron_cpp/ and the outputs must too, so
    # that "checkpoint/config.pb.h" resolves there as it does here.
    repo = native.repository_name()
    root = "." if repo == "@" else "external/" + repo[1:]
    native.genrule(
        name = name + "_protoc",
        srcs = [name + "_protos"],
        outs = outs,
        cmd = "%s -I%s --cpp_out=$(GENDIR)/%s %s" % (
            PROTOC,
            root,
            root,
            " ".join(["%s/%s/%s" % (root, pkg, s) if pkg else "%s/%s" % (root, s) for s in srcs]),
        ),
        message = "protoc %s" % " ".join(srcs),
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//third_party:protobuf"],
        **kwargs
    )
