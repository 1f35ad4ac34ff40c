"""The generated configuration reference is up to date, and the architecture and
troubleshooting pages name only files, functions and config keys that exist."""

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from lucid import config as C
from lucid import config_doc

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["docs/architecture.md", "docs/troubleshooting.md", "docs/configuration.md",
           "docs/exploration.md"]


def test_configuration_md_is_up_to_date():
    current = config_doc.DOC_PATH.read_text()
    assert current == config_doc.render(), (
        "docs/configuration.md is out of date: run `python -m lucid.config_doc`")


def _config_keys() -> set[str]:
    keys = {f.name for f in dataclasses.fields(C.Config)}
    for name, cls in config_doc.SECTIONS:
        keys |= {f"{name}.{f.name}" for f in dataclasses.fields(cls)}
    return keys


def test_every_config_key_is_described():
    keys = _config_keys()
    stale = set(config_doc.DESCRIPTIONS) - keys
    assert not stale, f"config_doc.DESCRIPTIONS names keys that do not exist: {stale}"
    empty = re.findall(r"^\| `([^`]+)` \|[^\n]*\|  \|$", config_doc.render(), re.M)
    assert not empty, (f"config keys without a description: {empty}; add a comment next to the "
                       f"field in lucid/config.py (or an entry in config_doc.DESCRIPTIONS)")
    for key in keys:
        assert f"`{key}`" in config_doc.render(), key
    for preset in C.PRESETS:
        assert f"| `{preset}` |" in config_doc.render()


def _definitions() -> set[str]:
    """Top-level names, Class.method and Class.attribute names defined anywhere in lucid/."""
    names: set[str] = set()
    for path in (ROOT / "lucid").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(f"{node.name}.{item.name}")
                    for sub in ast.walk(item):  # attributes: self.x = ... in its methods
                        if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
                                and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                            names.add(f"{node.name}.{sub.attr}")
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


@pytest.mark.parametrize("doc", CHECKED)
def test_docs_name_only_what_exists(doc):
    text = (ROOT / doc).read_text()
    defined = _definitions()
    keys = _config_keys()
    sections = {name for name, _ in config_doc.SECTIONS}
    for path in set(re.findall(r"\b(lucid/[\w/]*\w(?:\.py)?/?)", text)):
        assert (ROOT / path).exists(), f"{doc} names {path}, which does not exist"
    for code in set(re.findall(r"`([^`\n]+)`", text)):
        code = code.split("=")[0].strip()
        if re.fullmatch(r"[A-Z]\w*\.\w+", code):  # Class.method
            assert code in defined, f"{doc} names {code}, which is not defined in lucid/"
        elif re.fullmatch(r"lucid(\.\w+)+", code):  # lucid.module[.attr]
            parts = code.split(".")
            for i in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:i]))
                    break
                except ImportError:
                    continue
            for attr in parts[i:]:
                assert hasattr(obj, attr), f"{doc} names {code}, which does not exist"
                obj = getattr(obj, attr)
        elif re.fullmatch(r"[a-z]+\.\w+(\.\w+)?", code) and code.split(".")[0] in sections:
            key = ".".join(code.split(".")[:2])  # env.kwargs.gray -> env.kwargs
            assert key in keys, f"{doc} names the config key {code}, which does not exist"


def test_architecture_module_table_names_exist():
    text = (ROOT / "docs/architecture.md").read_text()
    table = text.split("## Modules\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(lucid/[^`]+)` \|[^|]*\| ([^\n]*) \|$", table, re.M)
    assert len(rows) >= 15
    defined = _definitions()
    for path, names in rows:
        for name in re.findall(r"`([A-Za-z_]\w*)`", re.sub(r"\([^)]*\)", "", names)):
            assert name in defined, f"docs/architecture.md: {path} lists {name}, not in lucid/"
        # the names in parentheses are methods of the class before them
        for cls, methods in re.findall(r"`(\w+)` \(([^)]*)\)", names):
            for m in re.findall(r"`(\w+)`", methods):
                assert f"{cls}.{m}" in defined, f"{cls}.{m}"


def test_the_presets_table_matches_the_presets():
    """docs/presets.md's table (model, envs, B × T, train ratio) is what each preset resolves
    to."""
    text = (ROOT / "docs/presets.md").read_text()
    rows = re.findall(r"^\| (`[^|]+) \| (\w+) \| (\d+) \| (\d+) × (\d+) \| (\d+) \|", text, re.M)
    seen = set()
    for names, size, envs, b, t, ratio in rows:
        for name in re.findall(r"`([^`]+)`", names):
            cfg = C.make_config(name)
            assert (cfg.model.size, cfg.env.num_envs, cfg.train.batch_size,
                    cfg.train.batch_length, cfg.train.train_ratio) == (
                size, int(envs), int(b), int(t), float(ratio)), name
            seen.add(name)
    assert seen == set(C.PRESETS), f"presets missing from docs/presets.md: {set(C.PRESETS) - seen}"


def test_config_doc_command_checks_prints_and_rewrites_the_reference(tmp_path, monkeypatch,
                                                                     capsys):
    """`python -m lucid.config_doc`: --check exits 0 when the file is current and 1 when it
    is stale or missing, --stdout prints the reference without writing, and no flag rewrites
    the file with exactly what render() gives."""
    assert config_doc.main(["--check"]) == 0  # the checked-in file
    path = tmp_path / "configuration.md"
    monkeypatch.setattr(config_doc, "DOC_PATH", path)
    assert config_doc.main(["--check"]) == 1  # missing
    assert "out of date" in capsys.readouterr().err
    path.write_text(config_doc.render() + "stale line\n")
    assert config_doc.main(["--check"]) == 1
    assert config_doc.main(["--stdout"]) == 0
    assert capsys.readouterr().out == config_doc.render()
    assert path.read_text().endswith("stale line\n")  # --stdout wrote nothing
    assert config_doc.main([]) == 0
    assert path.read_text() == config_doc.render()
    assert config_doc.main(["--check"]) == 0
