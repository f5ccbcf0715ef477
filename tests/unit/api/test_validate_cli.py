"""`tessera validate` through the real CLI entry point."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tessera.cli import main

from .conftest import EXAMPLES, INVALID, expected_errors


def test_accepts_the_valid_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(EXAMPLES)]) == 0
    out = capsys.readouterr().out.splitlines()
    # Each file is its Namespace (not Tessera's: skipped, the API server checks it) and its objects.
    expected = []
    for p in sorted(EXAMPLES.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(p.read_text()) if d]
        for d in docs:
            what = f"{d['kind']}/{d['metadata']['name']}"
            if d["apiVersion"] == "v1":
                expected.append(f"SKIP {p} ({what}): v1 is not Tessera's API; the API server checks it")
            else:
                expected.append(f"OK {p}" + (f" ({what})" if len(docs) > 1 else ""))
    assert out == expected
    assert sum(line.startswith("SKIP ") for line in out) == 4


def test_an_unknown_kind_of_tesseras_api_is_still_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "typo.yaml"
    f.write_text("apiVersion: tessera.io/v1alpha1\nkind: Ap\nmetadata: {name: a}\n---\n"
                 "apiVersion: v1\nkind: App\nmetadata: {name: b}\n")  # fmt: skip
    assert main(["validate", str(f)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{f}: Ap/a: kind: must be one of App")
    assert out[1].startswith(f"{f}: App/b: apiVersion: ")


def test_rejects_each_invalid_example_with_its_field_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", *map(str, INVALID)]) == 1
    out = set(capsys.readouterr().out.splitlines())
    for path in INVALID:
        name = path.read_text().split("name: ", 1)[1].split("}", 1)[0]
        for field_path, message in expected_errors(path):
            assert any(
                line.startswith(f"{path}: ") and line.endswith(f"/{name}: {field_path}: {message}")
                for line in out
            ), (path, field_path)


def test_multi_document_file_and_bad_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    both = tmp_path / "both.yaml"
    both.write_text((EXAMPLES / "app.yaml").read_text() + "\n---\n" + INVALID[0].read_text())
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: App\n  bad: [indent\n")
    assert main(["validate", str(both), str(broken)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"SKIP {both} (Namespace/research)")
    assert out[1] == f"OK {both} (App/resnet50-lr-search)"
    assert any(line.startswith(f"{both}: App/") for line in out[1:])
    assert any(line.startswith(f"{broken}: not valid YAML") for line in out)


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    assert main(["validate", str(tmp_path)]) == 1


def test_queues_given_together_are_checked_as_a_hierarchy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "queues.yaml"
    head = "apiVersion: tessera.io/v1alpha1\nkind: Queue\n"
    f.write_text(
        f"{head}metadata: {{name: org}}\nspec: {{guaranteedGPUs: 4}}\n---\n"
        f"{head}metadata: {{name: a}}\nspec: {{parent: org, guaranteedGPUs: 3}}\n---\n"
        f"{head}metadata: {{name: b}}\nspec: {{parent: org, guaranteedGPUs: 2}}\n---\n"
        f"{head}metadata: {{name: c}}\nspec: {{parent: elsewhere}}\n"
    )
    assert main(["validate", str(f)]) == 1
    out = capsys.readouterr().out.splitlines()
    # Each Queue is valid alone; together the children ask for 5 of org's 4. `elsewhere` may exist already.
    # org's error stands where its OK line would (no "OK" for a Queue the hierarchy refuses).
    assert out[0] == (
        f"{f}: Queue/org: spec.guaranteedGPUs: children a, b are guaranteed 5 GPUs in all, above this queue's 4"
    )
    assert out[1:] == [f"OK {f} (Queue/{name})" for name in ("a", "b", "c")]
