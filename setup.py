"""Build steps that pyproject.toml cannot express: the gRPC stubs from protos/ and the
C/Cython extensions from csrc/, third_party/ and the package's .pyx files."""
from __future__ import annotations

import os
import re
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent.resolve()
PROTO_DIR = ROOT / "protos"
PROTO_OUT = ROOT / "triton_shm" / "_proto"
PROTO_PACKAGE = "triton_shm._proto"
LLHTTP = "third_party/llhttp"


def generate_protos() -> None:
    """Compile protos/*.proto with grpcio-tools into triton_shm/_proto (package-relative imports)."""
    from grpc_tools import protoc  # build requirement
    import grpc_tools

    PROTO_OUT.mkdir(exist_ok=True)
    (PROTO_OUT / "__init__.py").write_text('"""Generated from protos/ at build time; do not edit."""\n')
    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p) for p in PROTO_DIR.glob("*.proto"))
    rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={PROTO_OUT}",
                      f"--pyi_out={PROTO_OUT}", f"--grpc_python_out={PROTO_OUT}", *protos])
    if rc != 0:
        raise RuntimeError(f"protoc failed ({rc})")
    for py in PROTO_OUT.glob("*_pb2*.py"):
        text = py.read_text()
        fixed = re.sub(r"^import (\w+_pb2) as", r"from . import \1 as", text, flags=re.M)
        if fixed != text:
            py.write_text(fixed)


class BuildPyWithProtos(build_py):
    """Generates the stubs, then builds them as a package of their own: the package list was
    computed from the source tree before they existed (a clean checkout has no _proto/)."""

    def run(self) -> None:
        generate_protos()
        if self.packages is not None and PROTO_PACKAGE not in self.packages:
            self.packages.append(PROTO_PACKAGE)
        super().run()


def extensions() -> list[Extension]:
    if os.environ.get("TRITON_SHM_NO_EXTENSIONS", "") not in ("", "0"):
        return []
    from Cython.Build import cythonize

    exts = [
        Extension("triton_shm.core.data._codec",
                  ["triton_shm/core/data/_codec.pyx", "csrc/bytes_codec.c"],
                  include_dirs=["csrc"],
                  extra_compile_args=["-O2", "-Wall"]),
        Extension("triton_shm.core.data._types", ["triton_shm/core/data/_types.pyx"],
                  extra_compile_args=["-O2", "-Wall"]),
        Extension("triton_shm.backends._types", ["triton_shm/backends/_types.pyx"],
                  extra_compile_args=["-O2", "-Wall"]),
        Extension("triton_shm.ipc._protocol", ["triton_shm/ipc/_protocol.pyx"],
                  extra_compile_args=["-O2", "-Wall"]),
        Extension("triton_shm.ipc._arena", ["triton_shm/ipc/_arena.pyx"],
                  extra_compile_args=["-O2", "-Wall"]),
        Extension("triton_shm.ipc._ring", ["triton_shm/ipc/_ring.pyx"], depends=["csrc/ring.h"],
                  include_dirs=["csrc"],
                  extra_compile_args=["-O2", "-Wall"]),
        Extension("triton_shm.worker._watch", ["triton_shm/worker/_watch.pyx"],
                  extra_compile_args=["-O2", "-Wall"]),
        Extension("triton_shm.frontend.grpc._infer_wire", ["triton_shm/frontend/grpc/_infer_wire.pyx"],
                  extra_compile_args=["-O2", "-Wall"]),
        Extension("triton_shm.frontend.grpc.native._frames", ["triton_shm/frontend/grpc/native/_frames.pyx"],
                  extra_compile_args=["-O2", "-Wall"]),
        # cimports core/data/_types.pxd: its C classes' layout is compiled in
        Extension("triton_shm.frontend.http._common_shape", ["triton_shm/frontend/http/_common_shape.pyx"],
                  depends=["triton_shm/core/data/_types.pxd"],
                  extra_compile_args=["-O2", "-Wall"]),
        # llhttp's generated C, vendored (third_party/llhttp/README.md); not built with -Wall
        Extension("triton_shm.frontend.http._request_parser",
                  ["triton_shm/frontend/http/_request_parser.pyx",
                   f"{LLHTTP}/llhttp.c", f"{LLHTTP}/api.c", f"{LLHTTP}/http.c"],
                  include_dirs=[LLHTTP], depends=[f"{LLHTTP}/llhttp.h"],
                  extra_compile_args=["-O2"]),
        Extension("triton_shm.worker._assembler",
                  ["triton_shm/worker/_assembler.pyx", "csrc/assembler.c"],
                  include_dirs=["csrc"],
                  extra_compile_args=["-O2", "-Wall"]),
    ]
    return cythonize(exts, language_level=3, compiler_directives={"embedsignature": True})


setup(cmdclass={"build_py": BuildPyWithProtos}, ext_modules=extensions())
