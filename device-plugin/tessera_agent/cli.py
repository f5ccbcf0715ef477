"""The `tessera-agent` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tessera-agent", description="Tessera node agent.")
    p.parse_args(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
