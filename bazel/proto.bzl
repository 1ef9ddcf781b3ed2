"""pd_proto_library: C++ message and gRPC code from .proto files.

Runs the system protoc (Debian protobuf-compiler) and grpc_cpp_plugin
(Debian protobuf-compiler-grpc) in a genrule. Imports are resolved from the
repository root, so `import "proto/common.proto";` works and the generated
header is `proto/common.pb.h`.
"""

_PROTOC = "/usr/bin/protoc"
_GRPC_PLUGIN = "/usr/bin/grpc_cpp_plugin"

def pd_proto_library(name, srcs, deps = [], grpc = False, visibility = None, testonly = False):
    """Generates and compiles C++ code for `srcs`.

    Args:
      name: the cc_library to create; `<name>_protos` collects the .proto
        files (with those of `deps`) for importers.
      srcs: .proto files in this package.
      deps: other pd_proto_library targets whose files `srcs` import.
      grpc: also generate gRPC service stubs (`*.grpc.pb.{h,cc}`).
      visibility: of the cc_library.
      testonly: for protos only tests may use.
    """
    native.filegroup(
        name = name + "_protos",
        srcs = srcs + [d + "_protos" for d in deps],
        visibility = visibility,
        testonly = testonly,
    )
    stems = [s[:-len(".proto")] for s in srcs]
    outs = [s + ".pb.h" for s in stems] + [s + ".pb.cc" for s in stems]
    grpc_outs = []
    if grpc:
        grpc_outs = [s + ".grpc.pb.h" for s in stems] + [s + ".grpc.pb.cc" for s in stems]
    cmd = _PROTOC + " -I. --cpp_out=$(GENDIR)"
    if grpc:
        cmd += " --plugin=protoc-gen-grpc=" + _GRPC_PLUGIN + " --grpc_out=$(GENDIR)"
    cmd += " " + " ".join(["$(location %s)" % s for s in srcs])
    native.genrule(
        name = name + "_codegen",
        srcs = srcs + [name + "_protos"],
        outs = outs + grpc_outs,
        cmd = cmd,
        message = "protoc " + " ".join(srcs),
        testonly = testonly,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs + grpc_outs if o.endswith(".cc")],
        hdrs = [o for o in outs + grpc_outs if o.endswith(".h")],
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
        visibility = visibility,
        testonly = testonly,
    )
