"""Tests of the scene encoders (models/encoders.py): pretrained MiniLM, a tiny CLIP and a tiny OSCAR.

The tiny CLIP and OSCAR are built from configs, saved to tmp_path the way their real checkpoints are
stored, and loaded back through ``load_encoder``, the code a cluster runs.
"""
from __future__ import annotations

import io
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    AutoModel,
    AutoTokenizer,
    BertConfig,
    BertModel,
    BertTokenizerFast,
    CLIPImageProcessor,
    CLIPModel,
)

from models.backbones import minilm_path
from models.encoders import (
    ENCODER_KINDS,
    OSCAR_IMG_FEATURE_DIM,
    ImageInput,
    OscarSceneModel,
    SceneEncoder,
    load_encoder,
)
from tiny_models import save_tiny_clip


def assert_unit_rows(vectors: np.ndarray, rows: int, dim: int) -> None:
    assert vectors.dtype == np.float32
    assert vectors.shape == (rows, dim)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def normalized(tensor: torch.Tensor) -> np.ndarray:
    return torch.nn.functional.normalize(tensor, dim=-1).numpy()


# --- sentence encoder: the real pretrained all-MiniLM-L6-v2 ------------------------------------------------

CAPTIONS = [
    "a man riding a horse on the beach",
    "a person rides a horse along the sea shore",
    "a plate of pasta with tomato sauce on a table",
    "two dogs playing with a ball in the grass",
]


@pytest.fixture(scope="module")
def minilm() -> SceneEncoder:
    return load_encoder("sentence", device="cpu")


def test_sentence_encoder_equals_hand_computed_mean_pooling(minilm: SceneEncoder) -> None:
    vectors = minilm.encode_texts(CAPTIONS, batch_size=3)
    assert (minilm.kind, minilm.name, minilm.dim) == ("sentence", "all-MiniLM-L6-v2", 384)
    assert_unit_rows(vectors, 4, 384)

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    model = AutoModel.from_pretrained(minilm_path()).eval()
    with torch.no_grad():
        for row, caption in enumerate(CAPTIONS):
            batch = tokenizer([caption], return_tensors="pt")
            hidden = model(**batch).last_hidden_state[0]
            np.testing.assert_allclose(vectors[row], normalized(hidden.mean(dim=0)), atol=1e-5)
    # batching and length-sorting do not change the vectors or their order
    np.testing.assert_allclose(minilm.encode_texts(CAPTIONS, batch_size=1), vectors, atol=1e-5)


def test_similar_captions_score_higher_than_unrelated_ones(minilm: SceneEncoder) -> None:
    vectors = minilm.encode_texts(CAPTIONS)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > 0.6
    assert similarity[0, 1] > similarity[0, 2] + 0.4
    assert similarity[0, 1] > similarity[0, 3] + 0.3
    # an image enters through its object tags, as text
    image = minilm.encode_images([ImageInput(tags=["horse", "beach", "man"]), ImageInput(tags="spaghetti plate fork")])
    assert_unit_rows(image, 2, 384)
    cross = image @ vectors.T
    assert cross[0].argmax() in (0, 1) and cross[1].argmax() == 2


def test_sentence_version_is_stable_and_tracks_options(minilm: SceneEncoder) -> None:
    assert minilm.version.startswith("sentence:all-MiniLM-L6-v2:")
    assert load_encoder("sentence", "all-MiniLM-L6-v2", device="cpu").version == minilm.version
    assert load_encoder("sentence", device="cpu", max_length=32).version != minilm.version


@pytest.mark.parametrize("precision, min_cosine", [("bf16", 0.995), ("int8", 0.9)])
def test_sentence_encoder_precision_is_versioned_and_close_to_fp32(minilm: SceneEncoder, precision: str,
                                                                  min_cosine: float) -> None:
    low = load_encoder("sentence", device="cpu", precision=precision)
    assert low.version != minilm.version and low.precision == precision
    assert load_encoder("sentence", device="cpu", precision="fp32").version == minilm.version
    vectors, reference = low.encode_texts(CAPTIONS), minilm.encode_texts(CAPTIONS)
    assert_unit_rows(vectors, 4, 384)
    cosine = (vectors * reference).sum(axis=1)
    assert cosine.min() > min_cosine, cosine
    if precision == "int8":
        assert any(type(m).__module__.endswith("quantized.dynamic.modules.linear") for m in low.model.modules())
    with pytest.raises(ValueError, match="precision must be one of"):
        load_encoder("sentence", device="cpu", precision="fp8")


def test_sentence_encoder_rejects_bad_input(minilm: SceneEncoder) -> None:
    with pytest.raises(ValueError, match=r"texts\[1\]"):
        minilm.encode_texts(["a dog", "  "])
    with pytest.raises(ValueError, match=r"texts\[0\]"):
        minilm.encode_texts([None])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"images\[1\] has no tags"):
        minilm.encode_images([ImageInput(tags="dog"), ImageInput(pixels=b"\x89PNG")])
    with pytest.raises(ValueError, match="batch_size"):
        minilm.encode_texts(["a dog"], batch_size=0)
    assert minilm.encode_texts([]).shape == (0, 384)


def test_sentence_encoder_refuses_a_model_that_does_not_mean_pool(tmp_path) -> None:
    (tmp_path / "1_Pooling").mkdir()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    with pytest.raises(ValueError, match="pools with \\['pooling_mode_cls_token'\\]"):
        load_encoder("sentence", str(tmp_path), device="cpu")
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="beyond Transformer, Pooling and Normalize"):
        load_encoder("sentence", str(tmp_path), device="cpu")


def test_load_encoder_rejects_unknown_kinds_and_options() -> None:
    assert sorted(ENCODER_KINDS) == ["clip", "oscar", "sentence"]
    with pytest.raises(ValueError, match=r"allowed are \['clip', 'oscar', 'sentence'\]"):
        load_encoder("vilbert", "x")
    with pytest.raises(ValueError, match="unknown options"):
        load_encoder("sentence", device="cpu", pooling="cls")
    with pytest.raises(ValueError, match="needs name_or_path"):
        load_encoder("clip")


# --- CLIP: a tiny model with a real byte-level BPE CLIP tokenizer -------------------------------------------


def png_bytes(colour: tuple[int, int, int], size: tuple[int, int] = (40, 48), fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def tiny_clip_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_clip(tmp_path_factory.mktemp("tiny-clip"))


def test_tiny_clip_loads_and_encodes_pixels_and_text(tiny_clip_path: str) -> None:
    encoder = load_encoder("clip", tiny_clip_path, device="cpu")
    assert (encoder.kind, encoder.dim, encoder.name) == ("clip", 16, os.path.basename(tiny_clip_path))
    images = [ImageInput(pixels=png_bytes((220, 30, 30))), ImageInput(pixels=png_bytes((20, 40, 230), fmt="JPEG"))]
    image_vectors = encoder.encode_images(images, batch_size=2)
    text_vectors = encoder.encode_texts(["a red square", "a blue square on a long long table"])
    assert_unit_rows(image_vectors, 2, 16)
    assert_unit_rows(text_vectors, 2, 16)
    assert not np.allclose(image_vectors[0], image_vectors[1], atol=1e-3)

    model = CLIPModel.from_pretrained(tiny_clip_path).eval()
    processor = CLIPImageProcessor.from_pretrained(tiny_clip_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_clip_path)
    with torch.no_grad():
        decoded = [Image.open(io.BytesIO(image.pixels)).convert("RGB") for image in images]
        pixels = processor(images=decoded, return_tensors="pt")["pixel_values"]
        expected_images = normalized(model.get_image_features(pixel_values=pixels).pooler_output)
        np.testing.assert_allclose(image_vectors, expected_images, atol=1e-5)
        for row, caption in enumerate(["a red square", "a blue square on a long long table"]):
            tokens = tokenizer([caption], return_tensors="pt")
            expected = normalized(model.get_text_features(**tokens).pooler_output)[0]
            np.testing.assert_allclose(text_vectors[row], expected, atol=1e-5)
    assert load_encoder("clip", tiny_clip_path, device="cpu").version == encoder.version


def test_clip_encoder_needs_readable_pixels(tiny_clip_path: str) -> None:
    encoder = load_encoder("clip", tiny_clip_path, device="cpu")
    with pytest.raises(ValueError, match=r"images\[0\] has no pixels"):
        encoder.encode_images([ImageInput(tags=["dog"])])
    with pytest.raises(ValueError, match=r"images\[1\] pixels are not a readable"):
        encoder.encode_images([ImageInput(pixels=png_bytes((1, 2, 3))), ImageInput(pixels=b"not an image")])


# --- OSCAR: a tiny BertImgModel saved under OSCAR's key names ------------------------------------------------


def tiny_oscar_config() -> BertConfig:
    return BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        img_feature_dim=OSCAR_IMG_FEATURE_DIM,
        img_feature_type="faster_r-cnn",
    )


def save_oscar_checkpoint(folder, state: dict[str, torch.Tensor], config: BertConfig) -> str:
    """Store a checkpoint as OSCAR's scripts do: config.json, pytorch_model.bin (state dict), vocab.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    config.to_json_file(folder / "config.json")
    torch.save(state, folder / "pytorch_model.bin")
    BertTokenizerFast.from_pretrained(minilm_path()).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tiny_oscar(tmp_path_factory: pytest.TempPathFactory) -> tuple[OscarSceneModel, str]:
    torch.manual_seed(0)
    model = OscarSceneModel(tiny_oscar_config()).eval()
    state = dict(model.state_dict())
    # an OSCAR fine-tuned checkpoint carries its task head next to the bert trunk
    state["classifier.weight"] = torch.randn(2, 32)
    state["classifier.bias"] = torch.zeros(2)
    folder = tmp_path_factory.mktemp("oscar") / "checkpoint-7-1000"
    return model, save_oscar_checkpoint(folder, state, tiny_oscar_config())


def test_oscar_module_uses_oscar_checkpoint_key_names(tiny_oscar: tuple[OscarSceneModel, str]) -> None:
    keys = set(tiny_oscar[0].state_dict())
    assert {
        "bert.embeddings.word_embeddings.weight",
        "bert.embeddings.position_embeddings.weight",
        "bert.embeddings.token_type_embeddings.weight",
        "bert.embeddings.LayerNorm.weight",
        "bert.encoder.layer.0.attention.self.query.weight",
        "bert.encoder.layer.1.attention.output.LayerNorm.bias",
        "bert.encoder.layer.1.intermediate.dense.weight",
        "bert.encoder.layer.1.output.dense.bias",
        "bert.pooler.dense.weight",
        "bert.img_embedding.weight",
        "bert.img_embedding.bias",
    } <= keys
    assert all(key.startswith("bert.") for key in keys)
    assert tiny_oscar[0].state_dict()["bert.img_embedding.weight"].shape == (32, OSCAR_IMG_FEATURE_DIM)
    # OSCAR's optional image LayerNorm (use_img_layernorm) sits at bert.LayerNorm
    with_norm = OscarSceneModel(BertConfig(**{**tiny_oscar_config().to_dict(), "use_img_layernorm": True}))
    assert {"bert.LayerNorm.weight", "bert.LayerNorm.bias"} <= set(with_norm.state_dict()) - keys


def test_oscar_text_path_equals_bert_model_with_the_same_weights(tiny_oscar: tuple[OscarSceneModel, str]) -> None:
    model = tiny_oscar[0]
    bert = BertModel(tiny_oscar_config()).eval()
    trunk = {
        k.removeprefix("bert."): v for k, v in model.state_dict().items() if not k.startswith("bert.img_embedding")
    }
    assert not bert.load_state_dict(trunk, strict=False).missing_keys
    tokenizer = BertTokenizerFast.from_pretrained(minilm_path())
    batch = tokenizer(["a dog on a bench", "a cat"], padding=True, return_tensors="pt")
    with torch.no_grad():
        sequence, pooled = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        reference = bert(**batch)
    torch.testing.assert_close(pooled, reference.pooler_output, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sequence, reference.last_hidden_state, atol=1e-5, rtol=1e-5)


def test_tiny_oscar_loads_without_missing_keys_and_matches_its_module(tiny_oscar: tuple[OscarSceneModel, str]) -> None:
    model, path = tiny_oscar
    encoder = load_encoder("oscar", path, device="cpu")
    assert encoder.load_report.missing_keys == ()
    assert encoder.load_report.unexpected_keys == ("classifier.bias", "classifier.weight")
    assert (encoder.kind, encoder.dim, encoder.name) == ("oscar", 32, "checkpoint-7-1000")

    tokenizer = BertTokenizerFast.from_pretrained(path)
    captions = ["a man riding a horse", "two dogs playing in the grass with a red ball"]
    text_vectors = encoder.encode_texts(captions, batch_size=2)
    assert_unit_rows(text_vectors, 2, 32)

    rng = np.random.default_rng(0)
    regions = [rng.standard_normal((5, OSCAR_IMG_FEATURE_DIM)).astype(np.float32),
               rng.standard_normal((3, OSCAR_IMG_FEATURE_DIM)).astype(np.float32)]
    tags = [["horse", "man", "beach"], "dog ball grass"]
    images = [ImageInput(tags=tags[0], region_features=regions[0]),
              ImageInput(tags=tags[1], region_features=regions[1].tobytes())]
    image_vectors = encoder.encode_images(images, batch_size=2)
    assert_unit_rows(image_vectors, 2, 32)

    with torch.no_grad():
        for row, caption in enumerate(captions):
            batch = tokenizer([caption], return_tensors="pt")
            _, pooled = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            np.testing.assert_allclose(text_vectors[row], normalized(pooled)[0], atol=1e-5)
        for row, tag_text in enumerate(["horse man beach", "dog ball grass"]):
            batch = tokenizer([""], [tag_text], return_tensors="pt")  # [CLS] [SEP] tags [SEP], tags as type 1
            assert batch["token_type_ids"][0].tolist()[:2] == [0, 0] and batch["token_type_ids"][0, -1] == 1
            _, pooled = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                              torch.from_numpy(regions[row])[None])
            # padded to the batch's 5 regions, the 3-region image still gets its own unpadded vector
            np.testing.assert_allclose(image_vectors[row], normalized(pooled)[0], atol=1e-5)


def test_oscar_pooling_options_and_versions(tiny_oscar: tuple[OscarSceneModel, str]) -> None:
    model, path = tiny_oscar
    pooled = load_encoder("oscar", path, device="cpu")
    mean = load_encoder("oscar", path, device="cpu", pooling="mean")
    assert pooled.version != mean.version and pooled.version.startswith("oscar:checkpoint-7-1000:")
    tokenizer = BertTokenizerFast.from_pretrained(path)
    batch = tokenizer(["a man riding a horse"], return_tensors="pt")
    with torch.no_grad():
        sequence, _ = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    expected = normalized(sequence[0].mean(0))
    np.testing.assert_allclose(mean.encode_texts(["a man riding a horse"])[0], expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"allowed are \['pooled', 'mean'\]"):
        load_encoder("oscar", path, device="cpu", pooling="max")


def test_oscar_checkpoint_problems_are_reported(tiny_oscar: tuple[OscarSceneModel, str], tmp_path) -> None:
    model, path = tiny_oscar
    state = {k: v for k, v in model.state_dict().items() if k != "bert.img_embedding.weight"}
    broken = save_oscar_checkpoint(tmp_path / "no-img", state, tiny_oscar_config())
    with pytest.raises(ValueError, match=r"lacks 1 model keys.*bert\.img_embedding\.weight"):
        load_encoder("oscar", broken, device="cpu")
    lenient = load_encoder("oscar", broken, device="cpu", allow_missing_keys=True)
    assert lenient.load_report.missing_keys == ("bert.img_embedding.weight",)
    with pytest.raises(ValueError, match="no config.json"):
        load_encoder("oscar", str(tmp_path), device="cpu")

    # the same trunk stored as safetensors by save_pretrained loads to the same vectors
    model.save_pretrained(tmp_path / "safetensors")
    BertTokenizerFast.from_pretrained(minilm_path()).save_pretrained(tmp_path / "safetensors")
    from_safetensors = load_encoder("oscar", str(tmp_path / "safetensors"), device="cpu")
    assert from_safetensors.load_report.weights_file == "model.safetensors"
    from_bin = load_encoder("oscar", path, device="cpu")
    np.testing.assert_allclose(from_safetensors.encode_texts(["a dog"]), from_bin.encode_texts(["a dog"]), atol=1e-6)
    # the version names the weights, not the folder or the file format they were stored in
    assert from_safetensors.version.split(":")[-1] == from_bin.version.split(":")[-1]

    with pytest.raises(ValueError, match=r"images\[0\] has no region_features"):
        from_bin.encode_images([ImageInput(tags="dog")])
    with pytest.raises(ValueError, match=r"images\[0\] region_features has shape \(4, 2048\)"):
        from_bin.encode_images([ImageInput(region_features=np.zeros((4, 2048), np.float32))])
    with pytest.raises(ValueError, match="not a multiple of 2054"):
        from_bin.encode_images([ImageInput(region_features=np.zeros(2000, np.float32).tobytes())])
