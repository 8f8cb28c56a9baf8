"""The shell, YAML and Python blocks of README.md and docs/*.md run against a small fixture warehouse (the embedded
sample ingested, hand-made profiles, the pivot sets selected: no model, no demo run), each page's blocks in order in
one folder of their own that holds `pivot.yaml`, `my.yaml` (the fixture's config) and `warehouse/`:

  bash    `pivot sql | export | verify | check | config` run in-process (an export is read back); a `# {...}` line
          after a command is the output documented for it (a subset of the printed JSON line); `cat > F <<'EOF'`
          writes F; `duckdb` runs the CLI; any other command fails the test unless the block is marked skip.
  yaml    a pivot config (every top-level key one of pivot.yaml's) validates merged into the defaults (the config
          model: unknown keys are errors) and its verifier sets build; any other YAML is a Dagster instance's
          dagster.yaml, validated by Dagster's own schema.
  python  `# NAME.py` is a file of the reader's (written into every page's folder, then imported);
          `# pivot_assets/....py` a module of the package (run as it, registrations undone after); else run as is.
  toml    a `pivot_curation.verifiers` entry-point table is installed, for the YAML that names it.

A block that must not run (a demo run, training, a GPU, a Ray cluster, `make ...`) carries
`<!-- docs-test: skip (why) -->` on the line right before its fence; a mark without a reason fails.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import io
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from pivot_jobs.cli import main as pivot

pytestmark = pytest.mark.scenario  # the fixture warehouse: a Dagster ingest and the pivot sets, ~10-20 s

REPO = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!-- docs-test: skip \((?P<why>.*)\) -->$")
RUN_LANGS = ("bash", "yaml", "python", "toml")
RUNNABLE_VERBS = {"sql", "export", "verify", "check", "config"}  # seconds on the fixture; `run`, `ui` are not
FIXTURE_CONFIG = ("warehouse: ./warehouse\nsample: {n_trajectories: 12, seed: 5}\npolicy: {model: embedded}\n"
                  "training: {init: reference}\n")

@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def parse_blocks(page: str, text: str) -> list[Block]:
    """The fenced blocks of a page with their skip marks; ValueError for a mark without a reason or one that is not
    on the line right before a fence."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        line = lines[i]
        if "docs-test" in line:
            mark = MARK.match(line.strip())
            if not mark or not mark["why"].strip():
                raise ValueError(f"{page}:{i + 1}: a docs-test mark is `<!-- docs-test: skip (why) -->` with a reason: "
                                 f"{line.strip()!r}")
            if i + 1 >= len(lines) or not FENCE.match(lines[i + 1]):
                raise ValueError(f"{page}:{i + 1}: a docs-test mark stands on the line right before a fence")
        fence = FENCE.match(line)
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            body = "\n".join(lines[i + 1:end])
            mark = MARK.match(lines[i - 1].strip()) if i else None
            skip = mark["why"].strip() if mark else None
            blocks.append(Block(page, i + 1, fence[1], body, skip))
            i = end
        i += 1
    return blocks


def page_blocks(page: str) -> list[Block]:
    return parse_blocks(page, (REPO / page).read_text(encoding="utf-8"))


# -- the parser and the marks (no warehouse) ------------------------------------------------------------------------

def test_a_mark_without_a_reason_fails_and_one_with_a_reason_skips():
    fenced = "\n```bash\nmake demo\n```\n"
    with pytest.raises(ValueError, match="with a reason"):
        parse_blocks("x.md", "<!-- docs-test: skip () -->" + fenced)
    with pytest.raises(ValueError, match="with a reason"):
        parse_blocks("x.md", "<!-- docs-test: skip -->" + fenced)
    with pytest.raises(ValueError, match="right before a fence"):
        parse_blocks("x.md", "<!-- docs-test: skip (a demo run) -->\n\n```bash\nmake demo\n```\n")
    (block,) = parse_blocks("x.md", "<!-- docs-test: skip (a demo run) -->" + fenced)
    assert block.skip == "a demo run" and block.lang == "bash" and block.text == "make demo"


def test_every_page_parses_and_every_mark_is_on_a_block_that_runs():
    blocks = [b for page in PAGES for b in page_blocks(page)]  # raises on a bad mark
    assert [b.where for b in blocks if b.skip is not None and b.lang not in RUN_LANGS] == []  # a mark on a block
    # that never runs says nothing


# -- the fixture warehouse ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    """The embedded sample ingested (`pivot run --select trajectories,turns`), hand-made profiles (K=4, all-fail to
    all-pass turns: tests/curation/test_pivot_checks.py) and the pivot sets with pivot_dataset, once for the module."""
    import dagster as dg

    from pivot_assets.core.warehouse import Warehouse
    from pivot_jobs.definitions import build_definitions
    from pivot_jobs.runner import run_assets
    from tests.curation.test_pivot_checks import PIVOT_ASSETS, write_profiles
    from tests.projects import ingested_sample

    with ingested_sample(tmp_path_factory.mktemp("docs-warehouse"), FIXTURE_CONFIG) as root:
        wh = Warehouse(root / "warehouse")
        write_profiles(wh, wh.read("turns").sort("turn_id").to_dicts())
        report = run_assets(build_definitions("pivot.yaml"), [dg.AssetKey(a) for a in PIVOT_ASSETS],
                            dg.DagsterInstance.get())
        assert report.success, report
    return root / "warehouse"


class PageRun:
    """One page's blocks, run in order in its own folder."""

    def __init__(self, page: str, folder: Path, monkeypatch: pytest.MonkeyPatch):
        self.page, self.dir, self.mp = page, folder, monkeypatch
        self.last_output = ""

    # bash -----------------------------------------------------------------------------------------------------
    def bash(self, block: Block) -> None:
        lines = re.sub(r"\\\n\s*", " ", block.text).splitlines()
        i = 0
        while i < len(lines):
            line = lines[i].strip()
            i += 1
            if not line:
                continue
            if line.startswith("#"):
                documented = line[1:].strip()
                if documented.startswith("{"):  # the output documented for the command above
                    printed = json.loads(self.last_output.strip().splitlines()[0])
                    expected = json.loads(documented)
                    assert {k: printed.get(k) for k in expected} == expected, (block.where, printed)
                continue
            heredoc = re.fullmatch(r"cat > (\S+) <<'?(\w+)'?", line)
            if heredoc:
                end = lines.index(heredoc[2], i)
                (self.dir / heredoc[1]).write_text("\n".join(lines[i:end]) + "\n")
                i = end + 1
                continue
            self.command(block, shlex.split(line, comments=True))

    def command(self, block: Block, argv: list[str]) -> None:
        program = Path(argv[0]).name
        if program == "pivot":
            verb = argv[1]
            assert verb in RUNNABLE_VERBS, (f"{block.where}: `pivot {verb}` does not run in seconds on a fixture: "
                                            "mark the block <!-- docs-test: skip (why) -->")
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = pivot(argv[1:])
            assert code == 0, (block.where, argv, err.getvalue())
            self.last_output = out.getvalue()
            assert self.last_output.strip(), (block.where, argv, "printed nothing")
            if verb == "export":
                self.read_back_export(block, argv)
        elif program == "duckdb":
            duckdb_cli = Path(sys.executable).parent / "duckdb"
            result = subprocess.run([str(duckdb_cli), *argv[1:]], cwd=self.dir, capture_output=True, text=True,
                                    timeout=60)
            assert result.returncode == 0 and result.stdout.strip(), (block.where, argv, result.stderr)
            self.last_output = result.stdout
        else:
            pytest.fail(f"{block.where}: the test runs `pivot` and `duckdb` lines, not `{program}`: mark the block "
                        "<!-- docs-test: skip (why) --> or teach this test the command")

    def read_back_export(self, block: Block, argv: list[str]) -> None:
        out = self.dir / argv[argv.index("--out") + 1]
        if "--format" in argv and argv[argv.index("--format") + 1] == "nemo-gym":
            rows = [json.loads(line) for line in out.read_text().splitlines()]
            assert rows and all({"responses_create_params", "expected_action", "agent_ref"} <= set(r) for r in rows)
        else:
            from datasets import load_from_disk

            dataset = load_from_disk(str(out))
            assert len(dataset) and "prompt" in dataset.column_names, block.where

    # yaml -----------------------------------------------------------------------------------------------------
    def yaml(self, block: Block) -> None:
        from pydantic import ValidationError

        from pivot_assets.core.config import PivotConfig
        from pivot_assets.verifiers import VerifierSets

        data = yaml.safe_load(block.text)
        assert isinstance(data, dict), f"{block.where}: a YAML block is a mapping of keys"
        if set(data) <= set(PivotConfig.model_fields) - {"base_dir"}:
            try:
                cfg = PivotConfig.model_validate({**data, "base_dir": str(self.dir)})
            except ValidationError as e:
                pytest.fail(f"{block.where}: not a valid pivot config: {e}")
            VerifierSets.from_config(cfg)
        else:
            self.dagster_yaml(block, data)

    def dagster_yaml(self, block: Block, data: dict) -> None:
        from dagster._core.instance.config import dagster_instance_config

        home = self.dir / f"dagster-yaml-{block.line}"
        home.mkdir()
        (home / "dagster.yaml").write_text(block.text)

        def env_names(value):
            if isinstance(value, dict):
                if set(value) == {"env"}:
                    yield value["env"]
                for v in value.values():
                    yield from env_names(v)

        for name in env_names(data):
            self.mp.setenv(name, "postgresql+psycopg2://user:password@localhost:5432/dagster")
        config, _ = dagster_instance_config(str(home))
        assert set(config) == set(data), block.where

    # python ---------------------------------------------------------------------------------------------------
    def python(self, block: Block) -> None:
        first = block.text.splitlines()[0]
        path = re.fullmatch(r"#\s*([\w./-]+\.py)", first)
        if path and path[1].startswith("pivot_assets/"):
            self.package_module(block, path[1])
        elif path:  # written into the folder by user_files(): import it
            name = Path(path[1]).stem
            importlib.import_module(name)
        else:
            exec(compile(block.text, block.where, "exec"), {"__name__": "__docs__"})

    def package_module(self, block: Block, path: str) -> None:
        """A module of the package as the page shows it, run as that module; the formats it registers are undone."""
        from pivot_assets.ingest.formats import registry

        name = path.removesuffix(".py").replace("/", ".")
        before = dict(registry._FORMATS)
        self.mp.setattr(registry, "_FORMATS", registry._FORMATS)  # restored after the test
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
        module.__package__ = name.rpartition(".")[0]
        exec(compile(block.text, block.where, "exec"), module.__dict__)
        added = [f for f in registry._FORMATS if f not in before]
        assert added, f"{block.where}: a format module registers a format"
        for fmt in added:
            registry.unregister(fmt)

    # toml -----------------------------------------------------------------------------------------------------
    def toml(self, block: Block) -> None:
        from pivot_assets.verifiers import user_verifiers

        group = user_verifiers.ENTRY_POINT_GROUP
        declared = tomllib.loads(block.text).get("project", {}).get("entry-points", {}).get(group, {})
        if not declared:
            return
        points = [importlib.metadata.EntryPoint(name=n, value=v, group=group) for n, v in declared.items()]
        installed = importlib.metadata.entry_points

        def entry_points(**select):
            if select.get("group") == group:
                return importlib.metadata.EntryPoints(p for p in points if select.get("name") in (None, p.name))
            return installed(**select)

        self.mp.setattr(importlib.metadata, "entry_points", entry_points)
        for point in points:  # the entry point's module: the docs' file that defines the class it names
            text = next(t for t in user_files().values() if re.search(rf"^class {point.attr}\b", t, re.M))
            package = self.dir.joinpath(*point.module.split(".")[:-1])
            package.mkdir(parents=True, exist_ok=True)
            (package / "__init__.py").touch()
            (package / f"{point.module.rpartition('.')[2]}.py").write_text(text)

    def run(self, block: Block) -> None:
        getattr(self, block.lang)(block)


@functools.cache
def user_files() -> dict[str, str]:
    """The files the docs have the reader write (a Python block whose first line is `# NAME.py`), by name."""
    files = {}
    for page in PAGES:
        for b in page_blocks(page):
            first = b.text.splitlines()[0] if b.text else ""
            named = re.fullmatch(r"#\s*([\w.-]+\.py)", first) if b.lang == "python" else None
            if named:
                files[named[1]] = b.text + "\n"
    return files


RUN_PAGES = [p for p in PAGES if any(b.lang in RUN_LANGS and b.skip is None for b in page_blocks(p))]


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_pages_blocks_run(page, warehouse, tmp_path, monkeypatch):
    from pivot_assets.verifiers import user_verifiers

    folder = tmp_path / "page"
    folder.mkdir()
    (folder / "warehouse").symlink_to(warehouse, target_is_directory=True)
    for name in ("pivot.yaml", "my.yaml"):
        (folder / name).write_text(FIXTURE_CONFIG)
    for name, text in user_files().items():
        (folder / name).write_text(text)
    modules = set(sys.modules)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.delenv("PIVOT_CONFIG", raising=False)
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(user_verifiers, "_CONFIG_DIRS", list(user_verifiers._CONFIG_DIRS))
    runner = PageRun(page, folder, monkeypatch)
    try:
        for block in page_blocks(page):
            if block.lang in RUN_LANGS and block.skip is None:
                runner.run(block)
    finally:
        for name in set(sys.modules) - modules:  # the reader's modules, imported from this folder
            if getattr(sys.modules[name], "__file__", None) and str(folder) in sys.modules[name].__file__:
                del sys.modules[name]
