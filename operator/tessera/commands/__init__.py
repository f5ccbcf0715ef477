"""Subcommands of `tessera`. Each module here defines `register(subparsers)`; the CLI discovers them."""
