"""The user documentation stays true: README short and free of history, generated tables current,
links, module paths and file paths pointing at things that exist, the demo's figures read from results."""

import ast
import importlib.util
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README] + DOCS
GENERATOR = REPO / "benchmarks" / "common" / "report_tables.py"
PATH_ROOTS = ("tangram_sglang/", "benchmarks/", "configs/", "launch/", "docs/", "cuda/")


def load_by_path(path: pathlib.Path, name: str):
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return "\n".join(part for i, part in enumerate(text.split("```")) if i % 2 == 0)


def links(text: str) -> list[str]:
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", prose(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    out, seen = set(), {}
    for line in prose(path.read_text()).splitlines():
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return out


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"


def test_generated_tables_are_current():
    out = subprocess.run([sys.executable, str(GENERATOR), "--check"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, "run .venv/bin/python -m benchmarks.common.report_tables\n" + out.stdout + out.stderr


def test_generator_is_light():
    """The generator imports the standard library only, so the docs check runs without the venv's packages."""
    imported = set()
    for node in ast.walk(ast.parse(GENERATOR.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"__future__", "argparse", "json", "math", "pathlib"}, imported


def test_every_results_file_is_described():
    """The results index says what each results file measures (report_tables.INDEX)."""
    tables = load_by_path(GENERATOR, "tangram_report_tables_index")
    stems = {p.name.split(".")[0] for kind in tables.KINDS for p in (tables.RESULTS / kind).glob("*") if p.is_file()}
    assert stems, "no results files found"
    missing = sorted(stems - set(tables.INDEX))
    assert not missing, f"add {missing} to INDEX in benchmarks/common/report_tables.py"


def test_every_docs_table_is_placed():
    tables = load_by_path(GENERATOR, "tangram_report_tables_blocks")
    text = (REPO / "docs" / "results.md").read_text()
    missing = [n for n in tables.DOC_BLOCKS if f"<!-- results:{n}:begin -->" not in text]
    assert not missing, f"docs/results.md lacks the generated tables {missing}"


def test_relative_links_resolve():
    checked, broken = 0, []
    for page in PAGES:
        for target in links(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert checked > 20
    assert not broken, broken


def test_named_repo_paths_exist():
    named, missing = 0, []
    for page in PAGES:
        for span in re.findall(r"`([^`\s]+)`", page.read_text()):
            path = span.split("::")[0].rstrip(".,:")
            if not path.startswith(PATH_ROOTS) or any(c in path for c in "<>*{}"):
                continue
            named += 1
            if not (REPO / path).exists():
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert named > 10
    assert not missing, missing


def test_python_m_modules_exist():
    names = set()
    for page in PAGES:
        names |= set(re.findall(r"python -m (tangram_sglang(?:\.\w+)+)", page.read_text()))
    assert {"tangram_sglang.calibrate", "tangram_sglang.profile.uniform"} <= names
    missing = [n for n in sorted(names) if importlib.util.find_spec(n) is None]
    assert not missing, missing


def test_readme_has_no_history():
    text = README.read_text()
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)
    assert not hashes, f"commit hashes in README.md: {hashes}"
    issues = re.findall(r"\bissues?\s+#?\d+|#\d+\b", text, flags=re.I)
    assert not issues, f"issue references in README.md: {issues}"


def test_readme_recommends_what_the_results_show():
    tables = load_by_path(GENERATOR, "tangram_report_tables_recommended")
    rows = [line for line in README.read_text().splitlines() if line.startswith("|")]
    for key, spec in tables.SHIPPED.items():
        ratio = tables.recommended(key)["ratio"]
        row = [r for r in rows if pathlib.Path(spec["profile"]).name in r]
        assert row, f"README's profile table lacks {spec['profile']}"
        assert f"**{ratio:g}**" in row[0], f"README should recommend {ratio:g} for {spec['profile']}: {row[0]}"


def test_a_shipped_profile_serves_its_recommended_ratio_by_default():
    """A user who passes only --tangram-profile gets the ratio the results recommend (its default_ratio)."""
    from tangram_sglang.profile import load_profile

    tables = load_by_path(GENERATOR, "tangram_report_tables_default")
    for key, spec in tables.SHIPPED.items():
        ratio = tables.recommended(key)["ratio"]
        default = load_profile(str(REPO / spec["profile"])).default_ratio
        assert default == ratio, f"{spec['profile']}: default_ratio {default:g}, the results recommend {ratio:g}"


def test_demo_prints_measured_figures(tmp_path):
    chat = load_by_path(REPO / "launch" / "chat.py", "tangram_launch_chat")
    tables = load_by_path(GENERATOR, "tangram_report_tables_demo")
    rec = tables.recommended("smollm2")
    profile, ratio, why = chat.default_profile(str(tmp_path / "SmolLM2-135M-Instruct"), str(tmp_path))
    assert pathlib.Path(profile).name == pathlib.Path(rec["profile"]).name
    assert ratio == rec["ratio"]
    served, full = rec["served"], rec["full"]
    assert f"{served['correct']}/{served['judged']}" in why and f"{full['correct']}/{full['judged']}" in why
    source = (REPO / "launch" / "chat.py").read_text()
    assert not re.findall(r"\d+/\d+ |\d+% ", source), "launch/chat.py types figures by hand"
