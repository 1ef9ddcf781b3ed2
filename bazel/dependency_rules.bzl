"""pd_forbidden_deps: dependency rules checked by //tests:dependency_rules_test.

`bazel query` cannot run inside a test, so each rule is a fact computed at
build time: a genquery listing the rules that some targets depend on and
must not. The test fails when any of these lists is not empty.
"""

def pd_forbidden_deps(name, forbidden, allowed = None, roots = None):
    """A genquery `name`: the forbidden rules `roots` depend on (none, if kept).

    Args:
      name: the genquery; //tests:dependency_rules_test reads its output.
      forbidden: regular expression over labels of the rules the roots may
        not depend on, directly or not.
      allowed: regular expression over labels excepted from `forbidden`.
      roots: labels whose dependencies are checked. Default: every rule of
        this package defined before the call (tests included), so call it
        last in the BUILD file and new targets are covered as they come.
    """
    if roots == None:
        roots = [
            "//%s:%s" % (native.package_name(), rule_name)
            for rule_name, attrs in native.existing_rules().items()
            if attrs["kind"] != "genquery"
        ]
    roots = [
        "//%s%s" % (native.package_name(), r) if r.startswith(":") else r
        for r in roots
    ]
    reached = "filter('%s', kind(rule, deps(set(%s))))" % (
        forbidden,
        " ".join(['"%s"' % r for r in roots]),
    )
    if allowed:
        reached = "%s except filter('%s', %s)" % (reached, allowed, reached)
    native.genquery(
        name = name,
        expression = reached,
        scope = roots,
        # The roots may be tests and test-only libraries.
        testonly = True,
        visibility = ["//tests:__pkg__"],
    )
