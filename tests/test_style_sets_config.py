"""Style sets in the conf: every style in exactly one set, defaults matching ``styles``, per-set classifier
settings (the paper's batch 32 / lr 1e-5 for FlickrStyle10K and batch 64 / lr 2e-5 for SentiCap)."""
from __future__ import annotations

import pytest

from jobs.platform.config import ConfigError, load_config


def test_default_sets_and_per_set_settings(monkeypatch):
    monkeypatch.setenv("ERG_HOME", "/tmp/erg-conf-test")
    cfg = load_config("local")
    assert cfg.style_sets == {"flickrstyle": ["humor", "romantic"], "senticap": ["positive", "negative"]}
    flickr, senti = cfg.extract.classifier_for("flickrstyle"), cfg.extract.classifier_for("senticap")
    assert (flickr.batch_size, flickr.lr, flickr.epochs) == (32, 1e-5, 3)
    assert (senti.batch_size, senti.lr, senti.epochs) == (64, 2e-5, 3)
    assert cfg.style_set_of("negative") == "senticap"
    assert load_config("test", ["styles=[humor, positive]"]).style_sets == {"flickrstyle": ["humor"],
                                                                           "senticap": ["positive"]}


@pytest.mark.parametrize("override, message", [
    ("style_sets={a: [humor, romantic], b: [positive, negative, humor]}", "in both 'a' and 'b'"),
    ("style_sets={a: [humor, romantic], b: [positive]}", "['negative'] are in no set"),
    ("style_sets={a: [humor, romantic, sarcastic], b: [positive, negative]}", "'sarcastic' is not one of styles"),
    ("styles=[humor, sarcastic]", "['sarcastic'] are in no set"),
    ("extract.classifier_overrides={nope: {lr: 1.0e-5}}", "unknown style sets ['nope']"),
    ("extract.classifier_overrides={senticap: {lr: -1}}", "classifier_overrides.senticap: lr"),
    ("extract.classifier_overrides={senticap: {lrr: 1}}", "classifier_overrides.senticap: lrr"),
])
def test_bad_style_sets_fail_naming_the_problem(override, message):
    with pytest.raises(ConfigError, match=None) as err:
        load_config("test", [override])
    assert message in str(err.value)
