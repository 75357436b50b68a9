"""Configuration: ``conf/<name>.yaml`` loaded, interpolated and validated.

The schema below holds every default once, at full fidelity (the paper's settings, models by name, no caps); a
conf file is an overlay on it that sets only what differs, and may start with ``extends: <other conf>`` to overlay
that conf instead. Strings, in a conf or a schema default, may hold ``${ENV_VAR:-default}`` and ``${home}`` (the
resolved ``home`` key). Every key is validated: an unknown key or a bad value raises :class:`ConfigError` naming the
key, what was given and what is allowed.
"""
from __future__ import annotations

import copy
import os
import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

RETRIEVAL_TYPES = ("i2i", "i2t", "t2i", "t2t")
DEFAULT_STYLE_SETS = {"flickrstyle": ["humor", "romantic"], "senticap": ["positive", "negative"]}


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SparkConf(_Section):
    master: str = Field("${ERG_SPARK_MASTER:-local[*]}", description="Spark master for local runs, e.g. local[*] "
                        "or local[2]")
    remote: Optional[str] = Field(None, description="a Spark Connect server to run against, e.g. "
                                  "sc://localhost:15002 (null = a classic session: local[*] or the cluster's own)")
    app_name: str = "erg"
    jars_dir: str = Field("${ERG_JARS_DIR:-~/.cache/erg/jars/delta-4.4.0}", description="folder Maven resolves "
                          "Delta's jars into")
    shuffle_partitions: Optional[int] = Field(None, ge=1, description="spark.sql.shuffle.partitions; null leaves the "
                                              "session's own (a cluster's, which AQE coalesces)")
    arrow_max_records_per_batch: int = Field(256, ge=1, description="rows per Arrow batch fed to a pandas UDF")
    driver_memory: str = "6g"
    show_progress: bool = True
    extra: dict[str, str] = Field(default_factory=dict, description="any further spark.* settings")


class TablesConf(_Section):
    catalog: Optional[str] = Field(None, description="Unity Catalog catalog; null for the local session catalog")
    schema_name: str = Field("erg", alias="schema", description="schema (database) that holds every table")
    location: Optional[str] = Field("${home}/warehouse", description="root folder of the Delta tables; null = "
                                    "managed tables")
    auto_optimize: bool = Field(True, description="optimized writes and auto compaction on every table "
                                "(delta.autoOptimize.*), so that a small table stays a few files")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("schema_name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError("must be a SQL identifier: letters, digits and '_', not starting with a digit")
        return value


class MlflowConf(_Section):
    tracking_uri: str = Field("sqlite:///${home}/mlflow.db", description="sqlite:///path.db locally, "
                              "'databricks' on a cluster")
    registry_uri: Optional[str] = Field(None, description="model registry; 'databricks-uc' for Unity Catalog")
    artifact_location: Optional[str] = Field("${home}/mlartifacts", description="where a new experiment stores "
                                             "artifacts (null = the tracking server's default)")
    experiment: str = "erg"
    register_models: bool = True


class LockConf(_Section):
    """The schema's run lock (:mod:`jobs.platform.lock`): one writing ``erg`` job at a time per schema, held in the
    Delta table ``<schema>.run_lock`` so that it holds across processes, hosts and clusters."""
    enabled: bool = Field(True, description="take the lock in every writing erg command (run, ingest, extract, "
                          "embed, retrieve, generate, train, experiment, restore, sql --write)")
    wait_s: float = Field(0.0, ge=0, description="how long a writing job waits for a lock another job holds before "
                          "it refuses (exit 2, naming the holder); 0 = refuse at once")
    ttl_s: float = Field(600.0, gt=0, description="a holder on another host whose heartbeat is older than this is "
                         "taken for dead (on the same host a dead holder is seen at once by its process id)")
    heartbeat_s: float = Field(60.0, gt=0, description="how often the holder renews its lease")
    poll_s: float = Field(5.0, gt=0, description="how often a waiting job looks at the lock again")

    @model_validator(mode="after")
    def _heartbeat_within_ttl(self) -> "LockConf":
        if self.heartbeat_s * 2 > self.ttl_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s}) must be at most half of ttl_s ({self.ttl_s}), so "
                             "that a live holder renews its lease before it expires")
        return self


class IngestSource(_Section):
    format: Literal["senticap_json", "senticap_csv", "flickrstyle", "flickr30k_tokens", "coco_captions",
                    "coco_karpathy_refs", "image_manifest"]
    path: str = Field(..., description="file (or folder for coco_karpathy_refs) to read")
    name: Optional[str] = Field(None, description="source name written on the rows; defaults to the format's")
    style: Optional[str] = Field(None, description="flickrstyle only: the style of every line (humor/romantic)")
    image_names: Optional[str | list[str]] = Field(
        None, description="flickrstyle only: image names file (.txt or .p); a list of such files must agree line "
        "by line (the pickled and the text list of the same images)")
    encoding: str = Field("utf-8", description="text encoding; a line that fails to decode goes to quarantine")
    split: Optional[Literal["train", "val", "test"]] = Field(None, description="split for rows whose format carries "
                                                              "none")
    image_root: Optional[str] = Field(None, description="prefix for image uris (folder or cloud path)")
    on_misaligned: Literal["error", "quarantine"] = Field(
        "error", description="files paired line by line (flickrstyle captions and image names; Karpathy references, "
        "tags and image_ID.txt) with different line counts: error (names both files and counts) or quarantine the "
        "unpaired lines")

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        import codecs

        try:
            codecs.lookup(value)
        except LookupError:
            raise ValueError(f"unknown text encoding {value!r}: use one Python knows, e.g. utf-8 or latin-1") from None
        return value

    @model_validator(mode="after")
    def _flickrstyle_needs(self) -> "IngestSource":
        if self.format == "flickrstyle" and not (self.style and self.image_names):
            raise ValueError("format flickrstyle needs 'style' (e.g. humor) and 'image_names' (the image list)")
        return self


class SampleConf(_Section):
    dir: str = Field("${home}/sample", description="where `erg sample` writes its files")
    seed: int = 7
    n_images: int = Field(600, ge=8, description="generated images (scenes share subjects/places)")
    stylized_per_style: int = Field(80, ge=2, description="stylized captions per style (4 styles)")
    factual_captions: int = Field(2400, ge=8, description="factual captions over the images")
    image_size: int = Field(32, ge=8, le=512)
    bad_rows: bool = Field(True, description="include malformed rows, which must land in quarantine")


class SplitConf(_Section):
    """The paper's split recipe (Sect. 4.1), by image; see :func:`readers.corpora.protocol_splits`."""
    seed: int = Field(2021, description="images are ranked by a hash of (seed, image id): same seed, same split")
    flickrstyle_test_images: int = Field(1000, ge=0, description="FlickrStyle10K images in test (at most a "
                                         "seventh of the set: the paper's 1,000 of 7,000)")
    flickrstyle_val_fraction: float = Field(0.1, ge=0, lt=1, description="share of the other images moved to val")
    senticap_val_images_per_style: int = Field(100, ge=0, description="SentiCap: non-test images per polarity moved "
                                               "to val (at most a fifth of them); official val joins train; 0 = keep "
                                               "the official splits")


class IngestConf(_Section):
    sources: list[IngestSource] = Field(default_factory=list, description="files to ingest; empty = the sample")
    skip_unchanged_sources: bool = Field(
        True, description="a source whose files have the same content as when the last successful ingest wrote it "
        "into these tables is not read again (new files land, old ones are skipped); false reads every source")
    splits: SplitConf = Field(default_factory=SplitConf)
    split_fractions: dict[str, float] = Field(
        default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1}, json_schema_extra={"overlay": "replace"},
        description="rows whose source gives no split get one by a hash of their image id (train/val/test; a conf "
        "gives all three)")

    @field_validator("split_fractions")
    @classmethod
    def _fractions(cls, value: dict[str, float]) -> dict[str, float]:
        if set(value) != {"train", "val", "test"} or any(v < 0 for v in value.values()) \
                or abs(sum(value.values()) - 1) > 1e-6:
            raise ValueError("needs train, val and test, each >= 0, summing to 1")
        return value


class ClassifierConf(_Section):
    """The extractor classifier, the paper's settings: FlickrStyle10K batch 32, lr 1e-5 (SentiCap's batch 64, lr 2e-5
    are ``extract.classifier_overrides``); 3 epochs."""
    name_or_path: str = "bert-base-uncased"
    max_length: int = Field(64, ge=8, description="word pieces per caption (captions are short; cost grows with it)")
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    max_train_captions: Optional[int] = Field(None, ge=10, description="cap on training captions (null = all)")
    holdout_fraction: float = Field(0.1, gt=0, lt=1)
    seed: int = 13
    batch_order: Literal["length_buckets", "random"] = Field(
        "length_buckets", description="length_buckets: batches of similar length (less padding; "
        "benchmarks/results/extract_speed.json), random: a plain shuffle")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="fine-tuning under bf16 autocast (bf16) or not")


class EvaluationClassifierConf(_Section):
    kind: Literal["linear_probe", "finetune"] = Field(
        "finetune", description="linear_probe: a logistic head per style over frozen mean-pooled sentence "
        "embeddings; finetune: a fine-tuned BERT-family classifier per style (style vs factual; humor test accuracy "
        "0.886 vs 0.791 for linear_probe, benchmarks/results/style_classifiers.json)")
    name_or_path: str = Field("bert-base-uncased", description="sentence encoder (linear_probe) or backbone "
                              "(finetune)")
    max_length: int = Field(64, ge=8)
    l2: float = Field(1e-3, ge=0, description="linear_probe: L2 penalty on the head's weights")
    epochs: int = Field(1, ge=1, description="finetune: epochs")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-5, gt=0, description="finetune: AdamW learning rate")
    max_train_captions: Optional[int] = Field(None, ge=10, description="cap on each style's positive training "
                                              "captions (as many factual ones are drawn); null = all")
    batch_order: Literal["length_buckets", "random"] = Field("length_buckets", description="finetune: as "
                                                             "extract.classifier.batch_order")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="finetune: as extract.classifier.precision")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="share of factual images held out for accuracy")
    max_factual_captions: int = Field(200_000, ge=100, description="factual captions of P (beyond those of the "
                                      "stylized images) read to the driver for the factual class: the same "
                                      "captions by a hash, so the driver never holds the whole corpus")
    seed: int = 29


class ExtractConf(_Section):
    classifier: ClassifierConf = Field(default_factory=ClassifierConf)
    classifier_overrides: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {"senticap": {"batch_size": 64, "lr": 2.0e-5}}, description="per style set, "
        "classifier keys that differ from extract.classifier (the paper's SentiCap settings: batch 64, lr 2e-5; a "
        "conf's sets merge into these)")
    evaluation: EvaluationClassifierConf = Field(
        default_factory=EvaluationClassifierConf, description="the per-style evaluation classifiers (paper Sect. "
        "4.4): filter 1 of generate and cls. of evaluate")
    eps: float = Field(0.25, gt=0, lt=1, description="extraction proportion: share of words in a style phrase")
    head_selection_captions: Optional[int] = Field(
        None, ge=1, description="train captions of a style set sampled to choose its (l_s, h_s); null = all "
        "(benchmarks/style_classifiers.py --part heads measures how the choice varies with it)")
    batch_size: int = Field(128, ge=1)
    device: str = Field("auto", description="auto | cpu | cuda[:N]")
    table4_samples_per_style: int = Field(4, ge=1)

    def classifier_for(self, style_set: str) -> ClassifierConf:
        """The extractor classifier settings of one style set: ``classifier`` with that set's overrides."""
        return ClassifierConf.model_validate({**self.classifier.model_dump(),
                                              **self.classifier_overrides.get(style_set, {})})


class EncoderConf(_Section):
    kind: Literal["sentence", "clip", "oscar"] = "sentence"
    name_or_path: str = "all-MiniLM-L6-v2"
    batch_size: int = Field(64, ge=1)
    device: str = "auto"
    options: dict[str, Any] = Field(default_factory=dict, description="encoder options: sentence max_length, precision "
                                    "(fp32 / bf16 / int8: see benchmarks/results/scale.json); "
                                    "oscar pooling, max_seq_length, max_img_seq_length, tokenizer_name_or_path")


class IndexConf(_Section):
    type: Literal["auto", "flat", "ivf", "hnsw", "hnsw_sq8"] = Field(
        "auto", description="the scene index: flat (exact), ivf, hnsw, hnsw_sq8 (HNSW over 8-bit quantized vectors, "
        "re-ranked exactly), or auto: exact up to exact_max_items scenes; beyond, the fastest index and search "
        "setting (HNSW / HNSW-SQ8 ef_search, IVF nprobe; IVF alone where use_gpu) whose recall@10 "
        "against exact search on tune_queries sampled factual queries meets target_recall "
        "(models.scene_index.tune_scene_index), exact where none does (metric index.auto_fallback)")
    exact_max_items: int = Field(50_000, ge=1, description="auto searches exactly up to this many scenes, measuring "
                                 "nothing (exact search of 100,000 scenes took 0.53 ms a query on 2 CPU cores, "
                                 "benchmarks/results/scale.json retrieval: half that is small next to embedding it)")
    target_recall: float = Field(0.95, gt=0, le=1, description="auto: the recall@10 against exact search an "
                                 "approximate setting must reach on the query sample (its one-sided 95% lower "
                                 "bound), e.g. 0.95")
    tune_queries: int = Field(2000, ge=10, description="auto: factual queries sampled (by a hash of their id) to "
                              "measure recall and search time; only drawn beyond exact_max_items scenes")
    min_speedup: float = Field(2.0, ge=0, description="auto: keep exact search unless the approximate setting "
                               "searches the sample at least this many times faster (0 = never time: keep the "
                               "first setting meeting the target, HNSW before IVF)")
    nlist: int = Field(1024, ge=1)
    nprobe: int = Field(32, ge=1)
    hnsw_m: int = Field(32, ge=4)
    ef_search: int = Field(128, ge=1)
    ef_construction: int = Field(200, ge=1, description="HNSW build: candidates per insertion (Faiss's default 40); "
                                 "on real MiniLM vectors 200 lifts recall@10 at ef_search 32 from 0.943 to 0.958 at "
                                 "the same search cost")
    use_gpu: bool = Field(False, description="search the scene indexes on every GPU Faiss sees (faiss-gpu; flat "
                          "and ivf only: Faiss has no GPU HNSW)")
    gpu_fallback: Literal["cpu", "error"] = Field(
        "cpu", description="use_gpu where Faiss cannot search on a GPU (faiss-cpu, no device, hnsw): cpu = search "
        "on CPU, logged as the metric index.faiss_gpu_fallback = 1 (0 when every index is on GPU); error = fail, "
        "naming the fix")


class RetrieveConf(_Section):
    types: list[Literal["i2i", "i2t", "t2i", "t2t"]] = Field(default_factory=lambda: list(RETRIEVAL_TYPES))
    top_k: int = Field(5, ge=1)
    min_similarity: float = Field(0.6, ge=-1, le=1, description="keep hits with cosine similarity > this")
    index: IndexConf = Field(default_factory=IndexConf)
    exclude_same_image: bool = Field(True, description="drop hits whose scene shows the query's own image")
    train_descriptions_as_queries: bool = Field(
        False, description="the scene descriptions (factual captions, e.g. Flickr30K's) of stylized images whose "
        "captions are all in the train split are queries too, beside P (jobs.platform.tables.query_captions): "
        "their pairs are new stylized captions for train images; a val or test image's description never is one. "
        "Off = the paper's P alone")
    examples_to_log: int = Field(8, ge=0)
    partitions: Optional[int] = Field(None, ge=1, description="tasks the factual queries are searched in "
                                      "(null = spark.sql.shuffle.partitions)")
    index_transport: Literal["auto", "broadcast", "file"] = Field(
        "auto", description="how the scene indexes reach the executors: a broadcast variable, or a file under "
        "index_dir loaded once per Python worker (auto: broadcast where the session has a SparkContext, a file on "
        "Spark Connect, which has none)")
    index_dir: Optional[str] = Field(None, description="folder for the index file, readable by every executor, e.g. "
                                     "a Volume (null = <home>/scene_indexes)")


class EmbedConf(_Section):
    encoder: EncoderConf = Field(default_factory=lambda: EncoderConf(
        kind="clip", name_or_path="openai/clip-vit-base-patch32", batch_size=256))
    partitions: Optional[int] = Field(None, ge=1, description="tasks the items to embed are spread over, e.g. the "
                                      "cluster's GPU count (null = two per task slot, at least 256 items each)")


class GeneratorConf(_Section):
    kind: Literal["causal", "seq2seq"] = "causal"
    name_or_path: str = Field("gpt2", description="checkpoint name or path; with init=config, a config to build")
    init: Literal["pretrained", "config", "word_level", "bert2bert_minilm"] = Field(
        "pretrained", description="pretrained: load name_or_path; config: a GPT-2/T5 built from its config with a BPE/"
        "Unigram tokenizer trained on the captions; word_level: a GPT-2 over whole words, embeddings from MiniLM; "
        "bert2bert_minilm: a seq2seq model warm-started from MiniLM")
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    vocab_size: int = Field(4000, ge=100, description="init=config: size of the tokenizer trained on the corpus")
    min_word_count: int = Field(1, ge=1, description="init=word_level: words seen fewer times map to [UNK]")
    embeddings: Literal["minilm", "random"] = Field("minilm", description="init=word_level: word embeddings start "
                                                    "from MiniLM's (averaged word pieces, PCA) or from random")
    max_train_pairs: Optional[int] = Field(None, ge=1, description="cap on (phrase, content) training pairs, drawn "
                                           "by a seeded sample (null = the whole train split)")
    epochs: int = Field(1, ge=1)
    lr: float = Field(5e-5, gt=0)
    batch_size: int = Field(32, ge=1)
    max_source_len: int = Field(64, ge=8)
    max_target_len: int = Field(48, ge=8)
    seed: int = 17


class DecodingConf(_Section):
    """Decoding of the generator. The default suits pretrained GPT-2, whose BPE pieces are not words (so no merge
    constraint): free beam search without loops."""
    strategy: Literal["greedy", "beam", "sample"] = "beam"
    num_beams: int = Field(4, ge=1)
    top_p: float = Field(0.9, gt=0, le=1)
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(40, ge=1)
    batch_size: int = Field(64, ge=1)
    no_repeat_ngram_size: int = Field(3, ge=0, description="forbid repeating any n-gram of this size (0 = off)")
    repetition_penalty: float = Field(1.2, gt=0, description="Hugging Face repetition penalty (1.0 = off)")
    constraint: Literal["none", "source_words", "merge", "merge_skip"] = Field(
        "none", description="none: free decoding; source_words: only the input's own tokens; merge: the factual "
        "caption with every phrase token placed into it by the model; merge_skip: the same, phrase tokens optional")
    fast: bool = Field(True, description="greedy / beam decoding that writes the same captions with less work: a "
                       "merge input whose phrase is a trailing clause is written without the model (one allowed "
                       "token per step), the rest decoded in batches of similar length; false = the plain path, "
                       "kept for comparison (benchmarks/scale.py --parts generate)")


class FluencyConf(_Section):
    """The fluency filter (beyond the paper, :mod:`models.fluency`): a fluent-vs-broken discriminator fine-tuned
    with generate's fit on the train split's stylized captions and the factual queries (fluent) against
    corruptions of them (broken); its threshold keeps ``real_pass`` of the val split's stylized captions."""
    enabled: bool = True
    name_or_path: str = "all-MiniLM-L6-v2"
    max_length: int = Field(40, ge=8)
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(5e-5, gt=0)
    max_examples: int = Field(40_000, ge=20, description="real captions + corruptions trained on (half each): the "
                              "train split's stylized captions and a hash-chosen sample of the queries")
    real_pass: float = Field(0.95, gt=0, le=1, description="share of the val split's real stylized captions the "
                             "threshold lets pass")
    seed: int = 41


class FilterConf(_Section):
    ppl_max: float = Field(80.0, gt=0, description="keep a generated caption if its trigram perplexity < this")
    min_similarity: float = Field(0.6, ge=-1, le=1, description="keep if retrieval similarity > this")
    min_content_similarity: float = Field(
        0.6, ge=-1, le=1, description="content fidelity (beyond the paper): keep if the sentence encoder's cosine "
        "between the generated and the factual caption is > this")
    well_formed: bool = Field(True, description="well-formedness (beyond the paper): reject captions with a "
                              "non-word (outside the corpora's vocabulary) or a repeated word trigram")
    max_relatedness_drop: Optional[float] = Field(
        0.15, ge=0, le=1, description="visual relatedness (beyond the paper): where the factual image has visual "
        "context (images.tags), reject a generated caption whose relatedness to it falls more than this below the "
        "factual caption's; null = off (both scores are still kept). 0.15: 96% of one human reference's drop to "
        "another of the same image pass, 74% of a caption of another image fail "
        "(benchmarks/results/visual_relatedness.json)")
    fluency: FluencyConf = Field(default_factory=FluencyConf)


class VisualRelatednessConf(_Section):
    """How a caption's relatedness to its image's textual visual context is scored (models.visual_relatedness)."""
    encoder: str = Field("all-MiniLM-L6-v2", description="sentence encoder (name or path) whose cosine between a "
                         "caption and the image's labels is raised to the labels' confidence")
    label_mode: Literal["joint", "per_label"] = Field(
        "joint", description="joint: one cosine to the labels joined into one text (the seed's method); per_label: "
        "one per label, each to its own confidence, averaged (needs labels as a list)")
    top_labels: int = Field(3, ge=1, description="the most confident labels used (the seed's data has 3)")


class GenerateConf(_Section):
    generator: GeneratorConf = Field(default_factory=GeneratorConf)
    decoding: DecodingConf = Field(default_factory=DecodingConf)
    filters: FilterConf = Field(default_factory=FilterConf)
    lm_min_count: int = Field(
        3, ge=1, description="trigram LMs (style and background): words seen fewer times map to <unk>; with "
        "lm_oov: skip a word no part of the mixture knows is counted, not scored (a word seen once or twice has no "
        "trigram statistics: scored, it decided the verdict on fluent captions with rare content words)")
    lm_oov: Literal["skip", "score"] = Field(
        "skip", description="perplexity filter: skip: an unseen word is counted, not scored (SRILM's default); "
        "score: it is scored as <unk>")
    lm_background_folds: int = Field(
        2, ge=0, description="interpolate each style LM with the other styles' LMs and a factual background LM of "
        "P trained in this many folds by image (a caption is scored by the folds without its image; weights by EM "
        "on the val split); 0 = the style's LM alone; 1 is refused (a fold would score its own captions)")
    min_phrase_propensity: Optional[float] = Field(
        0.5, ge=0, le=1, description="transfer phrase: place only the retrieved phrase's style words (put in a "
        "phrase in at least this share of their train occurrences, see models.phrase_transfer) and the function "
        "words between them; null = the whole extracted phrase, as the paper")
    clause_style_sets: list[str] = Field(
        default_factory=list, description="style sets whose style lives in a trailing clause (FlickrStyle: '..., "
        "searching for bones', '... to amuse her dad'): their transfer phrase is the clause of its first style word "
        "(with the function words before it, to the clause's end) when it has at most max_clause_words words "
        "(models.phrase_transfer); needs min_phrase_propensity")
    max_clause_words: int = Field(8, ge=1, description="clause_style_sets: longest clause transferred whole")

    @field_validator("lm_background_folds")
    @classmethod
    def _folds(cls, v: int) -> int:
        if v == 1:
            raise ValueError("generate.lm_background_folds: 1 fold would score a caption with a background trained "
                             "on it; use 0 (no background) or >= 2")
        return v
    hits_per_query: int = Field(1, ge=1, description="retrieval hits per factual item turned into candidates")
    max_candidates: Optional[int] = Field(None, ge=1, description="cap on candidates: the same N (by a hash of their key) every run; null = all")
    max_candidates_per_style: Optional[int] = Field(
        None, ge=1, description="cap on candidates per target style, the same N per style (by the same hash) every "
        "run, applied before max_candidates: retrieval from a factual corpus finds mostly the scenes of the style set "
        "closest to it (COCO-like SentiCap here), so a global cap leaves the other styles few; null = no per-style cap")
    device: str = "auto"
    samples_to_log: int = Field(5, ge=0)


FEATURE_KINDS = ("visual_context", "clip", "regions", "retrieval_embeddings")
CONTEXT_SOURCES = ("tags", "descriptions", "factual", "other_styles")


class VisualContextConf(_Section):
    """``train.features: visual_context``: an image described in text, each text one region-like vector."""
    sources: list[Literal["tags", "descriptions", "factual", "other_styles"]] = Field(
        default_factory=lambda: ["tags", "descriptions", "factual"], min_length=1,
        description="texts that describe an image: tags (its object labels, one text), descriptions (factual "
        "captions of a stylized image, images.descriptions), factual (its captions in P; an augmented pair never "
        "sees the caption it was generated from), other_styles (the content, style phrase removed, of its "
        "captions in the other styles of the set; never those of the style scored)")
    encoder: EncoderConf = Field(default_factory=EncoderConf, description="the sentence encoder that embeds each "
                                 "text (kind sentence), independent of embed.encoder")
    max_regions: int = Field(8, ge=1, description="texts kept per image (tags first, then descriptions, factual "
                             "captions, other styles, each in a fixed order); fewer are padded and masked")
    other_styles_for: Optional[list[str]] = Field(
        None, description="style sets whose images get other_styles texts (e.g. [senticap], whose train images have "
        "no other description); null = every set")


class ScheduledSamplingConf(_Section):
    """The probability of feeding the model's own sample back instead of the gold word (Bengio et al. 2015)."""
    start: float = Field(0.0, ge=0, le=1, description="probability in the first epochs")
    increase: float = Field(0.05, ge=0, le=1, description="added every `every_epochs` epochs (paper: 0.05 every 5)")
    every_epochs: int = Field(5, ge=1)
    max: float = Field(0.25, ge=0, le=1, description="the probability never exceeds this")

    def probability(self, epoch: int) -> float:
        """The probability in ``epoch`` (0-based)."""
        return min(self.max, self.start + self.increase * (epoch // self.every_epochs))


class TrainConf(_Section):
    captioner: Literal["nic", "transformer", "updown"] = "nic"
    features: Literal["visual_context", "clip", "regions", "retrieval_embeddings"] = Field(
        "visual_context", description="what a captioner sees of an image, independent of the retrieval encoder: "
        "visual_context (tags and factual descriptions, each embedded as one region-like vector), clip (CLIP on "
        "the image file at images.uri), regions (images.region_features, e.g. 36 x 2048 Faster R-CNN), "
        "retrieval_embeddings (the retrieval encoder's image vector in `embeddings`, as before)")
    visual_context: VisualContextConf = Field(default_factory=VisualContextConf)
    features_cache_schema: Optional[str] = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="schema whose feature cache "
        "(<home>/features/<schema>) is read and extended; null = tables.schema. The cache is keyed by content (a "
        "text's SHA-1 or an image id) and the encoder version, so schemas over the same data may share one (erg "
        "experiment's eps sweep shares the main schema's)")
    clip: EncoderConf = Field(default_factory=lambda: EncoderConf(kind="clip", name_or_path="openai/clip-vit-base-patch32"),
                              description="features: clip: the CLIP checkpoint (name or path) run on the image files")
    max_regions: int = Field(36, ge=1, description="features: regions: region vectors kept per image")
    backend: Literal["torch_distributor", "horovod"] = Field(
        "torch_distributor", description="torch_distributor: Spark's TorchDistributor (DDP; gloo on CPU, nccl on "
        "GPU); horovod: horovod.spark.run with Gloo (needs scripts/install_horovod.sh or a Databricks ML runtime)")
    reader: Literal["parquet", "mds", "petastorm"] = Field(
        "parquet", description="how the training snapshot is written and read: Spark Parquet (every worker reads "
        "all of it); mds: Mosaic Streaming shards, each worker reading its partition with a StreamingDataset "
        "(needs mosaicml-streaming, see README); petastorm: petastorm's Spark converter (falls back to Parquet, "
        "tagged erg.reader_fallback, where petastorm cannot import)")
    num_processes: int = Field(2, ge=1, description="training processes (one per GPU with use_gpu)")
    local_mode: Optional[bool] = Field(None, description="TorchDistributor local_mode: processes on the driver; "
                                       "null = true locally, false on Databricks (barrier tasks on executors)")
    use_gpu: bool = False
    use_augmented: bool = Field(True, description="train on original + augmented pairs (false: original only)")
    epochs: int = Field(20, ge=1)
    batch_size: int = Field(64, ge=1, description="paper: 64")
    optimizer: Literal["adam", "adamw"] = Field("adam", description="paper: Adam")
    lr: float = Field(5e-4, gt=0, description="paper: 5e-4")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0, description="max gradient norm (0 = no clipping)")
    scheduled_sampling: ScheduledSamplingConf = Field(default_factory=ScheduledSamplingConf)
    hparams: dict[str, Any] = Field(default_factory=dict, description="captioner hyper-parameters: nic embed_dim, "
                                    "hidden_dim, num_layers, dropout, image_norm (0|1); transformer d_model, nhead, "
                                    "num_layers, dim_feedforward, dropout, max_len; updown embed_dim, hidden_dim, "
                                    "att_dim, dropout (checked by `erg train`)")
    inserted_word_weight: float = Field(
        4.0, ge=1, description="loss weight of the words an augmented caption adds to the factual caption it was "
        "generated from (its inserted style phrase); 1 = the paper's plain cross-entropy; original pairs always weigh "
        "1. Raising it teaches the captioner the style phrases of augmented pairs rather than only their content: at "
        "1 augmented SentiCap pairs taught content, not style (cls. fell 3-14 points on SentiCap); at 4 it rises in "
        "all four SentiCap cells and in 7 of 8 in all")
    min_count: int = Field(1, ge=1, description="caption words seen fewer times map to <unk>")
    max_words: int = Field(30, ge=1, description="caption words kept per training caption")
    seed: int = 23


class EvaluateConf(_Section):
    split: str = Field("test", description="split of stylized_captions whose images are captioned and scored")
    max_images: Optional[int] = Field(None, ge=1, description="cap on (image, style) pairs per style (null = all)")
    max_len: int = Field(24, ge=4, description="tokens greedy decoding writes at most per caption")
    no_repeat_ngram_size: int = Field(
        3, ge=0, description="decoding (greedy and beam) never writes an n-gram of words twice in one caption "
        "(\"a man in a man in a man\" stops at the second \"a man in\"); 0 = off, the plain argmax")
    batch_size: int = Field(64, ge=1, description="images per decoding / classifier batch on an executor")
    device: str = Field("auto", description="auto | cpu | cuda[:N] for decoding and the style classifier")
    ppl_statistic: Literal["median", "mean"] = Field(
        "median", description="ppl.: median (robust to a few degenerate captions) or mean trigram perplexity")
    samples_to_log: int = Field(5, ge=0, description="generated captions per style and variant logged as samples")
    visual_rerank: bool = Field(
        True, description="also beam-decode the test images that have visual context (images.tags) and re-rank "
        "each beam by visual relatedness (visual_relatedness.*); the beam's pick and the re-ranked pick are scored "
        "side by side (rerank.<variant>.<style>.<beam|visual>.<metric>)")
    beam_size: int = Field(5, ge=2, description="visual_rerank: beam width, the candidates re-ranked per image")
    length_penalty: float = Field(1.0, ge=0, description="visual_rerank: the beam orders captions by "
                                  "log-probability / length ** this (0 = the plain sum)")


class IndependentClassifierConf(_Section):
    """cls. by a second grader: per style, style vs factual, trained on one half of the train split's images (by a
    hash of the image id) and never used as a filter, so that the filter classifier does not grade its own output."""
    enabled: bool = True
    kind: Literal["linear_probe", "finetune"] = "linear_probe"
    name_or_path: str = "all-MiniLM-L6-v2"
    max_length: int = Field(40, ge=8)
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-5, gt=0)
    max_train_captions: Optional[int] = Field(None, ge=10)
    seed: int = 31


class Table5Conf(_Section):
    """Table 5: each retrieval type's augmented pairs alone vs all of them (one captioner, one style set)."""
    enabled: bool = True
    captioner: Literal["nic", "transformer", "updown"] = "nic"
    style_set: Optional[str] = Field(None, description="the style set measured; null = the first of style_sets")


class Fig5Conf(_Section):
    """Fig. 5: C and cls. against the share of the augmented pairs used (size), and against the extraction
    proportion eps (each eps other than ``extract.eps`` is another ERG run, in a schema of its own: jobs.eps_sweep)."""
    enabled: bool = True
    captioner: Literal["nic", "transformer", "updown"] = "nic"
    style_set: Optional[str] = Field(None, description="the style set measured; null = the first of style_sets")
    sizes: list[float] = Field(default_factory=lambda: [0.0, 0.1, 0.3, 0.5, 0.7, 1.0], description="shares of "
                               "the augmented pairs, the paper's 0/10/30/50/70/100% (nested subsets: see order)")
    order: Literal["perplexity", "hash"] = Field(
        "perplexity", description="which pairs a share takes: perplexity = the lowest trigram perplexity first (the "
        "paper's Fig. 5: sorted by ascending perplexity), hash = by a hash of the pair id (a random subset)")
    eps: list[float] = Field(
        default_factory=lambda: [0.05, 0.25, 0.5], description="extraction proportions of the eps curve (the "
        "paper's); each one other than extract.eps reruns extract (the same classifiers, the style head re-selected "
        "at that eps), embed, retrieve and generate in the schema <tables.schema>_eps<eps> and trains Fig. 5's "
        "captioner on its pairs; [] = no eps curve")

    @field_validator("sizes")
    @classmethod
    def _sizes(cls, value: list[float]) -> list[float]:
        if any(not 0 <= v <= 1 for v in value):
            raise ValueError("shares of the augmented pairs must lie in [0, 1], e.g. [0, 0.25, 0.5, 1]")
        return sorted(set(value))

    @field_validator("eps")
    @classmethod
    def _eps(cls, value: list[float]) -> list[float]:
        if any(isinstance(v, bool) or not 0 < v < 1 for v in value):
            raise ValueError("extraction proportions must lie in (0, 1), e.g. [0.05, 0.25, 0.5]")
        return sorted(set(value))


class AblationConf(_Section):
    """Ablations of ERG's idea that *similar* scenes carry the right style phrase, each trained at ERG's augmented
    pair count per style (where it yields that many), through the same filters, scored on the same test:
    ``random_scene`` = each of ERG's candidates gets the phrase of a random train scene of its target style instead
    of the retrieved one, then the same generator; ``graft`` = the retrieved phrase appended to the factual caption
    without the generator (:func:`models.generator.graft`)."""
    kinds: list[Literal["random_scene", "graft"]] = Field(default_factory=lambda: ["random_scene", "graft"],
                                                          description="[] = no ablation")
    captioner: Literal["nic", "transformer", "updown"] = "nic"
    styles: Optional[list[str]] = Field(None, description="styles ablated; null = every measured style")
    candidate_margin: float = Field(
        1.5, ge=1, description="per style, ERG candidates an ablation tries: this x ERG's pool / ERG's pass rate of "
        "the style (the lowest hash first), so that it can pass as many pairs as ERG's pool holds")


class TuningConf(_Section):
    """The val-scored sweep of ``erg experiment`` (:mod:`jobs.tuning`): training knobs chosen on the val split before
    Table 2, by a criterion declared here, so that the test split never chooses a setting."""
    enabled: bool = Field(True, description="false skips the sweep: Table 2 trains with the conf's values")
    knobs: dict[str, list[Any]] = Field(
        default_factory=dict, description="dotted conf key -> candidate values, swept one knob at a time in this "
        "order (the knobs before it at their chosen values, those after it at the conf's), e.g. "
        "{train.inserted_word_weight: [1, 4]}; keys a captioner cell picks up without ERG running again: train.* "
        "(not how it runs: seed, captioner, backend, ...), evaluate.max_len, evaluate.no_repeat_ngram_size, "
        "experiment.hparams.<kind>.<name>, experiment.epochs.<set>; {} = no sweep")
    captioner: Literal["nic", "transformer", "updown"] = Field("nic", description="the captioner of the tuning cells")
    styles: Optional[list[str]] = Field(None, description="styles the criterion averages over; null = Table 2's "
                                        "styles (experiment.styles, else styles)")
    seed: Optional[Annotated[int, Field(strict=True, ge=0)]] = Field(
        None, description="the tuning cells' seed; null = the first of experiment.seeds")
    criterion: Literal["delta_cls", "delta_cls_independent"] = Field(
        "delta_cls", description="what a value is chosen by: the mean over the tuning styles of the val delta (in "
        "points) of the augmented cell's cls. (delta_cls: by the evaluation classifiers, as Table 2's cls.; "
        "delta_cls_independent: by the grader trained on half B of the train split) against the original cell's, "
        "same seed; the highest wins among the values that pass the CIDEr guard (max_cider_drop)")
    max_cider_drop: float = Field(
        5.0, ge=0, description="CIDEr guard, in percent: a value whose mean val delta C % (augmented vs original) is "
        "below -this is chosen only when no value passes (then the one that loses the least CIDEr)")
    min_val_images: int = Field(10, ge=1, description="a tuning style needs this many val images with scene "
                                "features under a value; a value that leaves a tuning style unmeasured is not chosen")
    max_val_images: Optional[int] = Field(None, ge=1, description="per style, val images captioned (by a hash of "
                                          "the image id); null = all")
    only: bool = Field(False, description="run the sweep and stop (report and MLflow run hold the tuning alone); a "
                       "later `erg experiment` reuses its cells by their fingerprints and makes the same choice")


class ExperimentConf(_Section):
    """``erg experiment``: the paper's evaluation (Table 2, Table 5, Fig. 5) on the configured data."""
    captioners: list[Literal["nic", "transformer", "updown"]] = Field(
        default_factory=lambda: ["nic", "transformer"], min_length=1, description="captioners of Table 2")
    hparams: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per captioner kind, its hyper-parameters (e.g. {nic: {hidden_dim: 256}}); "
        "a kind not listed takes train.hparams if it is train.captioner, else its defaults")
    styles: Optional[list[str]] = Field(None, description="styles measured; null = styles")
    epochs: dict[str, Annotated[int, Field(strict=True, ge=1)]] = Field(
        default_factory=dict, description="per style set, the epochs of its cells (original and augmented alike) "
        "instead of train.epochs, e.g. {senticap: 20}: a small set gets as many optimizer steps as the recipe needs "
        "while the large one keeps the hour")
    run_erg: Literal["auto", "always", "never"] = Field(
        "auto", description="run ERG (erg run) first: auto = only when no generator has been trained")
    generator_version: Literal["current", "all"] = Field(
        "current", description="augmented pairs of the current generator only (training_set holds the passing "
        "rows of every generator version), or of all versions")
    max_augmented_pairs: Optional[int] = Field(
        None, ge=1, description="per style, cap on the augmented pairs trained on (the same ones by a hash of the "
        "pair id every run): keeps the Table 2 part within its time budget; null = all")
    max_test_images: Optional[int] = Field(None, ge=1, description="per style, test images captioned (by a hash "
                                           "of the image id); null = all")
    min_test_images: int = Field(10, ge=1, description="a style with fewer test images that have scene features "
                                 "is not measured (listed in not_measured with the reason)")
    ppl_statistic: Literal["median", "mean"] = Field("mean", description="ppl.: mean as the paper, or median")
    independent_classifier: IndependentClassifierConf = Field(default_factory=IndependentClassifierConf)
    table5: Table5Conf = Field(default_factory=Table5Conf)
    fig5: Fig5Conf = Field(default_factory=Fig5Conf)
    samples_to_log: int = Field(5, ge=0, description="captions per cell in the report")
    seeds: list[Annotated[int, Field(strict=True, ge=0)]] = Field(
        default_factory=lambda: [23, 24, 25], min_length=1, description="every cell trains and decodes once per "
        "seed (captioner init, data order, scheduled sampling); rows hold the mean, the sd and each seed's value, "
        "and every delta a 95% t-interval over the seeds (paired by seed). Fig. 5's eps cells use the first seed")
    seeds_per_captioner: dict[str, Annotated[int, Field(strict=True, ge=1)]] = Field(
        default_factory=dict, description="per captioner kind, how many of seeds (the first ones) its cells train, "
        "e.g. {transformer: 1, updown: 1} where time allows only NIC all of them; a kind not listed takes every seed")
    ablations: AblationConf = Field(default_factory=AblationConf)
    tuning: TuningConf = Field(default_factory=TuningConf)
    resume: bool = Field(True, description="reuse a cell already trained on the same pairs, conf and seed (found by "
                         "its fingerprint among the finished MLflow runs, or trained and saved by a launch that "
                         "was stopped before it was recorded) instead of training it again")

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"seeds {value} repeat a seed: list each once, e.g. [23, 24, 25]")
        return value


class ErgConfig(_Section):
    name: str = Field(..., description="the conf's name: local, databricks, test or your own")
    platform: Literal["local", "databricks"] = "local"
    home: str = Field("${ERG_HOME:-.erg}", description="local state: warehouse, MLflow store, models, sample")
    styles: list[str] = Field(default_factory=lambda: ["humor", "romantic", "positive", "negative"], min_length=1)
    style_sets: dict[str, list[str]] = Field(
        default_factory=dict, description="style sets, each with its own extractor classifier, e.g. {flickrstyle: "
        "[humor, romantic], senticap: [positive, negative]}; every style in exactly one set (default: those two, "
        "restricted to styles)")
    factual_label: str = "factual"
    spark: SparkConf = Field(default_factory=SparkConf)
    tables: TablesConf = Field(default_factory=TablesConf)
    mlflow: MlflowConf = Field(default_factory=MlflowConf)
    sample: SampleConf = Field(default_factory=SampleConf)
    ingest: IngestConf = Field(default_factory=IngestConf)
    extract: ExtractConf = Field(default_factory=ExtractConf)
    embed: EmbedConf = Field(default_factory=EmbedConf)
    retrieve: RetrieveConf = Field(default_factory=RetrieveConf)
    generate: GenerateConf = Field(default_factory=GenerateConf)
    train: TrainConf = Field(default_factory=TrainConf)
    evaluate: EvaluateConf = Field(default_factory=EvaluateConf)
    visual_relatedness: VisualRelatednessConf = Field(default_factory=VisualRelatednessConf)
    experiment: ExperimentConf = Field(default_factory=ExperimentConf)
    lock: LockConf = Field(default_factory=LockConf)

    @field_validator("styles")
    @classmethod
    def _styles(cls, styles: list[str]) -> list[str]:
        for style in styles:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", style):
                raise ValueError(f"style {style!r} must be lower-case letters, digits and '_'")
        if len(set(styles)) != len(styles):
            raise ValueError("styles must be distinct")
        return styles

    @model_validator(mode="before")
    @classmethod
    def _default_style_sets(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("style_sets"):
            styles = data.get("styles") or ["humor", "romantic", "positive", "negative"]
            if isinstance(styles, list):
                sets = {name: [s for s in members if s in styles] for name, members in DEFAULT_STYLE_SETS.items()}
                data = {**data, "style_sets": {name: members for name, members in sets.items() if members}}
        return data

    @model_validator(mode="after")
    def _factual_not_a_style(self) -> "ErgConfig":
        if self.factual_label in self.styles:
            raise ValueError(f"factual_label {self.factual_label!r} must not also be one of styles")
        return self

    @model_validator(mode="after")
    def _style_sets_partition_styles(self) -> "ErgConfig":
        seen: dict[str, str] = {}
        for name, members in self.style_sets.items():
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ValueError(f"style_sets: set name {name!r} must be lower-case letters, digits and '_'")
            for style in members:
                if style not in self.styles:
                    raise ValueError(f"style_sets.{name}: {style!r} is not one of styles {self.styles}")
                if style in seen:
                    raise ValueError(f"style_sets: {style!r} is in both {seen[style]!r} and {name!r}; every style "
                                     "belongs to exactly one set")
                seen[style] = name
        missing = [s for s in self.styles if s not in seen]
        if missing:
            raise ValueError(f"style_sets: styles {missing} are in no set; add them, e.g. style_sets: "
                             f"{{myset: [{', '.join(missing)}, ...]}}")
        unknown = sorted(set(self.extract.classifier_overrides) - set(self.style_sets))
        if unknown:
            raise ValueError(f"extract.classifier_overrides names unknown style sets {unknown}: "
                             f"sets are {sorted(self.style_sets)}")
        for name in self.extract.classifier_overrides:
            try:
                self.extract.classifier_for(name)
            except ValidationError as exc:
                problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                raise ValueError(f"extract.classifier_overrides.{name}: {problems}") from None
        return self

    @model_validator(mode="after")
    def _experiment_styles(self) -> "ErgConfig":
        e = self.experiment
        unknown = [s for s in (e.styles or []) if s not in self.styles]
        if unknown:
            raise ValueError(f"experiment.styles {unknown} are not among styles {self.styles}")
        unknown_sets = [s for s in (self.train.visual_context.other_styles_for or []) if s not in self.style_sets]
        if unknown_sets:
            raise ValueError(f"train.visual_context.other_styles_for names {unknown_sets}, which are not style sets: "
                             f"sets are {sorted(self.style_sets)}")
        unknown_sets = [s for s in self.generate.clause_style_sets if s not in self.style_sets]
        if unknown_sets:
            raise ValueError(f"generate.clause_style_sets names {unknown_sets}, which are not style sets: "
                             f"sets are {sorted(self.style_sets)}")
        if self.generate.clause_style_sets and self.generate.min_phrase_propensity is None:
            raise ValueError("generate.clause_style_sets needs generate.min_phrase_propensity (the clause starts at "
                             "a style word); set it (e.g. 0.5) or clause_style_sets: []")
        unknown_sets = [s for s in e.epochs if s not in self.style_sets]
        if unknown_sets:
            raise ValueError(f"experiment.epochs names {unknown_sets}, which are not style sets: "
                             f"sets are {sorted(self.style_sets)}")
        unknown = [k for k in e.seeds_per_captioner if k not in ("nic", "transformer", "updown")]
        if unknown:
            raise ValueError(f"experiment.seeds_per_captioner names {unknown}: captioner kinds are nic, transformer, "
                             "updown")
        unknown = [s for s in (e.ablations.styles or []) if s not in self.styles]
        if unknown:
            raise ValueError(f"experiment.ablations.styles {unknown} are not among styles {self.styles}")
        if e.ablations.kinds and e.ablations.captioner not in e.captioners:
            raise ValueError(f"experiment.ablations.captioner {e.ablations.captioner!r} is not among "
                             f"experiment.captioners {e.captioners}: ERG's cells are the ablations' reference; add it "
                             "or set experiment.ablations.kinds: []")
        for key, section in (("table5", e.table5), ("fig5", e.fig5)):
            if section.style_set is not None and section.style_set not in self.style_sets:
                raise ValueError(f"experiment.{key}.style_set {section.style_set!r} is not a style set: "
                                 f"sets are {sorted(self.style_sets)}")
        return self

    @model_validator(mode="after")
    def _tuning_knobs(self) -> "ErgConfig":
        t = self.experiment.tuning
        unknown = [s for s in (t.styles or []) if s not in self.styles]
        if unknown:
            raise ValueError(f"experiment.tuning.styles {unknown} are not among styles {self.styles}")
        if not t.knobs:
            return self
        base = self.model_dump(by_alias=True)
        base["experiment"]["tuning"]["knobs"] = {}  # each value is validated alone, without the sweep again
        for key, values in t.knobs.items():
            where = f"experiment.tuning.knobs.{key}"
            problem = knob_problem(key)
            if problem:
                raise ValueError(f"{where}: {problem}")
            if len(values) < 2 or len({_canonical(v) for v in values}) != len(values):
                raise ValueError(f"{where}: give at least two different values to choose between, e.g. [1, 4]; "
                                 f"given {values}")
            for value in values:
                try:
                    ErgConfig.model_validate(_set_dotted(base, key, value))
                except ValidationError as exc:
                    problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or key}: {e['msg']}" for e in exc.errors())
                    raise ValueError(f"{where}: value {value!r} is not a valid {key} ({problems}); give values that "
                                     f"--set {key}=<value> would accept") from None
        return self

    def clause_words(self) -> dict[str, int]:
        """Per style of ``generate.clause_style_sets``, the longest clause its transfer phrase takes whole."""
        return {style: self.generate.max_clause_words for name in self.generate.clause_style_sets
                for style in self.style_sets[name]}

    def style_set_of(self, style: str) -> str:
        """The style set ``style`` belongs to."""
        for name, members in self.style_sets.items():
            if style in members:
                return name
        raise ValueError(f"style {style!r} is in no style set: sets are {self.style_sets}")

    @property
    def labels(self) -> list[str]:
        """Classifier labels: factual first, then the styles."""
        return [self.factual_label, *self.styles]

    def path(self, *parts: str) -> Path:
        """A path under ``home``."""
        return Path(self.home).joinpath(*parts)


# ------------------------------------------------------------------------------------------- tuning knobs
_ERG_SECTIONS = ("ingest", "extract", "embed", "retrieve", "generate", "visual_relatedness")
_RUN_KEYS = {
    "train.seed": "seeds are fixed before the run: experiment.seeds, and experiment.tuning.seed for the sweep",
    "train.captioner": "the captioners are experiment.captioners (Table 2) and experiment.tuning.captioner",
    "train.use_augmented": "every experiment cell sets it (original vs augmented)",
    "train.backend": "it says how training runs, not what is learned", "train.reader": "it says how training runs, "
    "not what is learned", "train.num_processes": "it says how training runs, not what is learned",
    "train.local_mode": "it says how training runs, not what is learned", "train.use_gpu": "it says how training "
    "runs, not what is learned", "train.features_cache_schema": "it names a cache, not a setting",
}
SWEEPABLE = ("train.*", "evaluate.max_len", "evaluate.no_repeat_ngram_size", "experiment.hparams.<kind>.<name>",
             "experiment.epochs.<style set>")


def _canonical(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)


def knob_problem(key: str) -> str | None:
    """Why ``key`` cannot be a knob of ``experiment.tuning`` (None when it can): it must name a field of the schema
    (or a key inside one of its dicts) that a captioner cell picks up without ERG running again."""
    parts = key.split(".")
    model: Any = ErgConfig
    for i, part in enumerate(parts):
        field = _field(model, part)
        if field is None:
            here = ".".join(parts[:i]) or "the top level"
            allowed = ", ".join(sorted(f.alias or n for n, f in model.model_fields.items()))
            return f"unknown key {'.'.join(parts[: i + 1])!r}; allowed keys under {here}: {allowed}"
        ann = field.annotation
        sub = next((a for a in (ann, *(getattr(ann, "__args__", None) or ()))
                    if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is None:
            if i < len(parts) - 1 and getattr(ann, "__origin__", None) is not dict:
                return f"unknown key {key!r}: {'.'.join(parts[: i + 1])} holds no keys"
            break  # a leaf, or a key inside a dict field
        if i == len(parts) - 1:
            return f"{key!r} is a whole section: sweep one of its keys, e.g. {key}.<key>"
        model = sub
    if parts[0] in _ERG_SECTIONS:
        return (f"{key!r} changes the augmented pairs (ERG would run again for every value), so it cannot be swept "
                "inside erg experiment; choose it by an ERG run per value in a schema of its own (--set "
                "tables.schema=<name>) scored with experiment.tuning.only, or report Table 2 once per value. "
                f"Sweepable keys: {', '.join(SWEEPABLE)}")
    run_key = ".".join(parts[:2])
    if run_key in _RUN_KEYS:
        return f"{key!r} is not sweepable: {_RUN_KEYS[run_key]}"
    if parts[0] == "train" or key in ("evaluate.max_len", "evaluate.no_repeat_ngram_size") \
            or (parts[:2] in (["experiment", "hparams"], ["experiment", "epochs"]) and len(parts) >= 3):
        return None
    return (f"{key!r} is not sweepable: seeds, sizes, styles, ablations and how the run is set up are fixed before "
            f"the run; sweepable keys: {', '.join(SWEEPABLE)}")


def _set_dotted(data: dict, key: str, value: Any) -> dict:
    """A deep copy of ``data`` with the dotted ``key`` set to ``value`` (dicts made on the way)."""
    out = copy.deepcopy(data)
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = copy.deepcopy(value)
    return out


def get_setting(cfg: "ErgConfig", key: str) -> Any:
    """The value of the dotted ``key`` in ``cfg`` (as YAML would write it; None where a dict lacks it)."""
    node: Any = cfg.model_dump(by_alias=True, mode="json")
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def with_setting(cfg: "ErgConfig", key: str, value: Any) -> "ErgConfig":
    """``cfg`` with the dotted ``key`` set to ``value``, validated as a whole (as ``--set key=value`` would be)."""
    data = _set_dotted(cfg.model_dump(by_alias=True), key, value)
    tuning = data["experiment"]["tuning"]
    data["experiment"]["tuning"] = {**tuning, "knobs": {}}
    try:
        out = ErgConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, f"{key}={value!r}")) from None
    out.experiment.tuning = cfg.experiment.tuning.model_copy(deep=True)
    return out


# ----------------------------------------------------------------------------------------------- loading
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(value: Any, home: str | None) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, home) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, home) for v in value]
    if not isinstance(value, str):
        return value

    def env(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name == "home" and home is not None:
            return home
        if name in os.environ:
            return os.environ[name]
        if default is None:
            raise ConfigError(f"${{{name}}} is used in the configuration but the environment variable is not set; "
                              f"set it or write ${{{name}:-default}}")
        return default

    return _ENV.sub(env, value)


def _deep_merge(base: dict, override: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def conf_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("conf").iterdir() if p.name.endswith(".yaml"))


def _read_yaml(name_or_path: str, seen: tuple[str, ...] = ()) -> tuple[dict, str]:
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        path = Path(name_or_path).expanduser()
        if not path.exists():
            raise ConfigError(f"configuration file {path} does not exist")
        text, label = path.read_text(), str(path)
    else:
        resource = resources.files("conf") / f"{name_or_path}.yaml"
        if not resource.is_file():
            raise ConfigError(f"unknown conf {name_or_path!r}: choose one of {conf_names()} or give a .yaml path")
        text, label = resource.read_text(), f"conf/{name_or_path}.yaml"
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{label} must hold a mapping of keys at the top level")
    parent = data.pop("extends", None)
    if parent:
        if parent in seen:
            raise ConfigError(f"{label}: 'extends' loops back to {parent!r}")
        base, _ = _read_yaml(parent, seen + (name_or_path,))
        data = _deep_merge(base, data)
    return data, label


def parse_overrides(pairs: list[str] | None) -> dict:
    """``["extract.eps=0.3", "spark.master=local[2]"]`` -> nested dict (values parsed as YAML scalars)."""
    out: dict = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} must look like key.subkey=value")
        key, raw = pair.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(raw) if raw != "" else ""
    return out


def _format_errors(exc: ValidationError, label: str) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            parent = _model_at(err["loc"][:-1])
            allowed = ", ".join(sorted(f.alias or n for n, f in parent.model_fields.items())) if parent else "?"
            lines.append(f"{label}: unknown key '{key}'; allowed keys here: {allowed}")
            continue
        given = err.get("input")
        hint = _field_description(err["loc"])
        if not err["loc"]:  # a check across keys: its message names them; the whole conf is no help
            lines.append(f"{label}: key '{key}': {err['msg'].removeprefix('Value error, ')}")
            continue
        msg = f"{label}: key '{key}': {err['msg']} (given: {given!r})"
        lines.append(msg + (f"; expected: {hint}" if hint else ""))
    return "invalid configuration\n  " + "\n  ".join(lines)


def _model_at(loc: tuple) -> type[BaseModel] | None:
    model: Any = ErgConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = _field(model, part)
        if field is None:
            return None
        ann = field.annotation
        inner = getattr(ann, "__args__", None)
        candidates = [ann, *(inner or [])]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return None
    return model


def _field(model: type[BaseModel], name: str):
    for field_name, field in model.model_fields.items():
        if name in (field_name, field.alias):
            return field
    return None


def _field_description(loc: tuple) -> str | None:
    if not loc:
        return None
    parent = _model_at(loc[:-1])
    field = _field(parent, str(loc[-1])) if parent else None
    return field.description if field is not None else None


def schema_defaults_tree() -> dict:
    """The schema's defaults as the nested mapping a conf file writes (keys by their YAML names), uninterpolated:
    the bottom layer every conf is merged onto, so that a conf (or an override) that sets one key of a section keeps
    the schema's values for the section's other keys, the section's own default included (``embed.encoder`` is
    CLIP, while a bare :class:`EncoderConf` is MiniLM). Left out: required keys (``name``) and mappings a conf
    replaces whole (``json_schema_extra={"overlay": "replace"}``, e.g. ``ingest.split_fractions``)."""
    def tree(model: type[BaseModel], value_of) -> dict:
        out: dict = {}
        for name, field in model.model_fields.items():
            if field.is_required() or (field.json_schema_extra or {}).get("overlay") == "replace":
                continue
            value = value_of(name, field)
            out[field.alias or name] = (tree(type(value), lambda n, _, v=value: getattr(v, n))
                                        if isinstance(value, BaseModel) else copy.deepcopy(value))
        return out

    return tree(ErgConfig, lambda _, field: field.get_default(call_default_factory=True))


def schema_defaults(name: str = "schema") -> ErgConfig:
    """The schema's defaults alone, resolved as a conf: what a conf with no keys but ``name`` would give."""
    return _resolve({"name": name}, "the schema's defaults")


def load_config(name_or_path: str = "local", overrides: list[str] | dict | None = None) -> ErgConfig:
    """Load ``conf/<name>.yaml`` (or a path) over the schema's defaults, apply ``key=value`` overrides, interpolate,
    validate."""
    data, label = _read_yaml(name_or_path)
    extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    if extra:
        data = _deep_merge(data, extra)
        label += " (with overrides)"
    return _resolve(data, label)


def _resolve(data: dict, label: str) -> ErgConfig:
    """A conf's keys merged onto the schema's defaults, interpolated (``${ENV:-default}``, ``${home}``), validated."""
    data = _deep_merge(schema_defaults_tree(), data)
    home_raw = _interpolate(data["home"], None)
    home = str(Path(home_raw).expanduser().resolve()) if data.get("platform", "local") == "local" else home_raw
    data["home"] = home
    data = _interpolate(data, home)
    try:
        cfg = ErgConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, label)) from None
    if cfg.platform == "local":
        cfg.spark.jars_dir = str(Path(cfg.spark.jars_dir).expanduser())
    return cfg
