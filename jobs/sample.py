"""The embedded default data: a generated sample in the real file formats, deterministic from a seed.

``erg sample`` writes a few hundred stylized captions in four styles and a few thousand factual captions over
shared scenes (subject, action, place), with a small PNG per image and its object tags, laid out as the real
corpora are: SentiCap json (positive/negative), FlickrStyle10K text files (humor/romantic, same images, line i =
image i), Flickr30K ``results.token`` and an MSCOCO ``captions`` json for the factual captions, and an image
manifest. With ``bad_rows`` it also plants malformed rows (counted in :data:`PLANTED_BAD_ROWS`), which ingest must
send to quarantine. ``erg ingest`` then reads the sample through the same readers as real data.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from jobs.platform.config import ErgConfig, IngestSource

SUBJECTS = ["dog", "cat", "man", "woman", "boy", "girl", "horse", "bird", "couple", "child"]
ACTIONS = [("running", "runs"), ("sitting", "sits"), ("playing", "plays"), ("jumping", "jumps"),
           ("walking", "walks"), ("standing", "stands")]
PLACES = ["beach", "park", "street", "snow", "grass", "water", "field", "garden"]
COLORS = {"red": (200, 40, 40), "blue": (40, 60, 200), "brown": (120, 80, 40), "white": (235, 235, 235),
          "black": (20, 20, 20), "yellow": (220, 200, 40)}
PLACE_RGB = {"beach": (230, 210, 150), "park": (60, 150, 60), "street": (110, 110, 110), "snow": (245, 245, 250),
             "grass": (80, 180, 70), "water": (50, 110, 200), "field": (170, 190, 80), "garden": (90, 160, 100)}

HUMOR_PHRASES = ["looking for his lost bone", "to escape from the tax collector", "like a clumsy superhero",
                 "dreaming of a giant pizza", "pretending to be a ninja", "hoping nobody saw the dance",
                 "as if it owns the place", "in search of free snacks"]
ROMANTIC_PHRASES = ["with the love of his life", "enjoying the warmth of true love", "dreaming of a sweet kiss",
                    "to meet the one he loves", "with joy and love in the air", "feeling the romance of the day",
                    "hand in hand with a lover", "under a sky full of love"]
POSITIVE_WORDS = ["cute", "beautiful", "happy", "lovely", "nice", "great", "adorable", "wonderful"]
NEGATIVE_WORDS = ["lonely", "dirty", "sad", "ugly", "bad", "gloomy", "miserable", "dull"]

#: malformed rows the sample plants when ``bad_rows`` is on: file -> count (all must reach quarantine)
PLANTED_BAD_ROWS = {"senticap": 3, "flickrstyle_humor": 3, "flickr30k": 1, "coco": 1}


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def factual_caption(rng: random.Random, subject: str, action: tuple[str, str], place: str, color: str) -> str:
    """A factual caption of a sample scene, one of its templates drawn by ``rng`` (the benchmarks use it too)."""
    ing, verb = action
    templates = [
        f"{_article(subject)} {subject} is {ing} on the {place}",
        f"{_article(color)} {color} {subject} {verb} in the {place}",
        f"there is {_article(subject)} {subject} {ing} near the {place}",
        f"the {subject} {verb} across the {place}",
        f"{_article(subject)} {subject} {ing} in the {place} during the day",
    ]
    return rng.choice(templates)


def sample_scene(index: int, rng: random.Random) -> dict:
    """The ``index``-th sample scene: its subject, action and place (by the index) and colour (drawn by ``rng``)."""
    subject = SUBJECTS[index % len(SUBJECTS)]
    action = ACTIONS[(index // len(SUBJECTS)) % len(ACTIONS)]
    place = PLACES[(index * 7 + index // 3) % len(PLACES)]
    color = rng.choice(list(COLORS))
    return {"subject": subject, "action": action, "place": place, "color": color}


def _draw(path: Path, scene: dict, size: int, rng: random.Random) -> None:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), PLACE_RGB[scene["place"]])
    draw = ImageDraw.Draw(img)
    s = size
    x0 = rng.randint(0, s // 3)
    y0 = rng.randint(s // 4, s // 2)
    shape = SUBJECTS.index(scene["subject"]) % 3
    box = [x0, y0, x0 + s // 2, y0 + s // 3]
    fill = COLORS[scene["color"]]
    (draw.ellipse if shape == 0 else draw.rectangle if shape == 1 else draw.pieslice)(
        box, *([0, 300] if shape == 2 else []), fill=fill)
    img.save(path, format="PNG")


def write_sample(cfg: ErgConfig) -> dict:
    """Write the sample under ``cfg.sample.dir``; returns counts. Same seed, same bytes."""
    sc = cfg.sample
    rng = random.Random(sc.seed)
    root = Path(sc.dir)
    (root / COMPLETE).unlink(missing_ok=True)
    for sub in ("senticap", "flickrstyle10k", "coco", "images"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    n_flickr = sc.n_images // 2
    images = []
    for i in range(sc.n_images):
        scene = sample_scene(i, rng)
        flickr = i < n_flickr
        name = f"{1000000 + i}_{rng.getrandbits(40):010x}.png" if flickr else f"COCO_val2014_{500000 + i:012d}.png"
        image_id = f"flickr30k:{1000000 + i}" if flickr else f"coco:{500000 + i}"
        _draw(root / "images" / name, scene, sc.image_size, rng)
        images.append({**scene, "name": name, "image_id": image_id, "flickr": flickr})
    with (root / "images.jsonl").open("w") as fh:
        for im in images:
            tags = f"{im['subject']} {im['place']} {im['color']}"
            fh.write(json.dumps({"image_id": im["image_id"], "uri": f"images/{im['name']}", "tags": tags,
                                 "width": sc.image_size, "height": sc.image_size}) + "\n")

    flickr_imgs = [im for im in images if im["flickr"]]
    coco_imgs = [im for im in images if not im["flickr"]]
    per_style = sc.stylized_per_style

    # FlickrStyle10K: humor and romantic captions for the same images, line i = image i
    styled = flickr_imgs[:per_style]
    humor, romantic = [], []
    for im in styled:
        base = factual_caption(rng, im["subject"], im["action"], im["place"], im["color"])
        humor.append(f"{base} {rng.choice(HUMOR_PHRASES)} .")
        romantic.append(f"{base} {rng.choice(ROMANTIC_PHRASES)} .")
    names = [im["name"] for im in styled]
    if sc.bad_rows:
        humor[1] = "   "                       # empty caption
        humor.append("a dog with no image in its list .")  # one line more than image names: unpaired (quarantined)
    (root / "flickrstyle10k" / "image_names_humor.txt").write_text("\n".join(names) + "\n")
    (root / "flickrstyle10k" / "image_names_romantic.txt").write_text("\n".join(names) + "\n")
    humor_bytes = [line.encode("utf-8") for line in humor]
    if sc.bad_rows:  # a latin-1 byte in a utf-8 file: bad encoding
        humor_bytes[2] = humor[2].replace(" the ", " the caf\u00e9 ", 1).encode("latin-1")
    (root / "flickrstyle10k" / "funny_train.txt").write_bytes(b"\r\n".join(humor_bytes) + b"\r\n")
    # romantic_train.txt is latin-1 in the real corpus: the sample is too (with a pound sign)
    romantic[0] = romantic[0].replace(" .", " worth every \u00a3 .")
    (root / "flickrstyle10k" / "romantic_train.txt").write_bytes(("\r\n".join(romantic) + "\r\n").encode("latin-1"))

    # Flickr30K factual captions for the flickr-like images
    per_image = max(1, sc.factual_captions // sc.n_images)
    token_lines = []
    for im in flickr_imgs:
        for k in range(per_image):
            token_lines.append(f"{im['name']}#{k}\t{factual_caption(rng, im['subject'], im['action'], im['place'], im['color'])} .")
    if sc.bad_rows:
        token_lines.insert(3, "this line has no image key and no tab")
    (root / "flickrstyle10k" / "factual_train.txt").write_text("\n".join(token_lines) + "\n")

    # SentiCap json: positive and negative sentences on the coco-like images
    senti_images = []
    for j, im in enumerate(coco_imgs[:per_style]):
        split = "test" if j % 10 == 0 else "val" if j % 10 == 1 else "train"
        subj, place = im["subject"], im["place"]
        ing = im["action"][0]
        pos, neg = rng.choice(POSITIVE_WORDS), rng.choice(NEGATIVE_WORDS)
        sentences = [
            {"raw": f"{_article(pos)} {pos} {subj} is {ing} on the {rng.choice(POSITIVE_WORDS)} {place}.", "sentiment": 1},
            {"raw": f"{_article(neg)} {neg} {subj} is {ing} on the {rng.choice(NEGATIVE_WORDS)} {place}.", "sentiment": 0},
        ]
        senti_images.append({"imgid": j, "split": split, "filename": im["name"], "sentences": sentences})
    if sc.bad_rows:
        senti_images[2]["sentences"].append({"raw": "", "sentiment": 1})                        # empty caption
        senti_images[3]["sentences"].append({"raw": "a dog of mixed feelings.", "sentiment": 2})  # unknown style
        senti_images.append({"imgid": 9999, "split": "train", "filename": "",
                             "sentences": [{"raw": "a caption without an image.", "sentiment": 0}]})  # missing id
    (root / "senticap" / "senticap.json").write_text(json.dumps({"images": senti_images}))

    # MSCOCO captions json: factual captions for the coco-like images
    annotations, ann_id = [], 1
    for im in coco_imgs:
        for _ in range(per_image):
            annotations.append({"id": ann_id, "image_id": int(im["image_id"].split(":")[1]),
                                "caption": factual_caption(rng, im["subject"], im["action"], im["place"], im["color"])})
            ann_id += 1
    if sc.bad_rows:
        annotations.append({"id": ann_id, "image_id": int(coco_imgs[0]["image_id"].split(":")[1]), "caption": " "})
    coco = {"images": [{"id": int(im["image_id"].split(":")[1]), "file_name": im["name"]} for im in coco_imgs],
            "annotations": annotations}
    (root / "coco" / "captions_sample.json").write_text(json.dumps(coco))
    (root / COMPLETE).write_text(f"seed {sc.seed}\n")
    return {"images": len(images), "stylized": len(humor) + len(romantic) + 2 * len(senti_images),
            "factual": len(token_lines) + len(annotations), "dir": str(root)}


def sample_sources(cfg: ErgConfig) -> list[IngestSource]:
    """The ingest sources that read the generated sample (used when ``ingest.sources`` is empty)."""
    root = Path(cfg.sample.dir)
    images = str(root / "images")
    fs = root / "flickrstyle10k"
    return [
        IngestSource(format="senticap_json", path=str(root / "senticap" / "senticap.json"), name="sample_senticap",
                     image_root=images),
        # the humor file has one planted line more than its image names: quarantined as unpaired, not an error
        IngestSource(format="flickrstyle", style="humor", path=str(fs / "funny_train.txt"),
                     image_names=str(fs / "image_names_humor.txt"), name="sample_flickrstyle", image_root=images,
                     on_misaligned="quarantine"),
        IngestSource(format="flickrstyle", style="romantic", path=str(fs / "romantic_train.txt"),
                     encoding="latin-1", image_names=str(fs / "image_names_romantic.txt"), name="sample_flickrstyle",
                     image_root=images),
        IngestSource(format="flickr30k_tokens", path=str(fs / "factual_train.txt"), name="sample_flickr30k",
                     image_root=images),
        IngestSource(format="coco_captions", path=str(root / "coco" / "captions_sample.json"), name="sample_coco",
                     image_root=images),
        IngestSource(format="image_manifest", path=str(root / "images.jsonl"), name="sample_images"),
    ]


#: written last by :func:`write_sample`: a sample without it was cut short (e.g. a killed run) and is written again
COMPLETE = "_SAMPLE_COMPLETE"


def sample_exists(cfg: ErgConfig) -> bool:
    return (Path(cfg.sample.dir) / COMPLETE).exists()
