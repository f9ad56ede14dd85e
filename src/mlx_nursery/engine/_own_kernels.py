"""The engine's CUDA kernels compiled by NVRTC here, run by MLX as compiled code
(`mx.fast.precompiled_cuda_kernel`) rather than compiled by MLX itself.

Why: `mx.fast.cuda_kernel` compiles each kernel variant at its first use in every process
(MLX keeps its own kernels on disk, never custom ones) behind MLX's device headers, which
make each compile take seconds: the engine's kernels were most of a restarted server's
warm-up (docs/benchmarks.md, decisions/0057). These sources need only CUDA's bfloat16 and
half headers, which compile in a small fraction of that.

`CudaKernel` is made and called as MLX's kernel object is. It writes the function MLX would
generate (the inputs, the outputs, the template's constants, and each input's shape, strides
or ndim where the source reads them, passed as scalar arguments computed from the shapes:
its inputs are made row-contiguous first), compiles each variant once per process, and
falls back to MLX's own `cuda_kernel` where it cannot: no NVRTC library or CUDA headers
found, no compute capability reported, a compile that fails (logged once), a dimension
beyond a 32-bit argument; and where its maker asks (`compile_here=False`: the decode
attention, which ran faster compiled by MLX, decisions/0060). A kernel that writes into an
input may run here only where that input is row-contiguous for certain (`_decode_prelude`:
a cache's own buffers): MLX copies any other first, and the write would land in the copy;
`_kv_append`, which writes buffers of any layout, keeps MLX's path, which never copies.
Engine thread only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import importlib.util
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx

log = logging.getLogger("mlx_nursery.engine")

_CUDA_TYPES = {
    mx.bfloat16: "__nv_bfloat16",
    mx.float16: "__half",
    mx.float32: "float",
    mx.int32: "int",
    mx.uint32: "unsigned int",
    mx.int64: "long long",
    mx.bool_: "bool",
}

_LARGEST_ARGUMENT = 2**31 - 1
"""Shapes and strides go to the kernel as 32-bit ints (MLX's scalar arguments)."""

_MAX_SCALAR_SETS = 512
"""Shape sets whose arguments are kept per kernel (a batch's shapes change on joins)."""

Template = Sequence[tuple[str, "int | bool | mx.Dtype"]]


class Nvrtc:
    """NVRTC through ctypes: CUDA source to a cubin for this process's GPU."""

    def __init__(self, library: ctypes.CDLL, includes: Path, arch: str) -> None:
        self._lib = library
        self._options = [
            f"--gpu-architecture={arch}".encode(),
            f"--include-path={includes}".encode(),
        ]

    def compile(self, source: str, name: str) -> bytes:
        """The cubin of `source`; RuntimeError with NVRTC's log where it does not compile."""
        lib = self._lib
        program = ctypes.c_void_p()
        _check(lib.nvrtcCreateProgram(
            ctypes.byref(program), source.encode(), f"{name}.cu".encode(), 0, None, None
        ))  # fmt: skip
        try:
            options = (ctypes.c_char_p * len(self._options))(*self._options)
            if lib.nvrtcCompileProgram(program, len(self._options), options) != 0:
                size = ctypes.c_size_t()
                _check(lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)))
                text = ctypes.create_string_buffer(size.value + 1)
                _check(lib.nvrtcGetProgramLog(program, text))
                raise RuntimeError(f"NVRTC: {text.value.decode(errors='replace')[:2000]}")
            size = ctypes.c_size_t()
            _check(lib.nvrtcGetCUBINSize(program, ctypes.byref(size)))
            cubin = ctypes.create_string_buffer(size.value)
            _check(lib.nvrtcGetCUBIN(program, cubin))
            return cubin.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(program))


def _check(result: int) -> None:
    if result != 0:
        raise RuntimeError(f"NVRTC call failed with status {result}")


def cuda_roots() -> list[Path]:
    """Where CUDA's libraries and headers may be: the NVIDIA wheels MLX's CUDA build
    depends on first (the NVRTC MLX itself loads), then `CUDA_HOME`, `CUDA_PATH` and
    /usr/local/cuda, as MLX looks for its own compiles' headers."""
    roots: list[Path] = []
    spec = importlib.util.find_spec("nvidia")
    for location in (spec.submodule_search_locations or []) if spec else []:
        base = Path(location)
        roots += [base / "cu13", base / "cu12", base / "cuda_nvrtc", base / "cuda_runtime"]
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if value := os.environ.get(variable):
            roots.append(Path(value))
    roots.append(Path("/usr/local/cuda"))
    return [root for root in roots if root.is_dir()]


def headers(roots: list[Path]) -> Path | None:
    """The first of `roots`' include folders that holds CUDA's bfloat16 header."""
    return next((r / "include" for r in roots if (r / "include/cuda_bf16.h").is_file()), None)


def _library(roots: list[Path]) -> ctypes.CDLL | None:
    candidates = [
        path
        for root in roots
        for folder in (root / "lib", root / "lib64")
        for path in sorted(folder.glob("libnvrtc.so*"), reverse=True)
    ]
    found = ctypes.util.find_library("nvrtc")
    for candidate in [*map(str, candidates), *([found] if found else [])]:
        try:
            return ctypes.CDLL(candidate)
        except OSError:
            continue
    return None


@functools.cache
def compiler() -> Nvrtc | None:
    """This process's NVRTC, or None where one of its parts is missing (logged once): MLX
    compiles the kernels then. Engine thread (it asks MLX for the device)."""
    info = mx.device_info()
    major, minor = info.get("compute_capability_major"), info.get("compute_capability_minor")
    roots = cuda_roots()
    includes = headers(roots)
    library = _library(roots)
    if major is None or minor is None or includes is None or library is None:
        log.info(
            "the engine's CUDA kernels are compiled by MLX (compute capability %s.%s, "
            "CUDA headers %s, NVRTC %s)",
            major, minor, includes, "found" if library else "not found",
        )  # fmt: skip
        return None
    return Nvrtc(library, includes, f"sm_{major}{minor}")


class CudaKernel:
    """One kernel source, in as many variants (template, dtypes) as its calls bring,
    compiled here where it can be and by MLX where not (module docstring)."""

    def __init__(
        self,
        name: str,
        input_names: Sequence[str],
        output_names: Sequence[str],
        source: str,
        header: str = "",
        ensure_row_contiguous: bool = True,
        compile_here: bool = True,
    ) -> None:
        """`compile_here`: False where MLX's compile serves the kernel better than this
        module's, whatever its start costs (the decode attention: decisions/0060)."""
        self._name = name
        self.compile_here = compile_here
        """Whether a call may run this module's compile; False: MLX compiles every variant
        (bench/ sets it to measure both)."""
        self._row_contiguous = ensure_row_contiguous
        """For MLX's compile only: here every input is made row-contiguous."""
        self._inputs = list(input_names)
        self._outputs = list(output_names)
        self._source = source
        self._header = header
        self._reads = [
            (f"{n}_shape" in source, f"{n}_strides" in source, f"{n}_ndim" in source)
            for n in self._inputs
        ]
        self._variants: dict[tuple[Any, ...], tuple[str, bytes] | None] = {}
        self._calls: dict[tuple[Any, ...], tuple[str, bytes, list[int]] | Literal[False]] = {}
        """Per call's template, shapes and dtypes: the compiled function and its scalar
        arguments, or False where MLX runs the call."""
        self._mlx: Any = None

    def __call__(
        self,
        *,
        inputs: Sequence[mx.array],
        template: Template,
        grid: tuple[int, int, int],
        threadgroup: tuple[int, int, int],
        output_shapes: Sequence[Sequence[int]],
        output_dtypes: Sequence[mx.Dtype],
    ) -> list[mx.array]:
        """The kernel's outputs, lazily, as MLX's kernel object returns them; the first
        call of a variant compiles it (blocking, well under a second)."""
        if not self.compile_here:
            return self._by_mlx(inputs, template, grid, threadgroup, output_shapes, output_dtypes)
        # One lookup a call, by everything the call's variant and scalars follow from: a
        # decode step calls each kernel once a layer, and the host's time is the step's.
        key = (
            tuple(template),
            tuple([a.shape for a in inputs]),
            tuple([a.dtype for a in inputs]),
            tuple(output_dtypes),
        )
        call = self._calls.get(key)
        if call is None:
            if len(self._calls) >= _MAX_SCALAR_SETS:
                self._calls.clear()
            call = self._calls[key] = self._resolved(key, inputs)
        if call is False:
            return self._by_mlx(inputs, template, grid, threadgroup, output_shapes, output_dtypes)
        function, cubin, scalars = call
        outputs: list[mx.array] = mx.fast.precompiled_cuda_kernel(
            name=function,
            compiled_source=cubin,
            inputs=inputs,
            output_shapes=output_shapes,  # type: ignore[arg-type]  # any sequence of ints
            output_dtypes=output_dtypes,
            scalars=scalars,
            grid=grid,
            threadgroup=threadgroup,
            ensure_row_contiguous=True,
        )
        return outputs

    def _resolved(
        self, key: tuple[Any, ...], inputs: Sequence[mx.array]
    ) -> tuple[str, bytes, list[int]] | Literal[False]:
        """The compiled variant and the scalar arguments of a call whose `__call__` key is
        `key` (template, shapes, dtypes, output dtypes), or False where MLX runs it (not
        compiled here, or an argument past 32 bits)."""
        template, shapes, dtypes, output_dtypes = key
        variant_key = (template, dtypes, tuple(map(len, shapes)), output_dtypes)
        if variant_key not in self._variants:
            self._variants[variant_key] = self._compiled(inputs, template, output_dtypes)
        variant = self._variants[variant_key]
        scalars = self._arguments(shapes)
        if variant is None or scalars is None:
            return False
        return (*variant, scalars)

    def source(
        self, function: str, inputs: Sequence[mx.array], template: Template,
        output_dtypes: Sequence[mx.Dtype],
    ) -> str:  # fmt: skip
        """The whole CUDA source of one variant, as MLX would generate it for its own
        compile, with shapes and strides as scalar arguments."""
        params = [
            f"const {_CUDA_TYPES[a.dtype]}* {n}" for n, a in zip(self._inputs, inputs, strict=True)
        ]
        params += [
            f"{_CUDA_TYPES[d]}* {n}" for n, d in zip(self._outputs, output_dtypes, strict=True)
        ]
        prologue = []
        for name, (shape, strides, ndim), array in zip(
            self._inputs, self._reads, inputs, strict=True
        ):
            count = array.ndim
            if count == 0:  # MLX passes no shape of a scalar either
                continue
            if shape:
                params += [f"int {name}_shape_{i}" for i in range(count)]
                values = ", ".join(f"{name}_shape_{i}" for i in range(count))
                prologue.append(f"const int {name}_shape[{count}] = {{{values}}};")
            if strides:
                params += [f"int {name}_strides_{i}" for i in range(count)]
                values = ", ".join(f"(long long){name}_strides_{i}" for i in range(count))
                prologue.append(f"const long long {name}_strides[{count}] = {{{values}}};")
            if ndim:
                params.append(f"int {name}_ndim")
        constants = []
        for key, value in template:
            if isinstance(value, bool):
                constants.append(f"constexpr bool {key} = {'true' if value else 'false'};")
            elif isinstance(value, int):
                constants.append(f"constexpr int {key} = {value};")
            else:
                constants.append(f"using {key} = {_CUDA_TYPES[value]};")
        body = "\n  ".join([*constants, *prologue])
        return (
            "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n"
            f"{self._header}\n"
            f'extern "C" __global__ void {function}(\n    {", ".join(params)}) {{\n'
            f"  {body}\n{self._source}\n}}\n"
        )

    def _compiled(
        self, inputs: Sequence[mx.array], template: Template, output_dtypes: Sequence[mx.Dtype]
    ) -> tuple[str, bytes] | None:
        nvrtc = compiler()
        if nvrtc is None:
            return None
        draft = self.source("FUNCTION", inputs, template, output_dtypes)
        function = f"{self._name}_{hashlib.sha256(draft.encode()).hexdigest()[:16]}"
        try:
            return function, nvrtc.compile(draft.replace("FUNCTION", function, 1), function)
        except Exception:
            log.warning("kernel %s not compiled here; MLX compiles it", function, exc_info=True)
            return None

    def _arguments(self, shapes: tuple[tuple[int, ...], ...]) -> list[int] | None:
        scalars: list[int] = []
        for (shape, strides, ndim), dims in zip(self._reads, shapes, strict=True):
            if not dims:
                continue
            if shape:
                scalars += dims
            if strides:
                step, row_major = 1, []
                for dim in reversed(dims):
                    row_major.append(step)
                    step *= dim
                scalars += reversed(row_major)
            if ndim:
                scalars.append(len(dims))
        return scalars if all(0 <= s <= _LARGEST_ARGUMENT for s in scalars) else None

    def _by_mlx(
        self,
        inputs: Sequence[mx.array],
        template: Template,
        grid: tuple[int, int, int],
        threadgroup: tuple[int, int, int],
        output_shapes: Sequence[Sequence[int]],
        output_dtypes: Sequence[mx.Dtype],
    ) -> list[mx.array]:
        if self._mlx is None:
            self._mlx = mx.fast.cuda_kernel(
                name=self._name,
                input_names=self._inputs,
                output_names=self._outputs,
                source=self._source,
                header=self._header,
                ensure_row_contiguous=self._row_contiguous,
            )
        outputs: list[mx.array] = self._mlx(
            inputs=list(inputs),
            template=list(template),
            grid=grid,
            threadgroup=threadgroup,
            output_shapes=[tuple(s) for s in output_shapes],
            output_dtypes=list(output_dtypes),
        )
        return outputs
