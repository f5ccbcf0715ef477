"""`tessera validate FILE|DIR...`: check Tessera manifests offline with the same models the operator uses."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from tessera.api.contract import GROUP
from tessera.api.queue import QueueSpec, hierarchy_errors
from tessera.api.resources import KINDS, manifest_errors
from tessera.api.safe_load import InputError, load_yaml_documents, read_text

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check App / TrialGroup / ModelDeployment / Queue manifests offline",
        description=(
            "Validate Tessera manifests without a cluster. Prints 'OK <file>' per valid document and "
            "'<file>: <kind>/<name>: <field path>: <message>' per error; exits 1 if any error. "
            "A directory means its *.yaml and *.yml files; multi-document YAML is supported. Objects "
            "of other APIs beside them (the Namespaces the examples create) are listed as 'SKIP' and "
            "left to the API server."
        ),
    )
    parser.add_argument(
        "paths", nargs="+", type=Path, metavar="FILE|DIR", help="manifest files or directories"
    )
    parser.set_defaults(func=run)


def _files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()))
        else:
            files.append(path)
    return files


def _describe(doc: Any) -> str:
    if not isinstance(doc, dict):
        return "<not a mapping>"
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{doc.get('kind') or '<no kind>'}/{name or '<no name>'}"


def foreign(doc: Any) -> str | None:
    """The apiVersion of an object of another API than Tessera's (a Namespace), None for anything this
    command checks: a Tessera kind or apiVersion, or a document too broken to tell."""
    if not isinstance(doc, dict):
        return None
    api, kind = doc.get("apiVersion"), doc.get("kind")
    if not isinstance(api, str) or not isinstance(kind, str) or not api or not kind:
        return None
    if api.split("/")[0] == GROUP or kind in KINDS:
        return None
    return api


def validate_file(path: Path, queue_errors: dict[tuple[str, str], list[str]] | None = None) -> list[str]:
    """Lines to print for one file; lines starting with 'OK ' are good documents, 'SKIP ' other APIs'.
    `queue_errors`: the rules over several Queues broken by a Queue of this file ((file, name) → lines,
    from `queue_lines`), printed in place of its OK line."""
    try:
        docs = load_yaml_documents(read_text(path), str(path))
    except InputError as exc:
        return [str(exc)]
    if not docs:
        return [f"{path}: no YAML documents found"]
    lines: list[str] = []
    for doc in docs:
        api = foreign(doc)
        if api is not None:
            lines.append(
                f"SKIP {path} ({_describe(doc)}): {api} is not Tessera's API; the API server checks it"
            )
            continue
        errors = manifest_errors(doc)
        cross = (queue_errors or {}).get((str(path), _queue_name(doc)), []) if not errors else []
        lines.extend(cross)
        if not errors and not cross:
            lines.append(f"OK {path}" + (f" ({_describe(doc)})" if len(docs) > 1 else ""))
        for field_path, message in errors:
            lines.append(f"{path}: {_describe(doc)}: {field_path or '<document>'}: {message}")
    return lines


def _queue_name(doc: Any) -> str:
    if isinstance(doc, dict) and doc.get("kind") == "Queue":
        return str((doc.get("metadata") or {}).get("name", ""))
    return ""


def queue_lines(files: list[Path]) -> dict[tuple[str, str], list[str]]:
    """The rules over several Queues (children's guarantees within the parent's, no cycle) among the
    valid Queues of all the files, by (file, Queue name); a parent not given is taken to exist on the
    cluster."""
    specs: dict[str, QueueSpec] = {}
    where: dict[str, Path] = {}
    for path in files:
        try:
            docs = load_yaml_documents(read_text(path), str(path))
        except InputError:
            continue
        for doc in docs:
            if isinstance(doc, dict) and doc.get("kind") == "Queue" and not manifest_errors(doc):
                name = str(doc["metadata"]["name"])
                specs[name] = QueueSpec.model_validate(doc["spec"])
                where[name] = path
    out: dict[tuple[str, str], list[str]] = {}
    for name, errors in sorted(hierarchy_errors(specs).items()):
        for field_path, message in errors:
            if not message.endswith("does not exist"):
                line = f"{where[name]}: Queue/{name}: {field_path}: {message}"
                out.setdefault((str(where[name]), name), []).append(line)
    return out


def run(args: argparse.Namespace) -> int:
    failed = False
    files = _files(args.paths)
    if not files:
        print("no manifests found in " + ", ".join(str(p) for p in args.paths))
        return 1
    # Checked first, so that no Queue the hierarchy rules refuse is printed OK before its errors.
    cross = queue_lines(files)
    for path in files:
        for line in validate_file(path, cross):
            failed |= not line.startswith(("OK ", "SKIP "))
            print(line)
    log.debug("validated %d file(s)", len(files))
    return 1 if failed else 0
