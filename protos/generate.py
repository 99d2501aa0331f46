"""Generate the Python stubs from ``protos/aryl/v1/*.proto``: ``python -m protos.generate``.

The include root is ``protos`` (``protoc -I protos aryl/v1/*.proto``), the same for every language,
so the files import each other as ``aryl/v1/types.proto`` and their descriptors are named
``aryl/v1/<name>.proto`` (what reflection clients see). protoc's Python output then imports
``aryl.v1.<name>_pb2``; the stubs live in this repository's ``protos`` package, so their imports of
one another are rewritten to ``protos.aryl.v1.<name>_pb2`` -- real package imports, no ``sys.path``
tricks, and the descriptors keep their language-neutral names.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

REPO_ROOT = Path(__file__).resolve().parent.parent
INCLUDE_ROOT = REPO_ROOT / "protos"
API_DIR = Path("aryl") / "v1"
PROTO_DIR = Path("protos") / API_DIR
# protoc's Python imports of a sibling stub, in the generated .py, .pyi and _grpc.py files.
_SIBLING_IMPORT = re.compile(r"^from aryl\.v1 import ", re.MULTILINE)


def proto_files() -> list[Path]:
    """The API's .proto files, relative to the include root ``protos``, in a stable order."""
    return sorted(p.relative_to(INCLUDE_ROOT) for p in (INCLUDE_ROOT / API_DIR).glob("*.proto"))


def compile_protos(out_dir: Path, *, include_root: Path = INCLUDE_ROOT) -> list[Path]:
    """protoc with ``-I protos`` only (plus protobuf's well-known types): Python, type stubs and gRPC
    stubs under ``out_dir/aryl/v1``, imports as protoc writes them. Any language's generator sees
    the same command line with its own ``--<lang>_out``."""
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{include_root}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted((out_dir / API_DIR).glob("*_pb2*.py*"))


def generate(out_dir: Path) -> list[Path]:
    """Compile every .proto into ``out_dir/protos/aryl/v1`` as the ``protos.aryl.v1`` package;
    return the files written."""
    target = out_dir / PROTO_DIR
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as raw:
        for path in compile_protos(Path(raw)):
            text = _SIBLING_IMPORT.sub("from protos.aryl.v1 import ", path.read_text())
            (target / path.name).write_text(text)
    return sorted(target.glob("*_pb2*.py*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: repo root)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
