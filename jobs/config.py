"""Configuration: ``conf/<name>.yaml`` loaded, interpolated and validated.

A file may start with ``extends: <other conf>`` and override only what differs. Strings may hold
``${ENV_VAR:-default}`` and ``${home}`` (the resolved ``home`` key). Every key is validated: an unknown key or a
bad value raises :class:`ConfigError` naming the key, what was given and what is allowed.
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
    master: str = Field("local[*]", description="Spark master for local runs, e.g. local[*] or local[2]")
    remote: Optional[str] = Field(None, description="a Spark Connect server to run against, e.g. "
                                  "sc://localhost:15002 (null = a classic session: local[*] or the cluster's own)")
    app_name: str = "erg"
    jars_dir: str = Field("~/.cache/erg/jars/delta-4.4.0", description="folder Maven resolves Delta's jars into")
    shuffle_partitions: Optional[int] = Field(8, ge=1, description="spark.sql.shuffle.partitions; null leaves the "
                                              "session's own (a cluster's, which AQE coalesces)")
    arrow_max_records_per_batch: int = Field(256, ge=1, description="rows per Arrow batch fed to a pandas UDF")
    driver_memory: str = "4g"
    show_progress: bool = True
    extra: dict[str, str] = Field(default_factory=dict, description="any further spark.* settings")


class TablesConf(_Section):
    catalog: Optional[str] = Field(None, description="Unity Catalog catalog; null for the local session catalog")
    schema_name: str = Field("erg", alias="schema", description="schema (database) that holds every table")
    location: Optional[str] = Field(None, description="root folder of the Delta tables; null = managed tables")
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
    tracking_uri: str = Field(..., description="sqlite:///path.db locally, 'databricks' on a cluster")
    registry_uri: Optional[str] = Field(None, description="model registry; 'databricks-uc' for Unity Catalog")
    artifact_location: Optional[str] = Field(None, description="where a new experiment stores artifacts")
    experiment: str = "erg"
    register_models: bool = True


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
    dir: str = Field(..., description="where `erg sample` writes its files")
    seed: int = 7
    n_images: int = Field(600, ge=8, description="generated images (scenes share subjects/places)")
    stylized_per_style: int = Field(80, ge=2, description="stylized captions per style (4 styles)")
    factual_captions: int = Field(2400, ge=8, description="factual captions over the images")
    image_size: int = Field(32, ge=8, le=512)
    bad_rows: bool = Field(True, description="include malformed rows, which must land in quarantine")


class SplitConf(_Section):
    """The paper's split recipe (Sect. 4.1), by image; see :func:`jobs.readers.protocol_splits`."""
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
        default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1},
        description="rows whose source gives no split get one by a hash of their image id (train/val/test)")

    @field_validator("split_fractions")
    @classmethod
    def _fractions(cls, value: dict[str, float]) -> dict[str, float]:
        if set(value) != {"train", "val", "test"} or any(v < 0 for v in value.values()) \
                or abs(sum(value.values()) - 1) > 1e-6:
            raise ValueError("needs train, val and test, each >= 0, summing to 1")
        return value


class ClassifierConf(_Section):
    name_or_path: str = "all-MiniLM-L6-v2"
    max_length: int = Field(40, ge=8, description="word pieces per caption (captions are short; cost grows with it)")
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    max_train_captions: Optional[int] = Field(None, ge=10, description="cap on training captions (null = all)")
    holdout_fraction: float = Field(0.1, gt=0, lt=1)
    seed: int = 13


class EvaluationClassifierConf(_Section):
    kind: Literal["linear_probe", "finetune"] = Field(
        "linear_probe", description="linear_probe: a logistic head per style over frozen mean-pooled sentence "
        "embeddings; finetune: a fine-tuned BERT-family classifier per style (style vs factual)")
    name_or_path: str = Field("all-MiniLM-L6-v2", description="sentence encoder (linear_probe) or backbone (finetune)")
    max_length: int = Field(40, ge=8)
    l2: float = Field(1e-3, ge=0, description="linear_probe: L2 penalty on the head's weights")
    epochs: int = Field(1, ge=1, description="finetune: epochs")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-5, gt=0, description="finetune: AdamW learning rate")
    max_train_captions: Optional[int] = Field(None, ge=10, description="cap on each style's positive training "
                                              "captions (as many factual ones are drawn); null = all")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="share of factual images held out for accuracy")
    max_factual_captions: int = Field(200_000, ge=100, description="factual captions of P (beyond those of the "
                                      "stylized images) read to the driver for the factual class: the same "
                                      "captions by a hash, so the driver never holds the whole corpus")
    seed: int = 29


class ExtractConf(_Section):
    classifier: ClassifierConf = Field(default_factory=ClassifierConf)
    classifier_overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per style set, classifier keys that differ from extract.classifier, "
        "e.g. {senticap: {batch_size: 64, lr: 2.0e-5}}")
    evaluation: EvaluationClassifierConf = Field(
        default_factory=EvaluationClassifierConf, description="the per-style evaluation classifiers (paper Sect. "
        "4.4): filter 1 of generate and cls. of evaluate")
    eps: float = Field(0.25, gt=0, lt=1, description="extraction proportion: share of words in a style phrase")
    head_selection_captions: Optional[int] = Field(
        1024, ge=1, description="train captions of a style set sampled to choose its (l_s, h_s); null = all "
        "(benchmarks/style_classifiers.py --part heads measures how the choice varies with it)")
    batch_size: int = Field(64, ge=1)
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
    type: Literal["auto", "flat", "ivf", "hnsw"] = Field(
        "auto", description="the scene index: flat (exact), ivf, hnsw, or auto: exact up to exact_max_items scenes; "
        "beyond, the index and search setting (HNSW ef_search, IVF nprobe; IVF alone where use_gpu) whose recall@10 "
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
        "captions are all in the train split are queries too, beside P (jobs.tables.query_captions): their pairs are "
        "new stylized captions for train images; a val or test image's description never is one. Off = the "
        "paper's P alone")
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
    encoder: EncoderConf = Field(default_factory=EncoderConf)
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
    batch_size: int = Field(16, ge=1)
    max_source_len: int = Field(64, ge=8)
    max_target_len: int = Field(48, ge=8)
    seed: int = 17


class DecodingConf(_Section):
    strategy: Literal["greedy", "beam", "sample"] = "greedy"
    num_beams: int = Field(4, ge=1)
    top_p: float = Field(0.9, gt=0, le=1)
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(32, ge=1)
    batch_size: int = Field(32, ge=1)
    no_repeat_ngram_size: int = Field(0, ge=0, description="forbid repeating any n-gram of this size (0 = off)")
    repetition_penalty: float = Field(1.0, gt=0, description="Hugging Face repetition penalty (1.0 = off)")
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
    epochs: int = Field(5, ge=1)
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
        1.0, ge=1, description="loss weight of the words an augmented caption adds to the factual caption it was "
        "generated from (its inserted style phrase); 1 = the paper's plain cross-entropy; original pairs always weigh "
        "1. Raising it teaches the captioner the style phrases of augmented pairs rather than only their content")
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
    eps: list[float] = Field(default_factory=list, description="extraction proportions of the eps curve (the paper: "
                             "[0.05, 0.25, 0.5]); each one other than extract.eps reruns extract (the same "
                             "classifiers, the style head re-selected at that eps), embed, retrieve and generate in "
                             "the schema <tables.schema>_eps<eps> and trains Fig. 5's captioner on its pairs; [] = no "
                             "eps curve")

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
    home: str = Field(".erg", description="local state: warehouse, MLflow store, models, sample")
    styles: list[str] = Field(default_factory=lambda: ["humor", "romantic", "positive", "negative"], min_length=1)
    style_sets: dict[str, list[str]] = Field(
        default_factory=dict, description="style sets, each with its own extractor classifier, e.g. {flickrstyle: "
        "[humor, romantic], senticap: [positive, negative]}; every style in exactly one set (default: those two, "
        "restricted to styles)")
    factual_label: str = "factual"
    spark: SparkConf = Field(default_factory=SparkConf)
    tables: TablesConf = Field(default_factory=TablesConf)
    mlflow: MlflowConf
    sample: SampleConf
    ingest: IngestConf = Field(default_factory=IngestConf)
    extract: ExtractConf = Field(default_factory=ExtractConf)
    embed: EmbedConf = Field(default_factory=EmbedConf)
    retrieve: RetrieveConf = Field(default_factory=RetrieveConf)
    generate: GenerateConf = Field(default_factory=GenerateConf)
    train: TrainConf = Field(default_factory=TrainConf)
    evaluate: EvaluateConf = Field(default_factory=EvaluateConf)
    visual_relatedness: VisualRelatednessConf = Field(default_factory=VisualRelatednessConf)
    experiment: ExperimentConf = Field(default_factory=ExperimentConf)

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


def load_config(name_or_path: str = "local", overrides: list[str] | dict | None = None) -> ErgConfig:
    """Load ``conf/<name>.yaml`` (or a path), apply ``key=value`` overrides, interpolate, validate."""
    data, label = _read_yaml(name_or_path)
    extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    if extra:
        data = _deep_merge(data, extra)
        label += " (with overrides)"
    home_raw = _interpolate(data.get("home", ".erg"), None)
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
