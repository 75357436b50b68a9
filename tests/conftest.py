"""Shared fixtures: one local Spark session (Delta Lake, local[2]) per test session, state in a tmp folder."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(os.environ.get("ERG_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture(scope="session")
def erg_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("erg_home")
    os.environ["ERG_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def test_cfg(erg_home):
    from jobs.platform.config import load_config

    return load_config("test")


@pytest.fixture(scope="session")
def spark(test_cfg):
    from jobs.platform.spark import get_spark

    session = get_spark(test_cfg)
    yield session
    session.stop()


@pytest.fixture
def fresh_cfg(erg_home, request):
    """A test conf whose tables live in a schema of their own (named after the test), so tests don't collide."""
    from jobs.platform.config import load_config

    schema = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:40].lower()
    sample_dir = erg_home / "samples" / schema
    return load_config("test", [f"tables.schema={schema}", f"sample.dir={sample_dir}"])


def pytest_collection_modifyitems(config, items):
    """Every test that uses the Spark session is marked ``spark`` (whether or not its module says so): the quick loop
    ``pytest -m "not spark"`` never starts one."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()) and item.get_closest_marker("spark") is None:
            item.add_marker(pytest.mark.spark)


def shared_data(*parts: str) -> Path:
    """A path under ../shared/data, or skip the test with a clear message when the data is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real caption data not found at {path} (see ../shared/data/README.md); skipping")
    return path
