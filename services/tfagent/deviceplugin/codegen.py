"""Regenerates `api_pb2.py` / `api_pb2.pyi` from `api.proto` (run `python -m tfagent.deviceplugin.codegen`;
an optional argument writes under another root instead of the source tree).

The generated files are committed; a unit test regenerates them and fails if they differ from the
committed ones, so the proto source and the code can never drift apart. Needs `grpcio-tools` (a
development dependency); nothing imports this module at run time, and tests run it in a subprocess:
`grpc_tools` bundles its own protobuf and abseil, which abort a process that later loads OR-Tools.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

SERVICES_ROOT = Path(__file__).resolve().parents[2]
PROTO = "tfagent/deviceplugin/api.proto"
GENERATED = ("api_pb2.py", "api_pb2.pyi")
HEADER = (
    "# ruff: noqa\n"
    "# fmt: off\n"
    '# mypy: disable-error-code="type-arg"\n'
    "# Generated from api.proto by tfagent.deviceplugin.codegen; do not edit.\n"
)


def generate(out_root: Path) -> list[Path]:
    """Compile `api.proto` under `out_root` (mirroring the package path) and return the generated files."""
    protoc = importlib.import_module("grpc_tools.protoc")
    include = Path(importlib.import_module("grpc_tools").__file__ or "").parent / "_proto"
    arguments = [
        "protoc",
        f"-I{SERVICES_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        str(SERVICES_ROOT / PROTO),
    ]
    if protoc.main(arguments) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    generated = [out_root / Path(PROTO).parent / name for name in GENERATED]
    for path in generated:
        path.write_text(HEADER + path.read_text())
    return generated


if __name__ == "__main__":
    for written in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else SERVICES_ROOT):
        sys.stdout.write(f"wrote {written}\n")
