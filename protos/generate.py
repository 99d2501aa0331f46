"""Generate the Python stubs from ``protos/aryl/v1/*.proto``: ``python -m protos.generate``.

Protos are compiled with the repository root as the include path, so the generated modules import
each other as ``protos.aryl.v1.<name>_pb2`` -- real package imports, no ``sys.path`` tricks.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = Path("protos") / "aryl" / "v1"


def proto_files() -> list[Path]:
    """The API's .proto files, relative to the repository root, in a stable order."""
    return sorted(p.relative_to(REPO_ROOT) for p in (REPO_ROOT / PROTO_DIR).glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Compile every .proto into ``out_dir`` (mirroring ``protos/aryl/v1``); return the files written."""
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{REPO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted((out_dir / PROTO_DIR).glob("*_pb2*.py*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: repo root)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
