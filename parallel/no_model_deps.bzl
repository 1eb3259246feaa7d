"""A test that the package's non-test targets do not depend on //models.

The parallel libraries serve any model through the model contract
(//parallel:model), so none of them may reach a model's code. Call
no_model_deps_test() as the last statement of every //parallel BUILD file:
it queries the transitive dependencies of every target defined above it
that is not a test and not testonly (genquery, offline), and the test fails
listing each path from such a target to a //models target.
"""

_TEST_KINDS = ("cc_test", "sh_test", "py_test", "test_suite")

def no_model_deps_test(
        name = "no_model_deps_test",
        canary = None,
        include_tests = False):
    """Defines `name` over the targets defined so far in this package.

    Args:
      name: the test's name.
      canary: optionally, a testonly target of this package known to depend
        on //models: the test also checks that the query finds that
        dependency, so a broken query cannot pass silently.
      include_tests: also check tests and testonly targets (a package of
        test models that must stay model-independent: //parallel/testing).
    """
    package = native.package_name()
    targets = []
    for rule in native.existing_rules().values():
        if rule["kind"] == "genquery":
            continue
        is_test = rule["kind"] in _TEST_KINDS or rule.get("testonly")
        if is_test and not include_tests:
            continue
        targets.append("//%s:%s" % (package, rule["name"]))
    if not targets:
        fail("no_model_deps_test: nothing to check in //" + package)
    roots = "set(%s)" % " ".join(targets)
    models = 'kind(rule, filter("^//models[/:]", deps(%s)))' % roots
    native.genquery(
        name = name + "_paths",
        expression = "allpaths(%s, %s)" % (roots, models),
        scope = targets,
        testonly = True,
    )
    data = [":" + name + "_paths"]
    args = ["$(location :%s_paths)" % name]
    if canary:
        if canary.startswith(":"):
            canary = "//%s%s" % (package, canary)
        native.genquery(
            name = name + "_canary",
            expression = 'filter("^//models[/:]", deps(%s))' % canary,
            scope = [canary],
            testonly = True,
        )
        data.append(":" + name + "_canary")
        args.append("$(location :%s_canary)" % name)
    native.sh_test(
        name = name,
        srcs = ["//parallel:check_no_model_deps.sh"],
        args = args,
        data = data,
    )
