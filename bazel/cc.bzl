"""C++ rules with pdserve's compiler settings.

Our own code builds with warnings as errors; generated and third-party code
does not go through these macros and keeps the compiler's defaults.
"""

PD_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-sign-compare",
    "-Wno-unused-parameter",
]

def pd_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = PD_COPTS + copts, **kwargs)

def pd_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = PD_COPTS + copts, **kwargs)

def pd_cc_test(name, copts = [], deps = [], tags = [], **kwargs):
    """A GoogleTest test. Add tags = ["gpu"] for tests that need a GPU."""
    native.cc_test(
        name = name,
        copts = PD_COPTS + copts,
        deps = deps + ["//third_party:gtest_main"],
        tags = tags,
        **kwargs
    )
