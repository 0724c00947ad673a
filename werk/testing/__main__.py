"""``python -m werk.testing --backend NAME``: run the conformance kit from a shell.

Exit status 0 when every check passed, 1 when one failed, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from ..backends import ModelSpec
from ..config import werk_home
from ..models import ModelRegistry
from ..protocol import WerkError
from . import conformance


def _spec(args: argparse.Namespace) -> ModelSpec | None:
    if args.model:
        return ModelRegistry(werk_home()).get(args.model).spec()
    if args.file:
        files = tuple(Path(f).resolve() for f in args.file)
        digest = hashlib.sha256()
        for path in files:
            digest.update(path.read_bytes())
        return ModelSpec(
            id="conformance",
            backend=args.backend,
            identity="sha256:" + digest.hexdigest(),
            files=files,
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m werk.testing",
        description="Check an installed Werk backend against backend contract 1.1.",
    )
    parser.add_argument("--backend", required=True, help="the backend name the plugin registers")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="ID", help="an imported model (werk models list)")
    source.add_argument(
        "--file", metavar="PATH", action="append", help="a model file to serve (repeatable)"
    )
    args = parser.parse_args(argv)
    try:
        spec = _spec(args)
    except (WerkError, OSError) as exc:
        print(f"werk.testing: {exc}", file=sys.stderr)
        return 2
    report = conformance(args.backend, spec)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
