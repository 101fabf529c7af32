"""Generate the Python gRPC code for proto/ into the contract package, ``rayft_contract/v1/`` (``make proto``).

The .proto files sit under ``proto/`` at the import path their Python modules take
(``proto/rayft_contract/v1/finetune.proto`` -> ``rayft_contract.v1.finetune_pb2``), so protoc's own
imports are right as generated: nothing is rewritten. The wire names stay ``rayft.v1.*`` (the proto
``package``), whatever the file path.

The output is committed; ``tests/unit/rayft_contract/test_proto.py`` regenerates it into a temporary directory and
fails if the committed files differ, so the code never drifts from the .proto.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOS = ["rayft_contract/v1/finetune.proto"]
GENERATED = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out: Path) -> list[Path]:
    """Write the generated modules under ``out`` (the repository root, or a scratch directory); return them."""
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"-I{Path(protoc.__file__).parent / '_proto'}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--pyi_out={out}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(out / p for p in _outputs())


def _outputs() -> list[str]:
    return [p.removesuffix(".proto") + suffix for p in PROTOS for suffix in GENERATED]


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
