"""benchmarks/gpu_models.py on the CPU at tiny sizes: it imports without pyspark or faiss (a GPU machine has neither),
runs every part through the UDF batch functions, and writes a JSON with sane rates and bf16 agreement."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCKED = ("pyspark", "faiss", "mlflow", "jobs", "pydantic")
RUNNER = f"""
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in {BLOCKED!r}:
            raise ImportError('not on the GPU machine: ' + name)
sys.meta_path.insert(0, Block())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def test_gpu_models_runs_on_cpu_without_spark_or_faiss_and_reports_rates(tmp_path) -> None:
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, "-c", RUNNER, str(REPO / "benchmarks" / "gpu_models.py"), "--device",
                           "cpu", "--tiny", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                            "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["device"], result["scale"]) == ("cpu", "tiny") and "--tiny" in result["command"]

    embed = result["embed"]
    assert set(embed["runs"]) == {"cpu/fp32", "cpu/bf16"}
    assert all(run["items"] == 96 and run["items_per_s"] > 0 for run in embed["runs"].values())
    assert 0.0 <= embed["bf16_top1_agreement"] <= 1.0 and 0.9 < embed["bf16_mean_cosine_to_fp32"] <= 1.0 + 1e-6
    assert embed["speedup_vs_cpu"]["cpu/fp32"] == 1.0

    generate = result["generate"]
    assert set(generate["runs"]) == {"cpu/fp32", "cpu/bf16"} and generate["bf16_agreement_items"] == 8
    assert 0.0 <= generate["bf16_same_text_share"] <= 1.0 and generate["parameters"] > 0
    assert all(run["items_per_s"] > 0 for run in generate["runs"].values())

    for kind in ("nic", "transformer"):
        run = result["captioners"][kind]["runs"]["cpu"]
        assert run["steps"] == 6 and run["steps_per_s"] > 0 and run["items_per_s"] == run["steps_per_s"] * 32
        assert run["loss_first"] > 0 and run["loss_last"] > 0
    classifier = result["classifier"]["runs"]["cpu"]
    assert classifier["steps"] == 4 and classifier["steps_per_s"] > 0 and classifier["loss"] > 0
