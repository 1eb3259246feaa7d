"""cuda_library: compiles .cu files with nvcc into an ordinary cc_library.

Each .cu file becomes one position-independent object built for sm_80 and
sm_90 with PTX for compute_90, so newer GPUs JIT from the PTX. The .cu files
should include only their own headers, headers listed in `hdrs` or
`textual_hdrs`, and CUDA's: nvcc runs in a sandbox that sees declared inputs
only.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

CUDA_ARCH_FLAGS = " ".join([
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
])

def cuda_library(name, srcs, hdrs = [], textual_hdrs = [], deps = [], nvcc_flags = [], **kwargs):
    # From another workspace the sources sit under external/<repo>/, and
    # their includes ("core/ops/cuda/...") resolve from there.
    repo = native.repository_name()
    root = "." if repo == "@" else "external/" + repo[1:]
    objects = []
    for src in srcs:
        stem = src.replace("/", "_").rsplit(".", 1)[0]
        obj = "_%s_%s.pic.o" % (name, stem)
        native.genrule(
            name = "_%s_%s_nvcc" % (name, stem),
            srcs = [src] + hdrs + textual_hdrs,
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-std=c++17",
                "-O3",
                "-Xcompiler=-fPIC",
                "-I" + root,
                "-I$(GENDIR)/" + root,
                CUDA_ARCH_FLAGS,
            ] + nvcc_flags + [
                "-c",
                "$(location %s)" % src,
                "-o",
                "$@",
            ]),
            message = "nvcc %s" % src,
            tags = kwargs.get("tags", []),
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        textual_hdrs = textual_hdrs,
        deps = deps + ["//third_party:cuda_runtime"],
        alwayslink = True,
        **kwargs
    )
