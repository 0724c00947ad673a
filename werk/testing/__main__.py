"""``python -m werk.testing --backend NAME``: run the conformance kit from a shell.

Exit status 0 when every check passed (with ``--strict``: and nothing was warned about), 1 when
one failed, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..backends import ModelSpec
from ..config import werk_home
from ..models import ModelRegistry
from ..protocol import WerkError
from . import conformance, model_spec


def _spec(args: argparse.Namespace) -> ModelSpec | None:
    if args.model:
        return ModelRegistry(werk_home()).get(args.model).spec()
    if args.file:
        return model_spec([Path(f) for f in args.file], args.backend)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m werk.testing",
        description=(
            "Check an installed Werk backend against backend contract 1.2: every capability "
            "it claims must be proven by a check."
        ),
    )
    parser.add_argument("--backend", required=True, help="the backend name the plugin registers")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="ID", help="an imported model (werk models list)")
    source.add_argument(
        "--file",
        metavar="PATH",
        action="append",
        help="a model file to serve as model 'conformance' (repeatable)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail on warnings too (a claim the host lowered)",
    )
    args = parser.parse_args(argv)
    try:
        spec = _spec(args)
    except (WerkError, OSError) as exc:
        print(f"werk.testing: {exc}", file=sys.stderr)
        return 2
    report = conformance(args.backend, spec)
    print(report.summary())
    return 0 if (report.ok_strictly() if args.strict else report.ok) else 1


if __name__ == "__main__":
    sys.exit(main())
