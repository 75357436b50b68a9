"""Readers for the real formats of the caption corpora, into rows of the ingest tables (pandas, no Spark).

Each reader returns a :class:`ReadResult`: good rows for ``stylized_captions`` / ``factual_captions`` /
``images`` and the rejected ones for ``quarantine``, each with its reason and raw text: nothing is dropped
silently. Formats (as published):

- ``senticap_json``: ``{"images": [{"filename", "imgid", "split", "sentences": [{"raw", "sentiment" 1/0}]}]}``
- ``senticap_csv``: columns ``filename``, ``is_positive_sentiment`` (1/0), ``caption`` (+ optional ``split``)
- ``flickrstyle``: one caption per line (humor ``funny_train.txt`` / ``romantic_train.txt``), line i for image i
  of the image-names list (``image_names_*.txt`` or the pickled ``train_*.p``)
- ``flickr30k_tokens``: ``<image>.jpg#<k>\\t<caption>`` (results_20130124.token)
- ``coco_captions``: MSCOCO ``captions_*.json`` with ``images`` and ``annotations``
- ``coco_karpathy_refs``: a folder with ``image_ID.txt`` (filename\\tcoco id) and ``karpathy-refs-<k>.txt``
  (line i = reference k of image i), optionally ``visual-context_label.txt`` (object tags per image)
- ``image_manifest``: JSON lines ``{"image_id", "uri", "tags", "width", "height"}`` (the generated sample);
  a relative uri is taken relative to the manifest's folder

After reading, :func:`prepare` applies the paper's protocol (Sect. 4.1) to the rows of all sources together, and
counts everything it sets aside (nothing is dropped silently):

- **Splits, by image** (:func:`protocol_splits`; seed and counts in ``ingest.splits``, defaults = the paper).
  FlickrStyle10K (rows of format ``flickrstyle`` without a split of their source): the images are ranked by a
  hash of (seed, image id); the first ``min(1000, n // 7)`` are test, then 10% of the rest val, the others train:
  on the 7,000 public images 1,000 test / 600 val / 5,400 train, humor and romantic captions of one image in one
  split. SentiCap (``senticap_json`` / ``senticap_csv``): the official test split is kept; the official val
  images join train, and 100 non-test images per polarity (ranked the same way; at most a fifth of the images
  with that polarity, for small sets) move to val: 200 val images on the real data (an image is chosen for one
  polarity and takes all its captions along). This follows the ERG paper's "100 train images per polarity to
  val"; ADS-Cap instead keeps 100 of the official val images and moves the rest of val to train.
- **Duplicates**: a row whose natural key (``scene_id``: image, style and normalised caption; ``caption_id``)
  repeats an earlier row is counted (``duplicates``) and not written twice.
- **The factual corpus P excludes the stylized images**: a factual caption of an image that has stylized captions
  (in this read, or in ``known_stylized_images``) is not part of P; it is that image's scene description (textual
  visual context), kept in the ``descriptions`` array of its ``images`` row and counted as
  ``excluded_stylized_image``. FlickrStyle10K's own Flickr30K captions (``factual_train.txt``) are all such rows.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from models.text import normalize_caption

STYLIZED_COLUMNS = ["scene_id", "image_id", "image_uri", "caption", "style", "split", "source", "source_key"]
FACTUAL_COLUMNS = ["caption_id", "image_id", "image_uri", "caption", "source", "split"]
IMAGE_COLUMNS = ["image_id", "uri", "tags", "descriptions", "width", "height", "source"]
QUARANTINE_COLUMNS = ["quarantine_id", "source", "source_file", "line_no", "raw", "reason"]

_COCO_NAME = re.compile(r"COCO_\w+?_0*(\d+)\.\w+$")
_FLICKR_NAME = re.compile(r"^(\d+)(?:_[0-9a-f]+)?\.\w+$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


def stable_id(*parts: object, length: int = 20) -> str:
    return hashlib.sha1("\x1f".join(str(p) for p in parts).encode("utf-8")).hexdigest()[:length]


def scene_id(image_id: str, style: str, caption: str) -> str:
    """A scene is a stylized caption with its image: same image, style and (normalised) caption = same scene."""
    return stable_id("scene", image_id, style, normalize_caption(caption))


def image_id_from_name(name: str) -> str | None:
    """``COCO_val2014_000000389081.jpg`` -> ``coco:389081``; ``2513260012_03d33305cf.jpg`` -> ``flickr30k:2513260012``."""
    base = Path(str(name).strip()).name
    if (m := _COCO_NAME.search(base)):
        return f"coco:{int(m.group(1))}"
    if (m := _FLICKR_NAME.match(base)):
        return f"flickr30k:{m.group(1)}"
    return None


@dataclass
class ReadResult:
    stylized: list[dict] = field(default_factory=list)
    factual: list[dict] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)
    quarantine: list[dict] = field(default_factory=list)
    #: factual captions of stylized images (scene descriptions, not P): {"image_id", "caption_id", "caption", "source"}
    descriptions: list[dict] = field(default_factory=list)
    #: rows set aside by :func:`prepare` as repeats of an earlier row's natural key
    duplicates: list[dict] = field(default_factory=list)

    def reject(self, source: str, source_file: str, line_no: int | None, raw: object, reason: str) -> None:
        raw_text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False, default=str)
        self.quarantine.append({
            "quarantine_id": stable_id("quarantine", source, source_file, line_no, raw_text, reason),
            "source": source, "source_file": source_file, "line_no": line_no, "raw": raw_text, "reason": reason,
        })

    def extend(self, other: "ReadResult") -> None:
        for name in ("stylized", "factual", "images", "quarantine", "descriptions", "duplicates"):
            getattr(self, name).extend(getattr(other, name))

    def frames(self) -> dict[str, pd.DataFrame]:
        images = pd.DataFrame(self.images, columns=IMAGE_COLUMNS).drop(columns="descriptions")
        # one row per image; a row that carries tags or a uri wins over a bare one
        images = (images.assign(_bare=lambda d: d["tags"].isna().astype(int) + d["uri"].isna().astype(int))
                  .sort_values("_bare", kind="stable").drop_duplicates("image_id").drop(columns="_bare"))
        described: dict[str, list[str]] = {}
        for row in self.descriptions:
            described.setdefault(row["image_id"], []).append(row["caption"])
        images.insert(3, "descriptions", images["image_id"].map(described))
        return {
            "stylized_captions": pd.DataFrame(self.stylized, columns=STYLIZED_COLUMNS),
            "factual_captions": pd.DataFrame(self.factual, columns=FACTUAL_COLUMNS),
            "images": images,
            "quarantine": pd.DataFrame(self.quarantine, columns=QUARANTINE_COLUMNS),
        }

    def counts(self) -> dict[str, int]:
        """Rows per kind; ``read`` = every caption row the files gave (kept, duplicate, description or quarantined)."""
        counts = {name: len(getattr(self, name))
                  for name in ("stylized", "factual", "descriptions", "duplicates", "quarantine", "images")}
        counts["read"] = sum(counts[k] for k in ("stylized", "factual", "descriptions", "duplicates", "quarantine"))
        return counts


def _caption_problem(caption: object) -> str | None:
    if not isinstance(caption, str) or not caption.strip():
        return "empty caption"
    if _CONTROL.search(caption):
        return "bad encoding (control or replacement characters in caption)"
    return None


def _uri(image_root: str | None, name: str) -> str | None:
    return f"{image_root.rstrip('/')}/{Path(name).name}" if image_root else None


def _read_lines(path: Path, encoding: str, source: str, out: ReadResult) -> list[tuple[int, str | None]]:
    """Lines of a text file decoded one by one; a line that does not decode is quarantined (and kept as None)."""
    lines = []
    for no, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            lines.append((no, raw.decode(encoding)))
        except UnicodeDecodeError as exc:
            out.reject(source, str(path), no, raw.decode("latin-1"), f"bad encoding (not {encoding}: {exc.reason})")
            lines.append((no, None))
    return lines


class Reader:
    def __init__(self, styles: list[str], factual_label: str = "factual") -> None:
        self.styles = list(styles)
        self.factual_label = factual_label

    def _stylized(self, out: ReadResult, *, source: str, source_file: str, line_no: int | None, raw: object,
                  image_id: str | None, image_uri: str | None, caption: object, style: object, split: str | None,
                  source_key: str) -> None:
        if not image_id:
            out.reject(source, source_file, line_no, raw, "missing image id")
            return
        if (problem := _caption_problem(caption)):
            out.reject(source, source_file, line_no, raw, problem)
            return
        if style not in self.styles:
            out.reject(source, source_file, line_no, raw, f"unknown style {style!r} (allowed: {', '.join(self.styles)})")
            return
        caption = str(caption).strip()
        out.stylized.append({
            "scene_id": scene_id(image_id, style, caption), "image_id": image_id, "image_uri": image_uri,
            "caption": caption, "style": style, "split": split, "source": source, "source_key": source_key,
        })
        out.images.append({"image_id": image_id, "uri": image_uri, "tags": None, "width": None, "height": None,
                           "source": source})

    def _factual(self, out: ReadResult, *, source: str, source_file: str, line_no: int | None, raw: object,
                 image_id: str | None, image_uri: str | None, caption: object, split: str | None, key: str) -> None:
        if not image_id:
            out.reject(source, source_file, line_no, raw, "missing image id")
            return
        if (problem := _caption_problem(caption)):
            out.reject(source, source_file, line_no, raw, problem)
            return
        out.factual.append({"caption_id": f"{source}:{key}", "image_id": image_id, "image_uri": image_uri,
                            "caption": str(caption).strip(), "source": source, "split": split})
        out.images.append({"image_id": image_id, "uri": image_uri, "tags": None, "width": None, "height": None,
                           "source": source})

    # ------------------------------------------------------------------------------------------ formats
    def senticap_json(self, path: Path, *, source: str = "senticap", split: str | None = None,
                      image_root: str | None = None, **_: object) -> ReadResult:
        out = ReadResult()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            images = data["images"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a SentiCap json file ({{'images': [...]}}): {exc}") from exc
        for i, image in enumerate(images):
            if not isinstance(image, dict):
                out.reject(source, str(path), i, image, "malformed record (image entry is not an object)")
                continue
            name = image.get("filename") or ""
            image_id = image_id_from_name(name) if name else None
            for j, sentence in enumerate(image.get("sentences") or []):
                sentiment = sentence.get("sentiment") if isinstance(sentence, dict) else None
                style = {1: "positive", 0: "negative"}.get(sentiment, sentiment)
                self._stylized(out, source=source, source_file=str(path), line_no=i, raw={**image, "sentences": [sentence]},
                               image_id=image_id, image_uri=_uri(image_root, name), style=style,
                               caption=(sentence or {}).get("raw") if isinstance(sentence, dict) else None,
                               split=image.get("split", split), source_key=f"{name}#{j}")
        return out

    def senticap_csv(self, path: Path, *, source: str = "senticap", split: str | None = None,
                     image_root: str | None = None, encoding: str = "utf-8", **_: object) -> ReadResult:
        out = ReadResult()
        lines = _read_lines(path, encoding, source, out)
        text = "\n".join(line for _, line in lines if line is not None)
        numbers = [no for no, line in lines if line is not None]
        rows = csv.DictReader(io.StringIO(text))
        for i, row in enumerate(rows):
            line_no = numbers[i + 1] if i + 1 < len(numbers) else None
            name = (row.get("filename") or "").strip()
            raw_style = (row.get("is_positive_sentiment") or row.get("sentiment") or "").strip()
            style = {"1": "positive", "0": "negative"}.get(raw_style, raw_style or None)
            self._stylized(out, source=source, source_file=str(path), line_no=line_no, raw=dict(row),
                           image_id=image_id_from_name(name) if name else None, image_uri=_uri(image_root, name),
                           caption=row.get("caption") or row.get("sentence"), style=style,
                           split=(row.get("split") or split), source_key=f"{name}#{line_no}")
        return out

    def flickrstyle(self, path: Path, *, style: str, image_names: str, source: str = "flickrstyle10k",
                    split: str | None = None, image_root: str | None = None, encoding: str = "utf-8",
                    **_: object) -> ReadResult:
        out = ReadResult()
        names = _image_names(Path(image_names))
        lines = _read_lines(path, encoding, source, out)
        for (no, line) in lines:
            if line is None:
                continue
            name = names[no - 1] if no - 1 < len(names) else None
            if name is None:
                out.reject(source, str(path), no, line, f"missing image id (no line {no} in {image_names})")
                continue
            self._stylized(out, source=source, source_file=str(path), line_no=no, raw=line,
                           image_id=image_id_from_name(name), image_uri=_uri(image_root, name), caption=line,
                           style=style, split=split, source_key=f"{style}:{name}")
        return out

    def flickr30k_tokens(self, path: Path, *, source: str = "flickr30k", split: str | None = None,
                         image_root: str | None = None, encoding: str = "utf-8", **_: object) -> ReadResult:
        out = ReadResult()
        for no, line in _read_lines(path, encoding, source, out):
            if line is None:
                continue
            key, sep, caption = line.partition("\t")
            name, hash_, k = key.partition("#")
            if not sep or not hash_ or not k.strip().isdigit():
                out.reject(source, str(path), no, line, "malformed line (expected '<image>.jpg#<k>\\t<caption>')")
                continue
            image_id = image_id_from_name(name) if name.strip() else None
            self._factual(out, source=source, source_file=str(path), line_no=no, raw=line, image_id=image_id,
                          image_uri=_uri(image_root, name), caption=caption, split=split, key=key.strip())
        return out

    def coco_captions(self, path: Path, *, source: str = "coco", split: str | None = None,
                      image_root: str | None = None, **_: object) -> ReadResult:
        out = ReadResult()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            annotations = data["annotations"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not an MSCOCO captions json file (needs 'annotations'): {exc}") from exc
        names = {img.get("id"): img.get("file_name") for img in data.get("images", []) if isinstance(img, dict)}
        for i, ann in enumerate(annotations):
            if not isinstance(ann, dict):
                out.reject(source, str(path), i, ann, "malformed record (annotation is not an object)")
                continue
            coco_id = ann.get("image_id")
            image_id = f"coco:{int(coco_id)}" if isinstance(coco_id, int) or str(coco_id).isdigit() else None
            name = names.get(coco_id) or ""
            self._factual(out, source=source, source_file=str(path), line_no=i, raw=ann, image_id=image_id,
                          image_uri=_uri(image_root, name) if name else None, caption=ann.get("caption"),
                          split=split, key=str(ann.get("id", i)))
        return out

    def coco_karpathy_refs(self, path: Path, *, source: str = "coco_karpathy", split: str | None = "test",
                           image_root: str | None = None, encoding: str = "utf-8", **_: object) -> ReadResult:
        out = ReadResult()
        folder = Path(path)
        ids = []
        for no, line in _read_lines(folder / "image_ID.txt", encoding, source, out):
            name, _, coco_id = (line or "").partition("\t")
            ids.append((name.strip(), f"coco:{int(coco_id)}" if coco_id.strip().isdigit() else None))
        tags_file = folder.parent / "textual_visual_context" / "visual-context_label.txt"
        tags_file = folder / "visual-context_label.txt" if (folder / "visual-context_label.txt").exists() else tags_file
        tags = [t for _, t in _read_lines(tags_file, encoding, source, out)] if tags_file.exists() else []
        for ref_file in sorted(folder.glob("karpathy-refs-*.txt")):
            k = ref_file.stem.rsplit("-", 1)[-1]
            for no, line in _read_lines(ref_file, encoding, source, out):
                if line is None:
                    continue
                name, image_id = ids[no - 1] if no - 1 < len(ids) else ("", None)
                self._factual(out, source=source, source_file=str(ref_file), line_no=no, raw=line,
                              image_id=image_id, image_uri=_uri(image_root, name) if name else None, caption=line,
                              split=split, key=f"{image_id}#{k}")
        tagged = [{"image_id": image_id, "uri": _uri(image_root, name) if name else None, "tags": tags[i].strip(),
                   "width": None, "height": None, "source": source}
                  for i, (name, image_id) in enumerate(ids) if image_id and i < len(tags) and tags[i]]
        out.images = tagged + out.images
        return out

    def image_manifest(self, path: Path, *, source: str = "sample", **_: object) -> ReadResult:
        out = ReadResult()
        for no, line in _read_lines(path, "utf-8", source, out):
            if not line or not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                out.reject(source, str(path), no, line, "malformed line (not JSON)")
                continue
            if not rec.get("image_id"):
                out.reject(source, str(path), no, line, "missing image id")
                continue
            uri = rec.get("uri")
            if uri and "://" not in uri and not uri.startswith("/"):  # relative to the manifest's folder
                uri = str(path.parent / uri)
            out.images.append({"image_id": rec["image_id"], "uri": uri, "tags": rec.get("tags"),
                               "width": rec.get("width"), "height": rec.get("height"), "source": source})
        return out

    def read(self, fmt: str, path: str | Path, **options: object) -> ReadResult:
        reader = getattr(self, fmt, None)
        if reader is None or fmt.startswith("_") or fmt == "read":
            raise ValueError(f"unknown ingest format {fmt!r}")
        options = {k: v for k, v in options.items() if v is not None}
        if "name" in options:
            options["source"] = options.pop("name")
        return reader(Path(path), **options)


def _image_names(path: Path) -> list[str]:
    if path.suffix == ".p":
        with path.open("rb") as fh:
            return [str(n) for n in pickle.load(fh, encoding="latin1")]
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------------------------ the protocol
#: the split recipe of each stylized format (the rows a reader of that format gives)
SPLIT_RECIPES = {"flickrstyle": "flickrstyle", "senticap_json": "senticap", "senticap_csv": "senticap"}
ORIGIN = "_origin"  #: row key naming the source a row came from (set by :func:`tag_rows`, not a table column)
RECIPE = "_split_recipe"  #: row key naming the row's split recipe (set by :func:`tag_rows`)


def tag_rows(result: ReadResult, origin: str, fmt: str) -> ReadResult:
    """Mark every row of ``result`` with the source it came from and its format's split recipe (for :func:`prepare`)."""
    for name in ("stylized", "factual", "quarantine", "images"):
        for row in getattr(result, name):
            row[ORIGIN] = origin
    for row in result.stylized:
        row[RECIPE] = SPLIT_RECIPES.get(fmt)
    return result


def _ranked(image_ids, seed: int) -> list[str]:
    """Image ids in a fixed pseudo-random order: by a hash of (seed, image id), independent of input order."""
    return sorted(set(image_ids), key=lambda i: (stable_id("split", seed, i), i))


def flickrstyle_splits(image_ids, *, seed: int, test_images: int = 1000, val_fraction: float = 0.1) -> dict[str, str]:
    """FlickrStyle10K by image (paper Sect. 4.1): ``min(test_images, n // 7)`` test, ``val_fraction`` of the rest
    val, the others train; on the 7,000 public images 1,000 / 600 / 5,400."""
    ranked = _ranked(image_ids, seed)
    n_test = min(test_images, len(ranked) // 7)
    rest = ranked[n_test:]
    n_val = int(round(val_fraction * len(rest)))
    return {**{i: "test" for i in ranked[:n_test]}, **{i: "val" for i in rest[:n_val]},
            **{i: "train" for i in rest[n_val:]}}


def senticap_splits(rows: pd.DataFrame, *, seed: int, val_images_per_style: int = 100) -> dict[str, str]:
    """SentiCap by image: ``rows`` has ``image_id``, ``style``, ``split`` (the official one).

    An image with an official test caption is test. The other images (official train and val) form the pool; per
    polarity (in sorted order) ``min(val_images_per_style, pool images with it // 5)`` pool images not chosen yet,
    ranked by a hash of (seed, image id), move to val; the rest are train. ``val_images_per_style=0`` keeps the
    official splits.
    """
    if rows.empty:
        return {}
    if val_images_per_style <= 0:
        return rows.groupby("image_id")["split"].agg(lambda s: _most_held_out(s.dropna())).to_dict()
    test = set(rows.loc[rows["split"] == "test", "image_id"])
    pool = rows[~rows["image_id"].isin(test)]
    styles_of = pool.groupby("image_id")["style"].agg(set).to_dict()
    ranked = _ranked(styles_of, seed)
    val: set[str] = set()
    for style in sorted(set(pool["style"])):
        having = [i for i in ranked if style in styles_of[i]]
        n = min(val_images_per_style, len(having) // 5)
        val.update([i for i in having if i not in val][:n])
    return {**{i: "test" for i in test}, **{i: ("val" if i in val else "train") for i in styles_of}}


def _most_held_out(splits: pd.Series) -> str | None:
    for split in ("test", "val", "train"):
        if (splits == split).any():
            return split
    return splits.iloc[0] if len(splits) else None


def protocol_splits(stylized: list[dict], *, seed: int = 2021, flickrstyle_test_images: int = 1000,
                    flickrstyle_val_fraction: float = 0.1, senticap_val_images_per_style: int = 100) -> dict[str, int]:
    """Set ``split`` on the stylized rows (in place) by their recipe (:data:`RECIPE`); returns how many were set.

    ``flickrstyle`` rows without a split get :func:`flickrstyle_splits` over all such images together (humor and
    romantic captions of one image: one split); ``senticap`` rows get :func:`senticap_splits`. Rows of other
    formats, or flickrstyle rows whose source gave a split, keep theirs.
    """
    changed = {"flickrstyle": 0, "senticap": 0}
    flickr = [r for r in stylized if r.get(RECIPE) == "flickrstyle" and r.get("split") is None]
    if flickr:
        by_image = flickrstyle_splits([r["image_id"] for r in flickr], seed=seed, test_images=flickrstyle_test_images,
                                      val_fraction=flickrstyle_val_fraction)
        for r in flickr:
            r["split"] = by_image[r["image_id"]]
        changed["flickrstyle"] = len(flickr)
    senti = [r for r in stylized if r.get(RECIPE) == "senticap"]
    if senti:
        frame = pd.DataFrame([{k: r.get(k) for k in ("image_id", "style", "split")} for r in senti])
        by_image = senticap_splits(frame, seed=seed, val_images_per_style=senticap_val_images_per_style)
        for r in senti:
            changed["senticap"] += r["split"] != by_image[r["image_id"]]
            r["split"] = by_image[r["image_id"]]
    return changed


def _drop_duplicates(rows: list[dict], key: str, out: list[dict]) -> list[dict]:
    seen: set[str] = set()
    kept = []
    for row in rows:
        if row[key] in seen:
            out.append({**row, "duplicate_of": row[key]})
        else:
            seen.add(row[key])
            kept.append(row)
    return kept


def prepare(result: ReadResult, splits: object | None = None,
            known_stylized_images: set[str] | frozenset[str] = frozenset()) -> ReadResult:
    """The paper's protocol on the rows of every source (see the module docstring), in place; returns ``result``.

    ``splits``: an object with the :class:`jobs.config.SplitConf` fields (None = the paper's defaults).
    Duplicates go to ``result.duplicates``; factual rows of stylized images to ``result.descriptions``.
    """
    options = {k: getattr(splits, k) for k in ("seed", "flickrstyle_test_images", "flickrstyle_val_fraction",
                                               "senticap_val_images_per_style")} if splits is not None else {}
    result.stylized = _drop_duplicates(result.stylized, "scene_id", result.duplicates)
    result.factual = _drop_duplicates(result.factual, "caption_id", result.duplicates)
    protocol_splits(result.stylized, **options)
    stylized_images = set(known_stylized_images) | {r["image_id"] for r in result.stylized}
    kept = []
    for row in result.factual:
        if row["image_id"] in stylized_images:
            result.descriptions.append({k: row.get(k) for k in ("image_id", "caption_id", "caption", "source", ORIGIN)})
        else:
            kept.append(row)
    result.factual = kept
    return result


def origin_counts(result: ReadResult) -> dict[str, dict[str, int]]:
    """Per source (:data:`ORIGIN`): stylized, factual, descriptions, duplicates (by kind), quarantine and ``read``,
    where read = stylized + factual + descriptions + duplicates + quarantine."""
    counts: dict[str, dict[str, int]] = {}

    def bump(origin: str | None, name: str) -> None:
        bucket = counts.setdefault(origin or "unknown", {k: 0 for k in (
            "read", "stylized", "factual", "descriptions", "duplicates", "stylized_duplicates", "factual_duplicates",
            "quarantine")})
        bucket[name] += 1

    for name in ("stylized", "factual", "descriptions", "quarantine"):
        for row in getattr(result, name):
            bump(row.get(ORIGIN), name)
            bump(row.get(ORIGIN), "read")
    for row in result.duplicates:
        bump(row.get(ORIGIN), "duplicates")
        bump(row.get(ORIGIN), "stylized_duplicates" if "scene_id" in row else "factual_duplicates")
        bump(row.get(ORIGIN), "read")
    for origin, n in pd.Series([row.get(ORIGIN) for row in result.images], dtype=object).value_counts().items():
        if origin in counts:
            counts[origin]["images"] = int(n)
    return counts
