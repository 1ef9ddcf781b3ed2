#!/usr/bin/env python3
"""Checks that kernels/matmul.cc computes exactly what llama.cpp's CPU
library does for the quantized dot products of the block formats whose
order matters (Q4_0, Q5_0, Q8_0 against Q8_0 activations; Q4_1, Q5_1
against Q8_1; Q4_K, Q5_K, Q6_K against Q8_K): the activation bytes of both quantizers and every dot
product must be bitwise equal on random rows.

It compiles kernels/matmul.cc (with quant.cc) into a small shared library
with g++ and loads it next to libggml-cpu from llama-cpp-python (a scratch
virtualenv, not a project dependency; see tools/gen_engine_goldens.py):
  /tmp/llamacpp/venv/bin/python tools/check_ggml_dots.py
Not run by the test suite; matmul_test pins the same arithmetic with
hand-computed cases.
"""
import ctypes
import os
import subprocess
import sys
import tempfile

import llama_cpp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
WRAPPER = r'''
#include "kernels/matmul.h"
using pdserve::kernels::GgmlType;
extern "C" {
void our_quantize(int type, const float* x, long n, void* out) {
  pdserve::kernels::QuantizeActivations(static_cast<GgmlType>(type), x, n, out);
}
float our_dot(int type, const void* w, const void* a, long n) {
  return pdserve::kernels::VecDot(static_cast<GgmlType>(type), w, a, n);
}
}
'''
# name, ggml type id, block bytes, activation type id (8 = Q8_0, 9 = Q8_1),
# activation block bytes, ggml function.
FORMATS = [
    ("q4_0", 2, 18, 8, 34, "ggml_vec_dot_q4_0_q8_0", False),
    ("q5_0", 6, 22, 8, 34, "ggml_vec_dot_q5_0_q8_0", False),
    ("q8_0", 8, 34, 8, 34, "ggml_vec_dot_q8_0_q8_0", False),
    ("q4_1", 3, 20, 9, 36, "ggml_vec_dot_q4_1_q8_1", True),
    ("q5_1", 7, 24, 9, 36, "ggml_vec_dot_q5_1_q8_1", True),
    ("q4_K", 12, 144, 15, 292, "ggml_vec_dot_q4_K_q8_K", False),
    ("q5_K", 13, 176, 15, 292, "ggml_vec_dot_q5_K_q8_K", False),
    ("q6_K", 14, 210, 15, 292, "ggml_vec_dot_q6_K_q8_K", False),
]
# Elements per block of each format (K-quants: 256-element super-blocks).
BLOCK = {"q4_K": 256, "q5_K": 256, "q6_K": 256}


def build_ours(tmp):
    src = os.path.join(tmp, "wrap.cc")
    with open(src, "w") as f:
        f.write(WRAPPER)
    out = os.path.join(tmp, "libours.so")
    subprocess.run(
        ["g++", "-std=c++20", "-O2", "-ffp-contract=off", "-fPIC", "-shared",
         "-I", ROOT, src, os.path.join(ROOT, "kernels/matmul.cc"),
         os.path.join(ROOT, "kernels/quant.cc"),
         os.path.join(ROOT, "kernels/ggml_type.cc"), "-o", out,
         "-labsl_status", "-labsl_statusor", "-labsl_strings",
         "-labsl_str_format_internal"], check=True)
    return ctypes.CDLL(out)


def main():
    ggml = ctypes.CDLL(os.path.join(LIB, "libggml-cpu.so"))
    ggml.ggml_cpu_init()
    with tempfile.TemporaryDirectory() as tmp:
        ours = build_ours(tmp)
        ours.our_dot.restype = ctypes.c_float
        rng = np.random.default_rng(5)
        failures = 0
        for name, wtype, wbytes, atype, abytes, fn, has_min in FORMATS:
            dot = getattr(ggml, fn)
            quantize = {8: ggml.quantize_row_q8_0, 9: ggml.quantize_row_q8_1,
                        15: ggml.quantize_row_q8_K}[atype]
            qk = BLOCK.get(name, 32)
            act_bad = dot_bad = 0
            for _ in range(2000):
                nb = int(rng.integers(1, 25 if qk == 32 else 7))
                n = nb * qk
                w = rng.integers(0, 256, nb * wbytes, dtype=np.uint8)
                for b in range(nb):
                    d = np.float16(rng.uniform(0.0005, 0.05))
                    # Q6_K keeps its scale last; the others first.
                    at = b * wbytes + (208 if name == "q6_K" else 0)
                    w[at:at + 2] = np.frombuffer(d.tobytes(), np.uint8)
                    if name in ("q4_K", "q5_K"):  # dmin: a sane scale too
                        dmin = np.float16(rng.uniform(0.0005, 0.05))
                        w[at + 2:at + 4] = np.frombuffer(dmin.tobytes(),
                                                         np.uint8)
                    if has_min:
                        m = np.float16(-7.5 * float(d))
                        w[b * wbytes + 2:b * wbytes + 4] = np.frombuffer(
                            m.tobytes(), np.uint8)
                x = (rng.standard_normal(n) *
                     rng.uniform(0.1, 10)).astype(np.float32)
                qa_ggml = np.zeros(nb * abytes, np.uint8)
                qa_ours = np.zeros(nb * abytes, np.uint8)
                quantize(x.ctypes.data_as(ctypes.c_void_p),
                         qa_ggml.ctypes.data_as(ctypes.c_void_p),
                         ctypes.c_int64(n))
                ours.our_quantize(atype, x.ctypes.data_as(ctypes.c_void_p),
                                  ctypes.c_long(n),
                                  qa_ours.ctypes.data_as(ctypes.c_void_p))
                act_bad += not np.array_equal(qa_ggml, qa_ours)
                s = ctypes.c_float(0)
                dot(ctypes.c_int(n), ctypes.byref(s), ctypes.c_size_t(0),
                    w.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(0),
                    qa_ggml.ctypes.data_as(ctypes.c_void_p),
                    ctypes.c_size_t(0), ctypes.c_int(1))
                got = ours.our_dot(wtype, w.ctypes.data_as(ctypes.c_void_p),
                                   qa_ggml.ctypes.data_as(ctypes.c_void_p),
                                   ctypes.c_long(n))
                dot_bad += (np.float32(got).tobytes() !=
                            np.float32(s.value).tobytes())
            print(f"{name}: activation rows differing {act_bad}/2000, "
                  f"dot products differing {dot_bad}/2000")
            failures += act_bad + dot_bad
        print("ALL BIT-EXACT" if failures == 0 else f"{failures} MISMATCHES")
        return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
