"""The engine's read-only CUDA kernels compiled by its own NVRTC call (`_own_kernels.py`).

MLX runs a precompiled kernel with its inputs, its outputs, then its scalars, and here the
scalars carry each input's shape, strides and ndim where the source reads them, the strides
row-major (MLX makes every input row-contiguous first): the written function must take them
in that order, and the values must be what MLX's own compile would read. Where no compute
capability, NVRTC or CUDA headers are found, nothing is compiled here (MLX compiles). Where
an NVRTC and CUDA's headers are found on this machine, every variant the engine builds
compiles here, the decode attention's too, which MLX compiles in service (decisions/0060;
`bench/ragged_attention.py --own-compiled` checks this compile's results against MLX's
masked attention on a GPU); on CUDA the prelude's tests run its compile here.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import pytest

from mlx_nursery.engine import _decode_attention, _decode_prelude, _masked_softmax, _own_kernels
from mlx_nursery.engine._own_kernels import (
    CudaKernel,
    Nvrtc,
    _library,
    compiler,
    cuda_roots,
    headers,
)

SOURCE = "out[0] = a[a_strides[1]] + a_shape[0] + b[0] + b_ndim + N;"


@pytest.fixture
def fresh_compiler() -> Iterator[None]:
    compiler.cache_clear()
    yield
    compiler.cache_clear()


def parameters(source: str) -> list[str]:
    signature = re.search(r"__global__ void \w+\(\s*(.*?)\)\s*\{", source, re.S)
    assert signature is not None, source
    return [p.strip() for p in signature.group(1).split(",")]


def test_the_function_takes_inputs_outputs_then_each_inputs_shape_strides_and_ndim() -> None:
    kernel = CudaKernel("k", ["a", "b"], ["out"], SOURCE)
    a, b = mx.zeros((2, 3, 4), mx.bfloat16), mx.zeros((5,), mx.int32)
    source = kernel.source("k_variant", [a, b], [("N", 7), ("T", mx.float16)], [mx.float32])
    assert parameters(source) == [
        "const __nv_bfloat16* a",
        "const int* b",
        "float* out",
        *(f"int a_shape_{i}" for i in range(3)),
        *(f"int a_strides_{i}" for i in range(3)),
        "int b_ndim",
    ]
    assert "constexpr int N = 7;" in source and "using T = __half;" in source
    assert "const int a_shape[3] = {a_shape_0, a_shape_1, a_shape_2};" in source
    assert SOURCE in source and "#include <cuda_bf16.h>" in source
    # one scalar a parameter past the outputs, in the same order
    assert kernel._arguments(((2, 3, 4), (5,))) == [2, 3, 4, 12, 4, 1, 1]


def test_a_dimension_past_a_32_bit_argument_is_left_to_mlx() -> None:
    kernel = CudaKernel("k", ["a", "b"], ["out"], SOURCE)
    assert kernel._arguments(((2, 3, 4), (5,))) is not None
    assert kernel._arguments(((2, 2**20, 2**12), (5,))) is None  # a stride of 2**32


def test_a_call_compiles_its_variant_once_and_passes_its_shapes_scalars(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the engine compiles (NVRTC stood in for), a variant (template, dtypes, ranks)
    is compiled once and each call hands MLX that cubin with the scalars of its own shapes;
    a shape whose scalars pass 32 bits, and a variant that does not compile, go to MLX."""
    compiled: list[str] = []
    launched: list[dict[str, Any]] = []

    class Compiler:
        def compile(self, source: str, name: str) -> bytes:
            compiled.append(name)
            if "N = 9" in source:
                raise RuntimeError("NVRTC: error")
            return name.encode()

    def launch(**call: Any) -> list[mx.array]:
        launched.append(call)
        return [mx.zeros(call["output_shapes"][0], call["output_dtypes"][0])]

    by_mlx: list[int] = []
    worked_out: list[int] = []
    arguments = CudaKernel._arguments

    def counted(self: CudaKernel, shapes: Any) -> Any:
        worked_out.append(1)
        return arguments(self, shapes)

    monkeypatch.setattr(CudaKernel, "_arguments", counted)
    monkeypatch.setattr(_own_kernels, "compiler", lambda: Compiler())
    monkeypatch.setattr(mx.fast, "precompiled_cuda_kernel", launch)
    monkeypatch.setattr(CudaKernel, "_by_mlx", lambda self, *args: by_mlx.append(1) or [])
    kernel = CudaKernel("k", ["a", "b"], ["out"], SOURCE)

    def call(a_shape: tuple[int, ...], n: int = 1) -> None:
        a, b = mx.zeros(a_shape, mx.float32), mx.zeros((5,), mx.int32)
        kernel(inputs=[a, b], template=[("N", n)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
               output_shapes=[(1,)], output_dtypes=[mx.float32])  # fmt: skip

    call((2, 3, 4))
    call((2, 3, 4))
    call((5, 3, 4))
    assert len(compiled) == 1  # one variant: the same template, dtypes and ranks
    assert [c["scalars"] for c in launched] == [[2, 3, 4, 12, 4, 1, 1]] * 2 + [
        [5, 3, 4, 12, 4, 1, 1]
    ]
    assert {c["name"] for c in launched} == set(compiled)
    assert all(c["compiled_source"] == compiled[0].encode() for c in launched)
    assert len(worked_out) == 2  # a shape's scalars once, however often it is called
    call((2, 2**20, 2**12))  # a stride of 2**32
    call((2, 3, 4), n=9)  # does not compile
    assert by_mlx == [1, 1] and len(launched) == 3
    monkeypatch.setattr(_own_kernels, "_MAX_SCALAR_SETS", len(kernel._calls))
    call((7, 3, 4))  # past the bound: the calls' table starts again, the variants stay
    assert len(kernel._calls) == 1 and len(compiled) == 2
    call((2, 3, 4))
    assert len(compiled) == 2 and launched[-1]["scalars"] == [2, 3, 4, 12, 4, 1, 1]


def test_a_kernel_left_to_mlx_never_compiles_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """`compile_here=False` (the decode attention's kernels): every call goes to MLX's
    compile even where an NVRTC is found; set back, the same object compiles here."""
    compiled: list[str] = []

    class Compiler:
        def compile(self, source: str, name: str) -> bytes:
            compiled.append(name)
            return name.encode()

    by_mlx: list[int] = []
    monkeypatch.setattr(_own_kernels, "compiler", lambda: Compiler())
    monkeypatch.setattr(mx.fast, "precompiled_cuda_kernel", lambda **call: [mx.zeros((1,))])
    monkeypatch.setattr(CudaKernel, "_by_mlx", lambda self, *args: by_mlx.append(1) or [])
    kernel = CudaKernel("k", ["a", "b"], ["out"], SOURCE, compile_here=False)
    a, b = mx.zeros((2, 3, 4), mx.float32), mx.zeros((5,), mx.int32)
    call = dict(inputs=[a, b], template=[("N", 1)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                output_shapes=[(1,)], output_dtypes=[mx.float32])  # fmt: skip
    kernel(**call)  # type: ignore[arg-type]
    kernel(**call)  # type: ignore[arg-type]
    assert by_mlx == [1, 1] and compiled == []
    kernel.compile_here = True
    kernel(**call)  # type: ignore[arg-type]
    assert by_mlx == [1, 1] and len(compiled) == 1


def test_without_a_compute_capability_nothing_is_compiled_here(
    fresh_compiler: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mx, "device_info", lambda: {"device_name": "cpu"})
    kernel = CudaKernel("k", ["a", "b"], ["out"], SOURCE)
    a, b = mx.zeros((2, 3, 4), mx.float32), mx.zeros((5,), mx.int32)
    assert compiler() is None
    assert kernel._compiled([a, b], [("N", 1)], [mx.float32]) is None


def _nvrtc_here() -> Nvrtc | None:
    roots = cuda_roots()
    library = _library(roots)
    includes = headers(roots)
    return None if library is None or includes is None else Nvrtc(library, includes, "sm_80")


@pytest.mark.skipif(_nvrtc_here() is None, reason="no NVRTC with CUDA's headers here")
def test_every_variant_the_engine_builds_compiles() -> None:
    nvrtc = _nvrtc_here()
    assert nvrtc is not None
    built = 0
    for dtype in (mx.bfloat16, mx.float16, mx.float32):
        for (rep, dim), vload in itertools.product(((4, 128), (1, 64), (2, 96)), (False, True)):
            queries = mx.zeros((2, 8 * rep, 1, dim), dtype)
            keys = mx.zeros((2, 8, 300, dim), dtype)
            starts, scalar = mx.zeros((2,), mx.int32), mx.zeros((1,), mx.int32)
            inputs = [queries, keys, keys, starts, scalar, mx.zeros((1,), mx.float32)]
            layout = [("REP", rep), ("D", dim), ("WARPS", 4), ("VLOAD", vload)]
            partials = [mx.zeros((2, 8 * rep, 2, dim), mx.float32)]
            partials += [mx.zeros((2, 8 * rep, 2), mx.float32)] * 2
            for name, args, template, outputs in (
                ("whole", inputs, [*layout, ("T", dtype)], [dtype]),
                ("partial", inputs, layout, [mx.float32] * 3),
                ("combine", partials, [("T", dtype), ("D", dim)], [dtype]),
            ):
                source = _decode_attention._kernel(name).source("f", args, template, outputs)
                assert nvrtc.compile(source, "f")
                built += 1
        scores = mx.zeros((1, 2, 3, 16), dtype)
        for causal in (True, False):
            extra = mx.zeros((1,), mx.int32) if causal else mx.zeros((1, 3, 15), mx.bool_)
            for vector in (16 // dtype.size, 1):
                template = [("T", dtype), ("VEC", vector), ("WARPS", 8)]
                args = [scores, mx.zeros((1,), mx.float32), extra]
                source = _masked_softmax._kernel(causal).source("f", args, template, [dtype])
                assert nvrtc.compile(source, "f")
                built += 1
        for heads, kv_heads, dim, traditional, with_freqs in (
            (32, 8, 128, False, True), (14, 2, 64, True, False), (12, 4, 96, False, False),
        ):  # fmt: skip
            qkv = mx.zeros((3, 1, (heads + 2 * kv_heads) * dim), dtype)
            buffer = mx.zeros((3, kv_heads, 256, dim), dtype)
            args = [qkv, buffer, buffer, mx.zeros((3,), mx.int32), mx.zeros((1,), mx.int64),
                    mx.zeros((dim // 2 if with_freqs else 1,), mx.float32),
                    mx.zeros((1,), mx.float32)]  # fmt: skip
            template = [("HQ", heads), ("HKV", kv_heads), ("D", dim), ("T", dtype),
                        ("TRADITIONAL", traditional), ("FREQS", with_freqs)]  # fmt: skip
            assert nvrtc.compile(_decode_prelude._kernel.source("f", args, template, [dtype]), "f")
            built += 1
    assert built == 3 * (3 * 2 * 3 + 4 + 3)
