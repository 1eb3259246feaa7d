"""layering_test: every arrow runs down the layers.

The layers, lowest first (DESIGN.md, "Dependencies point one way"):

  0  third_party, core (core/comm, core/ops, core/cuda, core/testing)
  1  parallel, optim, data, checkpoint, observability
  2  models
  3  training, inference, planner
  4  tools, examples, the root package, and any folder not listed below

A package sits in the layer of its top folder. Packages of one layer may
depend on each other (Bazel already refuses cycles). Where the middle
folders sit follows what they depend on today: observability needs only
core (CRC32C moved there), and parallel/pipeline uses it, so it sits with
parallel; planner reads model configs (//models/gpt), so it sits above
models, with training and inference.

The rule (call layering_test() as the last statement of every BUILD file of
LAYERED_PACKAGES; it sees the rules defined above it):
  - Every target that is not a test (libraries, binaries, and the test-only
    ones too: harnesses, *_test_util, testing/ packages, fuzz entries,
    benchmarks) depends, transitively, only on its own layer and lower ones.
    A harness lives in the layer it tests or above it, never below.
  - A test (cc_test, sh_test, fuzz tests) may also depend directly on
    test-only targets of any layer (the harnesses above it, such as
    //training/testing, which is how a parallel parity test trains a GPT),
    and through them on whatever they need; but it names no library or
    binary of a higher layer directly, unless it is listed, with its
    reason, in upward_tests. A listed test that no longer reaches up fails
    the check, so the list only shrinks.
  - Every package a checked package depends on in a layered folder must be in
    LAYERED_PACKAGES (and so call layering_test itself).
"""

# The layer of each top folder; folders not here are in the top layer.
LAYERS = {
    "third_party": 0,
    "core": 0,
    "parallel": 1,
    "optim": 1,
    "data": 1,
    "checkpoint": 1,
    "observability": 1,
    "models": 2,
    "training": 3,
    "inference": 3,
    "planner": 3,
}

# Every package below the top layer, third_party aside (system library
# wrappers, which depend on nothing of ours). Each calls layering_test().
LAYERED_PACKAGES = [
    "core",
    "core/comm",
    "core/comm/fuzz",
    "core/cuda",
    "core/ops",
    "core/ops/cuda",
    "core/testing",
    "core/testing/fuzz",
    "checkpoint",
    "checkpoint/fuzz",
    "data",
    "data/fuzz",
    "observability",
    "optim",
    "parallel",
    "parallel/context_parallel",
    "parallel/data_parallel",
    "parallel/fsdp",
    "parallel/pipeline",
    "parallel/testing",
    "models/gpt",
    "models/moe",
    "training",
    "training/testing",
    "inference",
    "planner",
]

_TEST_KINDS = ("cc_test", "sh_test", "py_test", "test_suite")

def _layer_of(package):
    top = package.split("/")[0]
    if top not in LAYERS:
        fail("layering_test: //%s is in no layer (core/testing/layering.bzl)" % package)
    return LAYERS[top]

def _folders_regex(folders):
    return "^//(%s)[/:]" % "|".join(sorted(folders))

def _higher(targets, at_or_below):
    """The query for the targets of `targets` above the layer."""
    return 'filter("^//", %s) except filter("%s", %s)' % (targets, at_or_below, targets)

def _query(name, expression, scope, flag, args, data):
    """A genquery over `scope` whose output the check reads after `flag`."""
    native.genquery(
        name = name,
        expression = expression,
        scope = scope,
        testonly = True,
    )
    data.append(":" + name)
    args.extend([flag, "$(location :%s)" % name])

def layering_test(name = "layering_test", upward_tests = {}):
    """Defines `name`, checking this package's targets against the layers.

    Args:
      name: the test's name.
      upward_tests: {test name in this package: why it names a higher
        layer's library or binary directly}.
    """
    package = native.package_name()
    if package not in LAYERED_PACKAGES:
        fail("layering_test: add //%s to LAYERED_PACKAGES in core/testing/layering.bzl" % package)
    layer = _layer_of(package)
    at_or_below = _folders_regex([f for f, l in LAYERS.items() if l <= layer])
    layered = _folders_regex([f for f in LAYERS if f != "third_party"])
    listed = "^//(%s):" % "|".join(sorted(LAYERED_PACKAGES))

    rules, tests = [], []
    for rule in native.existing_rules().values():
        if rule["kind"] == "genquery":
            continue
        label = "//%s:%s" % (package, rule["name"])
        if rule["kind"] in _TEST_KINDS:
            if rule["name"] not in upward_tests:
                tests.append(label)
        else:
            rules.append(label)
    for test in upward_tests:
        if not native.existing_rule(test):
            fail("layering_test: upward_tests names %s, which //%s does not define" % (test, package))
    scope = rules + tests + ["//%s:%s" % (package, t) for t in upward_tests]
    if not scope:
        fail("layering_test: nothing to check in //" + package)

    args, data = ["--layer", str(layer), "--package", package], []

    if rules:
        _query(
            name + "_rules",
            "let r = set(%s) in let d = deps($r) in allpaths($r, %s)" %
            (" ".join(rules), _higher("$d", at_or_below)),
            scope,
            "--rules",
            args,
            data,
        )
    if tests:
        _query(
            name + "_tests",
            ("let t = set(%s) in let d = deps($t, 1) in let u = %s in " +
             "let v = $u except attr(testonly, 1, $u) in " +
             "(rdeps($t, $v, 1) intersect $t) + $v") %
            (" ".join(tests), _higher("$d", at_or_below)),
            scope,
            "--tests",
            args,
            data,
        )
    _query(
        name + "_unlisted",
        'let d = deps(set(%s)) in filter("%s", $d) except filter("%s", $d)' %
        (" ".join(scope), layered, listed),
        scope,
        "--unlisted",
        args,
        data,
    )
    for test in sorted(upward_tests):
        _query(
            name + "_upward_" + test,
            "let d = deps(//%s:%s, 1) in let u = %s in $u except attr(testonly, 1, $u)" %
            (package, test, _higher("$d", at_or_below)),
            scope,
            "--upward",
            args,
            data,
        )
        args.append(test)

    native.sh_test(
        name = name,
        srcs = ["//core/testing:check_layering.sh"],
        args = args,
        data = data,
    )
