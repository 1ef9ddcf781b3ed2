#!/usr/bin/env python3
"""Checks kernels/ggml_ops.cc bit for bit against llama.cpp's compiled ggml.

Builds a small shared library from kernels/ggml_ops.cc (+ kernels/quant.cc)
with C entry points, then feeds it and libggml-cpu.so (from llama-cpp-python,
e.g. /tmp/llamacpp/venv) the same random inputs:
  ggml_vec_dot_f16      vs DotF16Ggml        (many lengths, incl. leftovers)
  ggml mul_mat f16 x f32 with >= 2 columns   (llamafile tinyBLAS)
                        vs DotF16TinyBlas / WeightedRowSumF16(kTinyBlas)
  ggml mul_mat with 1 column                 vs WeightedRowSumF16(kVecDot)
  ggml_vec_soft_max_f32 vs SoftMaxGgml       (incl. -inf, huge, tiny inputs)
  ggml_vec_swiglu_f32   vs SwiGluGgml
Not part of the test suite (it needs llama-cpp-python). Run from the repo
root:  /tmp/llamacpp/venv/bin/python tools/check_ggml_ops.py
"""
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np
import llama_cpp

LIB = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
SHIM = r"""
#include <cstdint>
#include <vector>
#include "kernels/ggml_ops.h"
using namespace pdserve::kernels;
extern "C" {
float our_dot_vec(int n, const uint16_t* x, const uint16_t* y) { return DotF16Ggml(n, x, y); }
float our_dot_tb(int n, const uint16_t* x, const uint16_t* y) { return DotF16TinyBlas(n, x, y); }
double our_softmax(int n, const float* x, float max, float* y) { return SoftMaxGgml(n, x, max, y); }
void our_swiglu(int n, const float* g, const float* u, float* o) { SwiGluGgml(n, g, u, o); }
// rows: n rows of d fp16 (row-major [n][d]); order 0 = vec_dot, 1 = tinyBLAS.
void our_rowsum(int order, int n, const float* p, const uint16_t* v, int d, float* out) {
  std::vector<const uint16_t*> rows(n);
  for (int j = 0; j < n; ++j) rows[j] = v + (int64_t)j * d;
  WeightedRowSumF16(order ? F16DotOrder::kTinyBlas : F16DotOrder::kVecDot, n, p, rows.data(), d, out);
}
}
"""


def build_ours(tmp):
    src = os.path.join(tmp, "shim.cc")
    open(src, "w").write(SHIM)
    so = os.path.join(tmp, "libours.so")
    subprocess.run(["g++", "-std=c++20", "-O2", "-ffp-contract=off", "-fPIC",
                    "-shared", "-I.", src, "kernels/ggml_ops.cc",
                    "kernels/quant.cc", "kernels/ggml_type.cc", "-o", so, "-labsl_strings",
                    "-labsl_status", "-labsl_statusor"], check=True)
    o = ctypes.CDLL(so)
    P = ctypes.c_void_p
    o.our_dot_vec.restype = o.our_dot_tb.restype = ctypes.c_float
    o.our_dot_vec.argtypes = o.our_dot_tb.argtypes = [ctypes.c_int, P, P]
    o.our_softmax.restype = ctypes.c_double
    o.our_softmax.argtypes = [ctypes.c_int, P, ctypes.c_float, P]
    o.our_swiglu.argtypes = [ctypes.c_int, P, P, P]
    o.our_rowsum.argtypes = [ctypes.c_int, ctypes.c_int, P, P, ctypes.c_int, P]
    return o


class Params(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


def main():
    base = ctypes.CDLL(os.path.join(LIB, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(LIB, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    cpu.ggml_cpu_init()
    P = ctypes.c_void_p
    cpu.ggml_vec_dot_f16.argtypes = [ctypes.c_int, P, ctypes.c_size_t, P,
                                     ctypes.c_size_t, P, ctypes.c_size_t, ctypes.c_int]
    cpu.ggml_vec_soft_max_f32.restype = ctypes.c_double
    cpu.ggml_vec_soft_max_f32.argtypes = [ctypes.c_int, P, P, ctypes.c_float]
    cpu.ggml_vec_swiglu_f32.argtypes = [ctypes.c_int, P, P, P]
    base.ggml_init.restype = P
    base.ggml_init.argtypes = [Params]
    base.ggml_new_tensor_2d.restype = P
    base.ggml_new_tensor_2d.argtypes = [P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_mul_mat.restype = P
    base.ggml_mul_mat.argtypes = [P, P, P]
    base.ggml_new_graph.restype = P
    base.ggml_new_graph.argtypes = [P]
    base.ggml_build_forward_expand.argtypes = [P, P]
    base.ggml_get_data.restype = P
    base.ggml_get_data.argtypes = [P]
    base.ggml_free.argtypes = [P]
    cpu.ggml_graph_compute_with_ctx.argtypes = [P, P, ctypes.c_int]

    rng = np.random.default_rng(7)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        o = build_ours(tmp)

        def f16(a):
            return np.ascontiguousarray(a.astype(np.float16))

        def ptr(a):
            return a.ctypes.data

        # ggml_vec_dot_f16.
        bad = total = 0
        for n in list(range(1, 200)) + [256, 320, 576, 1000, 2048]:
            for _ in range(60):
                scale = 10.0 ** rng.uniform(-3, 2)
                x = f16(rng.standard_normal(n) * scale)
                y = f16(rng.standard_normal(n))
                g = ctypes.c_float()
                cpu.ggml_vec_dot_f16(n, ctypes.byref(g), 0, ptr(x), 0, ptr(y), 0, 1)
                ours = o.our_dot_vec(n, ptr(x), ptr(y))
                total += 1
                bad += np.float32(ours).tobytes() != np.float32(g.value).tobytes()
        print(f"DotF16Ggml vs ggml_vec_dot_f16: {bad}/{total} differ")
        failures += bad

        # mul_mat f16 [K, M] x f32 [K, N]: tinyBLAS when N >= 2, vec_dot when
        # N == 1. Checks both the plain dot (A rows . B columns) and the
        # transposed-V form (WeightedRowSumF16: rows of B are probabilities).
        bad_tb = bad_rs = bad_rs1 = total = 0
        for K in (16, 32, 64, 128, 256, 512):
            for N in (1, 2, 3, 7):
                M = 24
                ctx = base.ggml_init(Params(64 << 20, None, False))
                a = base.ggml_new_tensor_2d(ctx, 1, K, M)  # GGML_TYPE_F16
                b = base.ggml_new_tensor_2d(ctx, 0, K, N)  # GGML_TYPE_F32
                A = f16(rng.standard_normal((M, K)))
                # Probabilities-like rows with zero tails (masked positions).
                B = np.abs(rng.standard_normal((N, K))).astype(np.float32)
                B[:, rng.integers(1, K + 1):] = 0
                B = np.ascontiguousarray(B / B.sum(1, keepdims=True)).astype(np.float32)
                ctypes.memmove(base.ggml_get_data(a), ptr(A), A.nbytes)
                ctypes.memmove(base.ggml_get_data(b), ptr(B), B.nbytes)
                c = base.ggml_mul_mat(ctx, a, b)
                gf = base.ggml_new_graph(ctx)
                base.ggml_build_forward_expand(gf, c)
                cpu.ggml_graph_compute_with_ctx(ctx, gf, 2)
                res = np.ctypeslib.as_array(
                    ctypes.cast(base.ggml_get_data(c), ctypes.POINTER(ctypes.c_float)),
                    shape=(N, M)).copy()
                base.ggml_free(ctx)
                B16 = f16(B)
                Bf = np.ascontiguousarray(B16.astype(np.float32))
                At = f16(A.T)  # [K][M]: row j holds V[j][:] for all outputs
                for col in range(N):
                    out = np.zeros(M, np.float32)
                    o.our_rowsum(1 if N >= 2 else 0, K, ptr(Bf[col]), ptr(At), M, ptr(out))
                    d = int((out.view(np.uint32) != res[col].view(np.uint32)).sum())
                    if N >= 2:
                        bad_rs += d
                        for m in range(M):
                            t = o.our_dot_tb(K, ptr(A[m]), ptr(B16[col]))
                            bad_tb += np.float32(t).tobytes() != res[col, m].tobytes()
                    elif K % 64 == 0:  # shorter rows take vec_dot's leftover path
                        bad_rs1 += d
                    total += M
        print(f"tinyBLAS (mul_mat, >= 2 columns): DotF16TinyBlas {bad_tb} differ, "
              f"WeightedRowSumF16(kTinyBlas) {bad_rs} differ")
        print(f"vec_dot (mul_mat, 1 column): WeightedRowSumF16(kVecDot) {bad_rs1} differ"
              f" (of {total} outputs in all)")
        failures += bad_tb + bad_rs + bad_rs1

        # ggml_vec_soft_max_f32.
        bad = total = 0
        for n in list(range(1, 70)) + [256, 512, 1000]:
            for _ in range(40):
                x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-2, 2.5)).astype(np.float32)
                x[rng.random(n) < 0.2] = -np.inf
                x[0] = rng.uniform(-5, 5)
                mx = np.float32(x.max())
                yg = np.zeros(n, np.float32)
                yo = np.zeros(n, np.float32)
                sg = cpu.ggml_vec_soft_max_f32(n, ptr(yg), ptr(x), mx)
                so = o.our_softmax(n, ptr(x), mx, ptr(yo))
                total += 1
                bad += (sg != so) or yg.tobytes() != yo.tobytes()
        # ggml_v_expf over its whole useful range, 16 lanes at a time.
        xs = np.concatenate([np.linspace(-120, 100, 160000, dtype=np.float32),
                             np.float32([-np.inf, np.inf, -1e30, 1e30, 0.0, -0.0,
                                         88.7, 88.8, -87.4, -103.9, -104.0])])
        xs = np.concatenate([xs, np.zeros((-len(xs)) % 16, np.float32)])
        yg = np.zeros_like(xs)
        yo = np.zeros_like(xs)
        for i in range(0, len(xs), 4096):
            chunk = np.ascontiguousarray(xs[i:i + 4096])
            m = len(chunk)
            cpu.ggml_vec_soft_max_f32(m, ptr(yg[i:]), ptr(chunk), np.float32(0))
            o.our_softmax(m, ptr(chunk), np.float32(0), ptr(yo[i:]))
        bad_exp = int((yg.view(np.uint32) != yo.view(np.uint32)).sum())
        print(f"SoftMaxGgml vs ggml_vec_soft_max_f32: {bad}/{total} rows differ; "
              f"ExpGgml sweep: {bad_exp}/{len(xs)} differ")
        failures += bad + bad_exp

        # ggml_vec_swiglu_f32.
        bad = total = 0
        for n in list(range(1, 70)) + [1536, 8960]:
            for _ in range(20):
                g = (rng.standard_normal(n) * 10.0 ** rng.uniform(-2, 2)).astype(np.float32)
                u = rng.standard_normal(n).astype(np.float32)
                yg = np.zeros(n, np.float32)
                yo = np.zeros(n, np.float32)
                cpu.ggml_vec_swiglu_f32(n, ptr(yg), ptr(g), ptr(u))
                o.our_swiglu(n, ptr(g), ptr(u), ptr(yo))
                total += n
                bad += int((yg.view(np.uint32) != yo.view(np.uint32)).sum())
        print(f"SwiGluGgml vs ggml_vec_swiglu_f32: {bad}/{total} elements differ")
        failures += bad
    print("ALL BIT-EXACT" if failures == 0 else f"{failures} MISMATCHES")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
