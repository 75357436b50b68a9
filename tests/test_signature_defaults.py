"""A default in a ``models/`` or ``udfs/`` signature that mirrors a conf key must not contradict the schema.

The jobs pass these values from the conf; a signature default that mirrors one either is absent (the argument is
required: the caller says which value) or equals the schema's default, so that a reader of a function is never told
a value that does not apply. :data:`MIRRORS` declares which parameter mirrors which conf key; the test also checks
that every declared parameter exists, so the mapping stays honest."""
from __future__ import annotations

import importlib
import inspect

import pytest

from jobs.platform.config import schema_defaults

_DECODING = {p: f"generate.decoding.{p}" for p in ("strategy", "num_beams", "top_p", "temperature", "max_new_tokens",
                                                   "batch_size", "no_repeat_ngram_size", "repetition_penalty",
                                                   "constraint", "fast")}
_INDEX = {p: f"retrieve.index.{p}" for p in ("nlist", "nprobe", "hnsw_m", "ef_search", "ef_construction", "use_gpu",
                                             "gpu_fallback")}
_EVALUATION = {p: f"extract.evaluation.{p}" for p in ("name_or_path", "max_length", "l2", "epochs", "batch_size", "lr",
                                                      "max_train_captions", "seed")}

#: "module:qualified.name" -> {parameter: conf key it mirrors}
MIRRORS: dict[str, dict[str, str]] = {
    "models.generator:generate": {**_DECODING, "seed": "generate.generator.seed"},
    "models.generator:load_generator": {"max_source_len": "generate.generator.max_source_len",
                                        "max_target_len": "generate.generator.max_target_len"},
    "models.generator:fine_tune": {p: f"generate.generator.{p}" for p in ("epochs", "batch_size", "lr", "seed")},
    "models.generator:create_generator_from_config": {p: f"generate.generator.{p}"
                                                      for p in ("vocab_size", "config_overrides", "seed")},
    "models.generator:create_word_level_generator": {p: f"generate.generator.{p}"
                                                     for p in ("config_overrides", "embeddings", "seed")},
    "models.generator:create_bert2bert_from_minilm": {"seed": "generate.generator.seed"},
    "models.tokenizers_offline:train_gpt2_tokenizer": {"vocab_size": "generate.generator.vocab_size"},
    "models.tokenizers_offline:train_t5_tokenizer": {"vocab_size": "generate.generator.vocab_size"},
    "models.scene_index:build_scene_index": _INDEX,
    "models.scene_index:SceneIndex.search": {"top_k": "retrieve.top_k"},
    "models.style_classifier:StyleClassifier.__init__": {"max_length": "extract.classifier.max_length"},
    "models.style_classifier:StyleClassifier.load": {"max_length": "extract.classifier.max_length"},
    "models.style_classifier:load_style_classifier": {"max_length": "extract.classifier.max_length"},
    "models.style_classifier:fine_tune": {p: f"extract.classifier.{p}" for p in ("epochs", "batch_size", "lr",
                                                                               "weight_decay", "warmup_ratio", "seed")},
    "models.caption_scoring:train_evaluation_classifiers": {**_EVALUATION, "factual_label": "factual_label"},
    "models.caption_scoring:fit_logistic": {"l2": "extract.evaluation.l2"},
    "models.captioners:greedy_decode": {"max_len": "evaluate.max_len",
                                        "no_repeat_ngram_size": "evaluate.no_repeat_ngram_size"},
    "models.captioners:beam_decode": {p: f"evaluate.{p}" for p in ("beam_size", "max_len", "length_penalty",
                                                                   "no_repeat_ngram_size")},
    "models.augment_filters:apply_filters": {p: f"generate.filters.{p}" for p in (
        "ppl_max", "min_similarity", "min_content_similarity", "well_formed", "max_relatedness_drop")},
    "models.fluency:fluency_examples": {"max_examples": "generate.filters.fluency.max_examples"},
    "models.visual_relatedness:VisualRelatednessScorer.__init__": {"label_mode": "visual_relatedness.label_mode",
                                                                   "top_labels": "visual_relatedness.top_labels"},
    "udfs.captioning:make_captioner_evaluator": {"no_repeat_ngram_size": "evaluate.no_repeat_ngram_size"},
    "udfs.visual_rerank:make_beam_reranker": {"no_repeat_ngram_size": "evaluate.no_repeat_ngram_size"},
    "udfs.retrieval:ScenePayload.indexes": {"use_gpu": "retrieve.index.use_gpu", "gpu_fallback": "retrieve.index.gpu_fallback"},
}


def _function(target: str):
    module, qualname = target.split(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return inspect.unwrap(obj)


def _conf_value(cfg, key: str):
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


#: contradictions not yet removed: (target, parameter). Each still needs its callers (mostly tests that rely on the
#: default) to pass the value; the test fails when one is fixed without being taken off this list, or a new one
#: appears. build_scene_index's nlist=None means "from the scene count" (default_nlist), which jobs never use.
KNOWN_CONTRADICTIONS = {
    ("models.scene_index:build_scene_index", "nlist"),
    ("models.scene_index:build_scene_index", "nprobe"),
    ("models.scene_index:SceneIndex.search", "top_k"),
    ("models.style_classifier:fine_tune", "lr"),
}


def _contradictions(target: str, cfg) -> list[tuple[str, str, object, object]]:
    parameters = inspect.signature(_function(target)).parameters
    out = []
    for name, key in MIRRORS[target].items():
        assert name in parameters, f"{target} has no parameter {name!r}: fix MIRRORS"
        default = parameters[name].default
        if default is not inspect.Parameter.empty and default != _conf_value(cfg, key):
            out.append((name, key, default, _conf_value(cfg, key)))
    return out


@pytest.mark.parametrize("target", sorted(MIRRORS))
def test_signature_defaults_agree_with_the_schema(target):
    found = _contradictions(target, schema_defaults())
    new = [f"{name}={default!r} but {key} is {value!r}" for name, key, default, value in found
           if (target, name) not in KNOWN_CONTRADICTIONS]
    assert not new, (f"{target}: signature defaults contradict the conf keys they mirror: {new}; make the argument "
                     "required (the jobs pass the conf's value)")
    fixed = {name for t, name in KNOWN_CONTRADICTIONS if t == target} - {name for name, *_ in found}
    assert not fixed, f"{target}: {sorted(fixed)} no longer contradict the schema: take them off KNOWN_CONTRADICTIONS"


def test_a_contradicting_default_is_caught(monkeypatch):
    """The check sees a default that disagrees with the schema (and one that agrees)."""
    import models.captioners

    def decode(model, features, style, *, max_len: int = 24, no_repeat_ngram_size: int = 0):
        return []

    monkeypatch.setattr(models.captioners, "greedy_decode", decode)
    found = _contradictions("models.captioners:greedy_decode", schema_defaults())
    assert found == [("no_repeat_ngram_size", "evaluate.no_repeat_ngram_size", 0, 3)]
