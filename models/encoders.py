"""Scene encoders (ERG step 2, Retrieve): images and captions of both corpora in one embedding space.

Every encoder implements :class:`SceneEncoder`: ``encode_texts`` and ``encode_images`` return float32
``[n, dim]`` arrays of L2-normalised vectors, so that an inner product is the cosine similarity the
paper thresholds at 0.6 (see ``models.scene_index``). ``version`` names the weights, tokenizer and
encoding options exactly: ``"<kind>:<name>:<12 hex>"``; a job embeds only the items that have no
vector under that version yet.

Three kinds, made by :func:`load_encoder`:

========== ================================= =================================================
kind       text query                        image query (an :class:`ImageInput`)
========== ================================= =================================================
sentence   caption, mean pooling + L2        ``tags`` (object tags / visual-context text),
           (equals sentence-transformers)    embedded as text
clip       caption via the CLIP tokenizer,   ``pixels`` (PNG/JPEG bytes) via CLIPImageProcessor,
           ``get_text_features``             ``get_image_features``
oscar      caption tokens only               ``region_features`` (float32 [n_regions, 2054]:
                                             2048 ResNet + 6 box) and optional ``tags``
========== ================================= =================================================

OSCAR (Li et al. 2020, the encoder of the ERG paper) is rebuilt here as :class:`OscarSceneModel`, with
the parameter names of an OSCAR checkpoint (``bert.embeddings.*``, ``bert.encoder.*``,
``bert.pooler.*``, ``bert.img_embedding.*``), and loaded from a checkpoint folder by
:func:`load_oscar_checkpoint`.
"""
from __future__ import annotations

import hashlib
import inspect
import io
import json
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError
from safetensors.torch import load_file as load_safetensors
from torch import nn
from transformers import AutoImageProcessor, AutoModel, AutoTokenizer, BertConfig, BertTokenizerFast, CLIPModel
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.bert.modeling_bert import BertEmbeddings, BertEncoder, BertPooler, BertPreTrainedModel

from models.backbones import MINILM_NAMES, pick_device, resolve_model_path

logger = logging.getLogger(__name__)

OSCAR_IMG_FEATURE_DIM = 2054
"""OSCAR's region feature: 2048-d Faster R-CNN (ResNet-101) feature + 6 box values."""
OSCAR_POOLINGS: tuple[str, ...] = ("pooled", "mean")
_Prepared = TypeVar("_Prepared")


@dataclass
class ImageInput:
    """What an encoder may see of one image; each encoder reads the part it needs.

    - ``pixels``: the encoded image file (PNG or JPEG bytes). Needed by ``clip``.
    - ``tags``: object tags (a list of words) or a visual-context text (one string). Needed by
      ``sentence``; optional for ``oscar`` (its second text segment, as in OSCAR's input).
    - ``region_features``: float32 region features ``[n_regions, 2054]``, as an array or as the
      flattened little-endian float32 bytes of one. Needed by ``oscar``.
    """

    pixels: bytes | None = None
    tags: str | Sequence[str] | None = None
    region_features: bytes | np.ndarray | None = None

    def tag_text(self) -> str:
        """The tags as one space-separated text ('' when there are none)."""
        if self.tags is None:
            return ""
        if isinstance(self.tags, str):
            return " ".join(self.tags.split())
        return " ".join(str(tag).strip() for tag in self.tags if str(tag).strip())

    def region_array(self, feature_dim: int) -> np.ndarray:
        """The region features as float32 ``[n_regions, feature_dim]`` (ValueError when absent or misshapen)."""
        if self.region_features is None:
            raise ValueError("has no region_features")
        if isinstance(self.region_features, (bytes, bytearray, memoryview)):
            raw = bytes(self.region_features)
            if len(raw) % 4:
                raise ValueError(f"region_features holds {len(raw)} bytes, not a whole number of float32 values")
            array = np.frombuffer(raw, dtype="<f4")
        else:
            array = np.asarray(self.region_features, dtype=np.float32)
        if array.ndim == 1:
            if array.size % feature_dim:
                raise ValueError(
                    f"region_features holds {array.size} floats, not a multiple of {feature_dim} per region"
                )
            array = array.reshape(-1, feature_dim)
        if array.ndim != 2 or array.shape[1] != feature_dim:
            raise ValueError(f"region_features has shape {array.shape}, expected [n_regions, {feature_dim}]")
        if array.shape[0] == 0:
            raise ValueError("region_features holds 0 regions")
        if not np.isfinite(array).all():
            raise ValueError("region_features contains NaN or infinite values")
        return np.ascontiguousarray(array, dtype=np.float32)


def _positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def display_name(name_or_path: str) -> str:
    """The encoder name recorded with its vectors: the hub name, or a local folder's own name."""
    if name_or_path.strip().lower() in MINILM_NAMES:
        return "all-MiniLM-L6-v2"
    candidate = Path(name_or_path.rstrip("/")).expanduser()
    return candidate.name if candidate.exists() else name_or_path


_UNSTABLE_CONFIG_KEYS = frozenset({"transformers_version", "architectures", "dtype", "torch_dtype"})
"""Config keys that record how a checkpoint was saved, not what it computes (tensor dtypes are hashed anyway)."""


def _stable_config(value: Any) -> Any:
    """A config dict without private keys and the keys in :data:`_UNSTABLE_CONFIG_KEYS`."""
    if isinstance(value, dict):
        return {
            k: _stable_config(v)
            for k, v in sorted(value.items())
            if not str(k).startswith("_") and k not in _UNSTABLE_CONFIG_KEYS
        }
    return value


def weights_version(kind: str, name: str, model: nn.Module, parts: dict[str, Any]) -> str:
    """``"<kind>:<name>:<hash>"``: sha256 over the config, every state-dict tensor and ``parts``.

    ``parts`` carries what else changes the vectors (tokenizer, image processor, encoding options), as
    JSON-serialisable values. The same checkpoint gives the same version on any machine and path.
    """
    digest = hashlib.sha256()
    config = getattr(model, "config", None)
    if config is not None:
        digest.update(json.dumps(_stable_config(config.to_dict()), sort_keys=True, default=str).encode())
    digest.update(json.dumps(_stable_config(parts), sort_keys=True, default=str).encode())
    for key, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"{kind}:{name}:{digest.hexdigest()[:12]}"


def _tokenizer_fingerprint(tokenizer: Any) -> str:
    """The tokenizer's full definition (vocabulary, normaliser, special tokens) as one string."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return hashlib.sha256(backend.to_str().encode()).hexdigest()
    return hashlib.sha256(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest()


class SceneEncoder(ABC):
    """Embeds captions and images of scenes into one space of unit vectors.

    Attributes: ``kind`` (``sentence``/``clip``/``oscar``), ``name`` (model name), ``version`` (stable id
    of weights + tokenizer + options), ``dim`` (vector size), ``device`` (torch device it runs on).
    """

    kind: ClassVar[str]
    name: str
    version: str
    dim: int
    device: torch.device

    def encode_texts(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Captions -> float32 ``[n, dim]`` unit vectors (rows in input order)."""
        batch_size = _positive_int(batch_size, "batch_size")
        checked: list[str] = []
        for row, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"texts[{row}] is {text!r}: every caption must be a non-empty string")
            checked.append(text)
        return self._run_batches(checked, batch_size, self._embed_texts, sort_key=len)

    def encode_images(self, images: Sequence[ImageInput], batch_size: int = 32) -> np.ndarray:
        """Images -> float32 ``[n, dim]`` unit vectors (rows in input order); each encoder's needs are in its doc."""
        batch_size = _positive_int(batch_size, "batch_size")
        numbered = list(enumerate(images))
        for row, image in numbered:
            if not isinstance(image, ImageInput):
                raise ValueError(f"images[{row}] is a {type(image).__name__}, expected models.encoders.ImageInput")
        return self._run_batches(numbered, batch_size, self._embed_image_batch, sort_key=None)

    def _embed_image_batch(self, numbered: list[tuple[int, ImageInput]]) -> torch.Tensor:
        """Decode one batch only (a partition's images are not all held decoded at once), then embed it."""
        prepared = []
        for row, image in numbered:
            try:
                prepared.append(self._prepare_image(image))
            except ValueError as error:
                raise ValueError(f"images[{row}] {error}") from error
        return self._embed_images(prepared)

    def _run_batches(
        self,
        items: list[_Prepared],
        batch_size: int,
        embed: Callable[[list[_Prepared]], torch.Tensor],
        sort_key: Callable[[_Prepared], int] | None,
    ) -> np.ndarray:
        """Embed ``items`` in batches (longest first when ``sort_key`` is given, to pad less), L2-normalise."""
        out = np.empty((len(items), self.dim), dtype=np.float32)
        order = list(range(len(items)))
        if sort_key is not None:
            order.sort(key=lambda i: sort_key(items[i]), reverse=True)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                vectors = embed([items[i] for i in rows])
                out[rows] = F.normalize(vectors.float(), dim=-1).cpu().numpy()
        return out

    @abstractmethod
    def _embed_texts(self, texts: list[str]) -> torch.Tensor:
        """One batch of captions -> [b, dim] (not yet normalised)."""

    @abstractmethod
    def _prepare_image(self, image: ImageInput) -> Any:
        """Check and decode what this encoder needs of one image (ValueError saying what is missing)."""

    @abstractmethod
    def _embed_images(self, prepared: list[Any]) -> torch.Tensor:
        """One batch of prepared images -> [b, dim] (not yet normalised)."""


def _tokenize(tokenizer: Any, texts: list[str], max_length: int, device: torch.device) -> Any:
    """A padded, truncated batch of token ids on ``device``."""
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return batch.to(device)


def _mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states over the positions where ``mask`` is 1."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


_MEAN_POOLING_MODULES = frozenset(
    {
        "sentence_transformers.models.Transformer",
        "sentence_transformers.models.Pooling",
        "sentence_transformers.models.Normalize",
    }
)


def _check_mean_pooling_layout(path: str) -> None:
    """A local sentence-transformers folder must be Transformer + mean Pooling (+ Normalize) to equal this encoder."""
    modules_file = Path(path) / "modules.json"
    if not modules_file.is_file():
        return
    modules = json.loads(modules_file.read_text())
    others = sorted({m["type"] for m in modules} - _MEAN_POOLING_MODULES)
    if others:
        raise ValueError(f"sentence model {path!r} has modules {others} beyond Transformer, Pooling and Normalize")
    for module in modules:
        pooling_file = Path(path) / module["path"] / "config.json"
        if module["type"].endswith(".Pooling") and pooling_file.is_file():
            pooling = json.loads(pooling_file.read_text())
            modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode_") and v is True)
            if modes != ["pooling_mode_mean_tokens"]:
                raise ValueError(f"sentence model {path!r} pools with {modes}: the sentence encoder does mean pooling")


PRECISIONS = ("fp32", "bf16", "int8")


def with_precision(model: torch.nn.Module, precision: str, device: torch.device) -> torch.nn.Module:
    """``model`` to run in ``precision``: ``fp32`` as is; ``bf16`` its weights in bfloat16; ``int8`` its Linear layers
    dynamically quantized to int8 with per-channel weight scales (CPU only: PyTorch's dynamic quantization has no
    CUDA kernels). What each costs in quality and gains in speed is measured by benchmarks/scale.py."""
    if precision == "fp32":
        return model
    if precision == "bf16":
        return model.to(torch.bfloat16)
    if device.type != "cpu":
        raise ValueError(f"precision int8 runs on CPU only (dynamic quantization), the encoder is on {device}: use "
                         "fp32 or bf16 on a GPU")
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notice (the API still ships in torch 2.x)
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig})


class SentenceEncoder(SceneEncoder):
    """A sentence encoder (all-MiniLM-L6-v2 by default): AutoModel, mean pooling over tokens, L2.

    Texts: the caption. Images: their ``tags`` (object tags or visual-context text), embedded as text;
    an image without tags is a ValueError. A sentence-transformers folder whose ``modules.json`` asks for
    anything but mean pooling (CLS pooling, a Dense layer) is a ValueError rather than a silent mismatch.
    ``max_length`` defaults to the model's ``sentence_bert_config.json`` (256 for MiniLM) or else the
    tokenizer's limit, as sentence-transformers does.
    """

    kind = "sentence"

    def __init__(
        self, name_or_path: str = "all-MiniLM-L6-v2", device: str = "auto", max_length: int | None = None,
        precision: str = "fp32",
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        path = resolve_model_path(name_or_path)
        _check_mean_pooling_layout(path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.max_length = self._max_length(path) if max_length is None else _positive_int(max_length, "max_length")
        self.name = display_name(name_or_path)
        self.dim = int(self.model.config.hidden_size)
        self.precision = precision
        parts: dict[str, Any] = {"tokenizer": _tokenizer_fingerprint(self.tokenizer), "max_length": self.max_length}
        if precision != "fp32":  # fp32 keeps the versions (and the vectors) embedded before this option existed
            parts["precision"] = precision
        self.version = weights_version(self.kind, self.name, self.model, parts)
        self.device = pick_device(device)
        self.model = with_precision(self.model.to(self.device), precision, self.device)

    def _max_length(self, path: str) -> int:
        sbert_config = Path(path) / "sentence_bert_config.json"
        if sbert_config.is_file():
            return int(json.loads(sbert_config.read_text())["max_seq_length"])
        return int(min(self.tokenizer.model_max_length, self.model.config.max_position_embeddings))

    def _embed_texts(self, texts: list[str]) -> torch.Tensor:
        batch = _tokenize(self.tokenizer, texts, self.max_length, self.device)
        hidden = self.model(**batch).last_hidden_state
        return _mean_pool(hidden, batch["attention_mask"])

    def _prepare_image(self, image: ImageInput) -> str:
        text = image.tag_text()
        if not text:
            raise ValueError(
                "has no tags: the sentence encoder embeds an image through its object tags / visual-context text"
            )
        return text

    def _embed_images(self, prepared: list[str]) -> torch.Tensor:
        return self._embed_texts(prepared)


def _preprocessing(image_processor: Any) -> dict[str, Any]:
    """The image processor's parameters (resize, crop, normalisation), without the backend class name."""
    return {k: v for k, v in image_processor.to_dict().items() if k not in ("image_processor_type", "processor_class")}


class ClipEncoder(SceneEncoder):
    """CLIP (transformers ``CLIPModel``, by hub name or local folder): one space for pixels and captions.

    Texts: tokenized by the checkpoint's tokenizer (truncated to its 77 positions),
    ``get_text_features``. Images: ``pixels`` (PNG/JPEG bytes) decoded with PIL and preprocessed by the
    checkpoint's ``CLIPImageProcessor`` (through ``AutoImageProcessor``, which takes the torchvision
    backend where installed and the PIL one otherwise), ``get_image_features``; an image without pixels
    is a ValueError. ``dim`` is the projection dimension.
    """

    kind = "clip"

    def __init__(self, name_or_path: str, device: str = "auto") -> None:
        path = resolve_model_path(name_or_path)
        self.model = CLIPModel.from_pretrained(path).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.image_processor = AutoImageProcessor.from_pretrained(path)
        self.max_length = int(self.model.config.text_config.max_position_embeddings)
        self.name = display_name(name_or_path)
        self.dim = int(self.model.config.projection_dim)
        self.version = weights_version(
            self.kind,
            self.name,
            self.model,
            {
                "tokenizer": _tokenizer_fingerprint(self.tokenizer),
                "image_processor": _preprocessing(self.image_processor),
            },
        )
        self.device = pick_device(device)
        self.model.to(self.device)

    def _embed_texts(self, texts: list[str]) -> torch.Tensor:
        batch = _tokenize(self.tokenizer, texts, self.max_length, self.device)
        features = self.model.get_text_features(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return features.pooler_output

    def _prepare_image(self, image: ImageInput) -> Image.Image:
        if not image.pixels:
            raise ValueError("has no pixels: the clip encoder embeds the image file (PNG/JPEG bytes)")
        try:
            with Image.open(io.BytesIO(image.pixels)) as decoded:
                return decoded.convert("RGB")
        except (UnidentifiedImageError, OSError) as error:
            raise ValueError(f"pixels are not a readable PNG/JPEG image ({error})") from error

    def _embed_images(self, prepared: list[Image.Image]) -> torch.Tensor:
        pixel_values = self.image_processor(images=prepared, return_tensors="pt")["pixel_values"].to(self.device)
        return self.model.get_image_features(pixel_values=pixel_values).pooler_output


class BertImgModel(BertPreTrainedModel):
    """OSCAR's BertImgModel: BERT over text tokens followed by projected image regions.

    The text tokens (caption, or [CLS] [SEP] tags [SEP]) go through ``embeddings`` (word + position +
    token type, LayerNorm, dropout); the region features go through ``img_embedding``
    (Linear(img_feature_dim -> hidden)), an optional ``LayerNorm`` (``use_img_layernorm``) and
    ``dropout``; both are concatenated along the sequence and fed to ``encoder``; ``pooler`` maps the
    first position. Only OSCAR's continuous region features are supported (not its ``dis_code`` types).
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        feature_type = str(getattr(config, "img_feature_type", "faster_r-cnn"))
        if feature_type.startswith("dis_code"):
            raise ValueError(
                f"img_feature_type {feature_type!r} (discrete codes) is not supported: only region features are"
            )
        if not getattr(config, "img_feature_dim", 0):
            raise ValueError("the OSCAR config has no img_feature_dim (2054 for OSCAR's region features)")
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)
        self.img_dim = int(config.img_feature_dim)
        self.img_embedding = nn.Linear(self.img_dim, config.hidden_size, bias=True)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.use_img_layernorm = bool(getattr(config, "use_img_layernorm", False))
        if self.use_img_layernorm:
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=float(getattr(config, "img_layer_norm_eps", 1e-12)))
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        img_feats: torch.Tensor | None = None,
        img_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(sequence_output [b, t + r, h], pooled_output [b, h]); ``img_mask`` marks real regions (1) vs padding."""
        embedding_output = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        full_mask = attention_mask
        if img_feats is not None:
            img_embedding_output = self.img_embedding(img_feats)
            if self.use_img_layernorm:
                img_embedding_output = self.LayerNorm(img_embedding_output)
            img_embedding_output = self.dropout(img_embedding_output)
            embedding_output = torch.cat((embedding_output, img_embedding_output), dim=1)
            if img_mask is None:
                img_mask = torch.ones(img_feats.shape[:2], dtype=attention_mask.dtype, device=attention_mask.device)
            full_mask = torch.cat((attention_mask, img_mask.to(attention_mask.dtype)), dim=1)
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=embedding_output, attention_mask=full_mask)
        sequence_output = self.encoder(embedding_output, attention_mask=mask).last_hidden_state
        return sequence_output, self.pooler(sequence_output)


class OscarSceneModel(BertPreTrainedModel):
    """The ``bert`` trunk of an OSCAR checkpoint (``bert.*`` keys), without its task head."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertImgModel(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        img_feats: torch.Tensor | None = None,
        img_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`BertImgModel.forward`."""
        return self.bert(input_ids, attention_mask, token_type_ids, img_feats, img_mask)


@dataclass(frozen=True)
class CheckpointReport:
    """What loading a checkpoint by key name found: model keys it lacked, and keys the model has no use for."""

    weights_file: str
    missing_keys: tuple[str, ...]
    unexpected_keys: tuple[str, ...]


OSCAR_WEIGHT_FILES: tuple[str, ...] = ("model.safetensors", "pytorch_model.bin")


def load_oscar_checkpoint(path: str, allow_missing_keys: bool = False) -> tuple[OscarSceneModel, CheckpointReport]:
    """Build an :class:`OscarSceneModel` from an OSCAR checkpoint folder and load its weights by key name.

    The folder holds ``config.json`` (a BERT config plus ``img_feature_dim`` and OSCAR's image keys) and
    ``model.safetensors`` or ``pytorch_model.bin`` (a state dict with ``bert.*`` keys, as OSCAR's
    fine-tuning and pre-training scripts save it). Keys outside the model (task heads such as
    ``classifier.*`` or ``cls.*``) are reported and ignored; model keys the checkpoint lacks raise a
    ValueError unless ``allow_missing_keys`` (they then keep their random initialisation).
    """
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(f"{path!r} is not an OSCAR checkpoint folder: it has no config.json")
    weights_file = next((folder / name for name in OSCAR_WEIGHT_FILES if (folder / name).is_file()), None)
    if weights_file is None:
        raise ValueError(f"OSCAR checkpoint {path!r} holds none of the weight files {list(OSCAR_WEIGHT_FILES)}")
    config = BertConfig.from_pretrained(str(folder))
    model = OscarSceneModel(config)
    if weights_file.suffix == ".safetensors":
        state = load_safetensors(str(weights_file))
    else:
        state = torch.load(weights_file, map_location="cpu", weights_only=True)
    expected = model.state_dict()
    mismatched = [
        f"{key}: checkpoint {tuple(state[key].shape)} vs model {tuple(tensor.shape)}"
        for key, tensor in expected.items()
        if key in state and state[key].shape != tensor.shape
    ]
    if mismatched:
        raise ValueError(f"OSCAR checkpoint {path!r} does not fit its config.json: {mismatched[:5]}")
    report = CheckpointReport(
        weights_file=weights_file.name,
        missing_keys=tuple(sorted(set(expected) - set(state))),
        unexpected_keys=tuple(sorted(set(state) - set(expected))),
    )
    if report.missing_keys and not allow_missing_keys:
        raise ValueError(
            f"OSCAR checkpoint {path!r} lacks {len(report.missing_keys)} model keys, "
            f"e.g. {list(report.missing_keys[:5])}: "
            "is it an OSCAR checkpoint (bert.* keys)? pass allow_missing_keys=True to keep random weights for them"
        )
    if report.unexpected_keys:
        logger.info(
            "OSCAR checkpoint %s: ignoring %d keys outside the encoder, e.g. %s",
            path,
            len(report.unexpected_keys),
            report.unexpected_keys[:3],
        )
    model.load_state_dict({key: state[key] for key in expected if key in state}, strict=False)
    return model.eval(), report


@dataclass(frozen=True)
class _OscarImage:
    tags: str
    regions: np.ndarray


class OscarEncoder(SceneEncoder):
    """OSCAR from a checkpoint folder (see :func:`load_oscar_checkpoint`), with its BERT tokenizer.

    Text query: ``[CLS] caption [SEP]``, no regions. Image query: OSCAR's input with an empty caption,
    ``[CLS] [SEP] tags [SEP]`` (tags as token type 1) followed by the ``region_features``, the first
    ``max_img_seq_length`` regions; an image without region features is a ValueError, tags are optional.
    The vector is the ``pooled`` output (tanh of the pooler over the first position, as OSCAR's heads
    read it) or the ``mean`` of the hidden states over all real tokens and regions, then L2-normalised.
    The tokenizer comes from the checkpoint folder (its ``vocab.txt``) unless ``tokenizer_name_or_path``.
    """

    kind = "oscar"

    def __init__(
        self,
        name_or_path: str,
        device: str = "auto",
        pooling: str = "pooled",
        max_seq_length: int = 70,
        max_img_seq_length: int = 50,
        tokenizer_name_or_path: str | None = None,
        allow_missing_keys: bool = False,
    ) -> None:
        if pooling not in OSCAR_POOLINGS:
            raise ValueError(f"unknown OSCAR pooling {pooling!r}: allowed are {list(OSCAR_POOLINGS)}")
        path = resolve_model_path(name_or_path)
        self.model, self.load_report = load_oscar_checkpoint(path, allow_missing_keys=allow_missing_keys)
        self.tokenizer = BertTokenizerFast.from_pretrained(resolve_model_path(tokenizer_name_or_path or path))
        self.pooling = pooling
        self.max_seq_length = _positive_int(max_seq_length, "max_seq_length")
        self.max_img_seq_length = _positive_int(max_img_seq_length, "max_img_seq_length")
        self.img_feature_dim = self.model.bert.img_dim
        self.name = display_name(name_or_path)
        self.dim = int(self.model.config.hidden_size)
        self.version = weights_version(
            self.kind,
            self.name,
            self.model,
            {
                "tokenizer": _tokenizer_fingerprint(self.tokenizer),
                "pooling": pooling,
                "max_seq_length": self.max_seq_length,
                "max_img_seq_length": self.max_img_seq_length,
            },
        )
        self.device = pick_device(device)
        self.model.to(self.device)

    def _pool(self, sequence_output: torch.Tensor, pooled_output: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return pooled_output if self.pooling == "pooled" else _mean_pool(sequence_output, mask)

    def _embed_texts(self, texts: list[str]) -> torch.Tensor:
        batch = _tokenize(self.tokenizer, texts, self.max_seq_length, self.device)
        sequence_output, pooled_output = self.model(
            batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
        )
        return self._pool(sequence_output, pooled_output, batch["attention_mask"])

    def _prepare_image(self, image: ImageInput) -> _OscarImage:
        if image.region_features is None:
            raise ValueError(
                "has no region_features: the oscar encoder embeds an image by its region features "
                f"[n_regions, {self.img_feature_dim}]"
            )
        regions = image.region_array(self.img_feature_dim)[: self.max_img_seq_length]
        return _OscarImage(tags=image.tag_text(), regions=regions)

    def _embed_images(self, prepared: list[_OscarImage]) -> torch.Tensor:
        batch = self.tokenizer(
            [""] * len(prepared),
            [item.tags for item in prepared],
            padding=True,
            truncation="only_second",
            max_length=self.max_seq_length,
            return_tensors="pt",
        ).to(self.device)
        regions = max(item.regions.shape[0] for item in prepared)
        feats = np.zeros((len(prepared), regions, self.img_feature_dim), dtype=np.float32)
        img_mask = torch.zeros((len(prepared), regions), dtype=batch["attention_mask"].dtype)
        for row, item in enumerate(prepared):
            feats[row, : item.regions.shape[0]] = item.regions
            img_mask[row, : item.regions.shape[0]] = 1
        img_feats = torch.from_numpy(feats).to(self.device)
        img_mask = img_mask.to(self.device)
        sequence_output, pooled_output = self.model(
            batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], img_feats, img_mask
        )
        return self._pool(sequence_output, pooled_output, torch.cat((batch["attention_mask"], img_mask), dim=1))


ENCODER_KINDS: dict[str, type[SceneEncoder]] = {"sentence": SentenceEncoder, "clip": ClipEncoder, "oscar": OscarEncoder}


def load_encoder(kind: str, name_or_path: str | None = None, device: str = "auto", **options: Any) -> SceneEncoder:
    """Load the scene encoder of ``kind`` (``sentence``, ``clip``, ``oscar``) from a hub name or local folder.

    ``name_or_path`` defaults to all-MiniLM-L6-v2 for ``sentence`` and is required otherwise. ``device``:
    ``auto`` (the GPU Spark assigned, else CPU), ``cpu`` or ``cuda[:N]``. ``options`` go to the encoder:
    ``sentence``: max_length, precision (fp32 / bf16 / int8, see :func:`with_precision`); ``oscar``: pooling,
    max_seq_length, max_img_seq_length, tokenizer_name_or_path, allow_missing_keys; ``clip``: none.
    """
    if kind not in ENCODER_KINDS:
        raise ValueError(f"unknown encoder kind {kind!r}: allowed are {sorted(ENCODER_KINDS)}")
    encoder_class = ENCODER_KINDS[kind]
    parameters = inspect.signature(encoder_class.__init__).parameters
    allowed = [p for p in parameters if p not in ("self", "name_or_path", "device")]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown options {unknown} for the {kind} encoder: allowed are {allowed}")
    if name_or_path is None:
        if kind != "sentence":
            raise ValueError(f"the {kind} encoder needs name_or_path: a Hugging Face name or a local checkpoint folder")
        return encoder_class(device=device, **options)
    return encoder_class(name_or_path, device=device, **options)
