"""pd_cuda_library: compiles .cu files with nvcc into a cc_library.

nvcc (CUDA 13, /usr/local/cuda) runs in a genrule per source and emits a
relocatable object with SASS for Ampere (sm_80) and Hopper (sm_90) plus PTX
for sm_90 so newer GPUs can JIT it. The objects go into a cc_library that
depends on the CUDA runtime, so only targets that depend on a CUDA library
link libcudart; CPU-only binaries never do.

Compiling needs no GPU, so CUDA targets build in CI; tests that run kernels
carry tags = ["gpu"] and are skipped by default (see .bazelrc).
"""

_NVCC = "/usr/local/cuda/bin/nvcc"

_NVCC_FLAGS = [
    "-std=c++20",
    "-O3",
    "-ccbin=/usr/bin/g++",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
    "-Xcompiler=-fPIC,-Wall,-Wextra,-Werror",
    "-Wno-deprecated-gpu-targets",
    "-Werror=all-warnings",
]

def pd_cuda_library(name, srcs, hdrs = [], deps = [], cu_hdrs = [], visibility = None, **kwargs):
    """A cc_library built from CUDA sources.

    Args:
      name: the cc_library.
      srcs: .cu files.
      hdrs: public headers of the library (plain C++, usable without nvcc).
      deps: cc_library deps of the library's users.
      cu_hdrs: further headers the .cu files include (from this or other
        packages); nvcc sees only declared files inside the sandbox.
      visibility: of the cc_library.
      **kwargs: passed to cc_library (e.g. tags).
    """
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_")[:-len(".cu")] + ".o"
        native.genrule(
            name = obj.replace(".", "_") + "_nvcc",
            srcs = [src] + hdrs + cu_hdrs,
            outs = [obj],
            cmd = " ".join([_NVCC] + _NVCC_FLAGS + [
                "-I.",
                "-I$(GENDIR)",
                "-c $(location %s)" % src,
                "-o $@",
            ]),
            message = "nvcc " + src,
            tags = kwargs.get("tags", []),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["//third_party:cuda_runtime"],
        visibility = visibility,
        **kwargs
    )
