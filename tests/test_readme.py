"""README.md stays a short page for users: its length, its setup commands, and a results block that is exactly what
benchmarks/readme_results.py renders from benchmarks/results/*.json. No Spark."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import readme_results

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RUN_COMMAND = 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[local]" && .venv/bin/erg run'
TEST_COMMAND = ('python3 -m venv .venv && .venv/bin/pip install -q -e ".[local,test]" && '
                '.venv/bin/python -m pytest')


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the measurements belong in benchmarks/README.md"


def test_readme_keeps_the_two_setup_commands_verbatim():
    lines = [line.strip() for line in README.read_text().splitlines()]
    assert RUN_COMMAND in lines
    assert TEST_COMMAND in lines


def test_readme_results_block_is_the_rendered_results():
    text = README.read_text()
    assert text.count(readme_results.BEGIN) == 1 and text.count(readme_results.END) == 1
    assert readme_results.current_block(text) == readme_results.render(), (
        "README.md's results block is out of date: run python benchmarks/readme_results.py")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "readme_results.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_block_is_short_and_names_its_sources():
    block = readme_results.render()
    assert len(block.splitlines()) <= 30
    for name in ("table2.json", "generator_quality.json", "scale.json", "volume.json", "chaos.json"):
        if (readme_results.RESULTS / name).exists():
            assert f"`{name}`" in block, name


def test_check_fails_on_a_stale_readme_and_rewriting_fixes_it(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{readme_results.BEGIN}\nold numbers\n{readme_results.END}\n\nafter\n")
    script = str(ROOT / "benchmarks" / "readme_results.py")
    stale = subprocess.run([sys.executable, script, "--check", "--readme", str(readme)],
                           capture_output=True, text=True, timeout=60)
    assert stale.returncode == 1 and "out of date" in stale.stderr
    subprocess.run([sys.executable, script, "--readme", str(readme)], check=True, capture_output=True, timeout=60)
    text = readme.read_text()
    assert "old numbers" not in text and text.endswith(f"{readme_results.END}\n\nafter\n")
    assert readme_results.current_block(text) == readme_results.render()
    assert subprocess.run([sys.executable, script, "--check", "--readme", str(readme)], timeout=60).returncode == 0


def test_missing_files_and_keys_leave_their_lines_out(tmp_path):
    assert "no results" in readme_results.render(tmp_path)
    (tmp_path / "table2.json").write_text(json.dumps({"rows": [
        {"style": "humor", "captioner": "nic", "variant": "original", "cider": 0.3, "cls": 0.8},
        {"style": "humor", "captioner": "nic", "variant": "augmented", "cider": 0.4}]}))
    (tmp_path / "scale.json").write_text(json.dumps({"sizes": {}, "generate": {"udf_captions_per_s": 10.0}}))
    (tmp_path / "chaos.json").write_text("{not json")
    block = readme_results.render(tmp_path)
    assert "| humor | nic | 30.0 -> 40.0 | - | - |" in block
    assert "scale.json" not in block and "chaos.json" not in block
