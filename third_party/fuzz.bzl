"""cc_fuzz_test: one libFuzzer entry point, two binaries.

cc_fuzz_test(name = "foo_fuzz_test", srcs = ["foo_fuzz.cc"], corpus = [...])
makes
  foo_fuzz_test         a cc_test under the default toolchain (gcc) that
                        replays the seed corpus, the regression inputs and a
                        fixed set of mutations of each through
                        LLVMFuzzerTestOneInput, so `tools/bazel test //...`
                        checks them on every run;
  foo_fuzz_test_fuzzer  the libFuzzer binary under --config=fuzz (clang,
                        ASan+UBSan); under any other config it is the replay
                        binary again, so `bazel build //...` still links.

srcs define `extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t)`
and must return 0; a bug is a crash, a sanitizer report or a CHECK failure.
"""

def cc_fuzz_test(name, srcs, deps = [], corpus = [], data = [], size = "small", **kwargs):
    lib = name + "_entry"
    native.cc_library(
        name = lib,
        testonly = True,
        srcs = srcs,
        deps = deps,
        alwayslink = True,
    )
    native.filegroup(
        name = name + "_corpus",
        testonly = True,
        srcs = corpus,
    )
    native.cc_test(
        name = name,
        size = size,
        args = ["$(rootpaths :%s_corpus)" % name],
        data = [":%s_corpus" % name] + data,
        deps = [
            ":" + lib,
            "//core/testing/fuzz:replay_main",
        ],
        **kwargs
    )
    native.cc_binary(
        name = name + "_fuzzer",
        testonly = True,
        data = [":%s_corpus" % name] + data,
        linkopts = select({
            "//core/testing/fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        tags = ["fuzz_target"],
        deps = [":" + lib] + select({
            "//core/testing/fuzz:libfuzzer": [],
            "//conditions:default": ["//core/testing/fuzz:replay_main"],
        }),
    )
