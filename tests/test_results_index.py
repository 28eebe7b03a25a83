"""docs/results/index.py: the results index is generated from the runs' manifests and is up to date."""
import importlib.util
import json
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("results_index", REPO / "docs" / "results" / "index.py")
index = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(index)

FIELDS = {"topic", "run", "machine", "kind", "status", "commit", "command"}  # date: field or the run name's prefix


def _tree(tmp_path):
    run = tmp_path / "docs" / "results" / "trees" / "cpu-a" / "2026-01-02-first"
    run.mkdir(parents=True)
    (run / "rows.jsonl").write_text("{}\n")
    (run / "manifest.json").write_text(json.dumps({
        "topic": "trees", "run": "2026-01-02-first", "machine": "cpu-a", "date": "2026-01-02", "kind": "measured",
        "status": "superseded", "commit": "commit not recorded", "command": "adaspec compare", "recorded_in": "abc, def"}))
    other = tmp_path / "docs" / "results" / "trees" / "cpu-a" / "2026-01-03-second"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({
        "topic": "trees", "run": "2026-01-03-second", "machine": "cpu-a", "date": "2026-01-03", "kind": "PREDICTED",
        "status": "current", "commit": "1234567", "command": "adaspec map"}))
    (tmp_path / "docs" / "results" / "trees" / "run.sh").write_text("echo\n")
    (tmp_path / "docs" / "findings").mkdir()
    (tmp_path / "docs" / "findings" / "trees.md").write_text(
        "# Trees\n[rows](../results/trees/cpu-a/2026-01-02-first/rows.jsonl#x)\n")
    (tmp_path / "README.md").write_text("see `docs/results/trees/cpu-a/2026-01-03-second/`\n")
    return tmp_path


def test_the_index_lists_every_run_with_its_status_and_the_pages_citing_it(tmp_path):
    root = _tree(tmp_path)
    text = index.render(root)
    first = next(line for line in text.splitlines() if "2026-01-02-first" in line)
    second = next(line for line in text.splitlines() if "2026-01-03-second" in line)
    assert "superseded" in first and "recorded in abc … def, 2 commits" in first
    assert "[trees](../findings/trees.md)" in first
    assert "PREDICTED" in second and "current" in second and "[README](../../README.md)" in second
    assert text.index("2026-01-02-first") < text.index("2026-01-03-second")  # by date
    assert "[run.sh](trees/run.sh)" in text


def test_check_fails_until_the_index_is_written(tmp_path):
    root = _tree(tmp_path)
    assert index.main(["--check"], root=root) == 1
    assert index.main([], root=root) == 0
    assert index.main(["--check"], root=root) == 0


def test_the_committed_index_is_up_to_date():
    assert index.main(["--check"]) == 0, "run: python docs/results/index.py"


def test_every_result_file_belongs_to_a_run_with_a_complete_manifest():
    runs = index.load_runs(REPO)
    for run, manifest in runs.items():
        assert FIELDS <= set(manifest), (run, FIELDS - set(manifest))
        assert manifest["status"] in {"current", "superseded"}, run
        assert manifest["kind"] in {"measured", "PREDICTED"}, run
        assert re.match(r"\d{4}-\d\d-\d\d$", index.run_date(manifest)), run
    tracked = subprocess.run(["git", "ls-files", "docs/results"], cwd=REPO, capture_output=True, text=True).stdout
    for path in tracked.split():
        parts = path.split("/")
        if len(parts) <= 4 or not (REPO / path).exists():  # INDEX.md, index.py, a topic's shared scripts
            continue
        assert index.owner(path, runs) is not None, f"{path} is in no run folder with a manifest.json"
