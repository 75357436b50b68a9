"""Readers for the real formats of the caption corpora, into rows of the ingest tables (pandas, no Spark).

Each reader returns a :class:`ReadResult`: good rows for ``stylized_captions`` / ``factual_captions`` /
``images`` and the rejected ones for ``quarantine``, each with its reason and raw text: nothing is dropped
silently. Formats (as published):

- ``senticap_json``: ``{"images": [{"filename", "imgid", "split", "sentences": [{"raw", "sentiment" 1/0}]}]}``
- ``senticap_csv``: a header naming ``filename``, ``is_positive_sentiment`` (1/0; or ``sentiment``), ``caption``
  (or ``sentence``) and optionally ``split``; then one caption per line
- ``flickrstyle``: one caption per line (humor ``funny_train.txt`` / ``romantic_train.txt``), line i for image i
  of the image-names list (``image_names_*.txt`` or the pickled ``train_*.p``; several lists must agree)
- ``flickr30k_tokens``: ``<image>.jpg#<k>\\t<caption>`` (results_20130124.token)
- ``coco_captions``: MSCOCO ``captions_*.json`` with ``images`` and ``annotations``
- ``coco_karpathy_refs``: a folder with ``image_ID.txt`` (filename\\tcoco id) and ``karpathy-refs-<k>.txt``
  (line i = reference k of image i), optionally ``visual-context_label.txt`` (object tags per image) and beside it
  ``visual-context.txt`` (the label classifier's mean confidence in them, a number in [0, 1] per image)
- ``image_manifest``: JSON lines ``{"image_id", "uri", "tags", "width", "height"}`` and optionally
  ``"tags_confidence"`` (the generated sample);
  a relative uri is taken relative to the manifest's folder

**Every record accounted for.** A record is one caption (a line of a text format, a sentence or annotation of a
json format, a line of an image manifest). Each reader counts the records it reads (``ReadResult.read``,
independently of where they go), and each record ends up in exactly one place: kept (a row, or a scene
description), quarantined (with its reason and raw text), or a duplicate of an earlier record's natural key
(:func:`prepare`); :func:`origin_counts` checks ``read = kept + quarantined + duplicates`` per source. A file that
cannot be read as its format at all (not found, not JSON, not a pickled list, UTF-16 or binary where text is
expected, a CSV without its header) raises :class:`readers.errors.InputFileError` naming the file and the problem.

**Alignment.** Formats that pair files by position (FlickrStyle captions with the image names, several name lists
with each other, the Karpathy references and tags with ``image_ID.txt``) first compare the files' line counts
(blank lines at the very end of a file do not count; they are quarantined): a mismatch raises an error naming
both files and both counts, so that a missing line cannot shift every later caption onto the wrong image; with
``on_misaligned: quarantine`` on the source, the unpaired lines are quarantined with the reason instead (the lines
before them are paired as they stand).

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
  repeats an earlier row is counted (``duplicates``) and not written twice. A factual row whose ``caption_id``
  repeats an earlier row's with a different caption is a conflict: it is quarantined with the reason.
- **The factual corpus P excludes the stylized images**: a factual caption of an image that has stylized captions
  (in this read, or in ``known_stylized_images``) is not part of P; it is that image's scene description (textual
  visual context), kept in the ``descriptions`` array of its ``images`` row and counted as
  ``excluded_stylized_image``. FlickrStyle10K's own Flickr30K captions (``factual_train.txt``) are all such rows.
"""
from __future__ import annotations

import codecs
import csv
import hashlib
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pandas as pd

from models.text import normalize_caption
from readers.errors import InputFileError

STYLIZED_COLUMNS = ["scene_id", "image_id", "image_uri", "caption", "style", "split", "source", "source_key"]
FACTUAL_COLUMNS = ["caption_id", "image_id", "image_uri", "caption", "source", "split"]
IMAGE_COLUMNS = ["image_id", "uri", "tags", "descriptions", "width", "height", "source", "tags_confidence"]
QUARANTINE_COLUMNS = ["quarantine_id", "source", "source_file", "line_no", "raw", "reason"]
SPLITS = ("train", "val", "test")
#: a longer "caption" is a broken file (e.g. lines run together), not a caption; the real corpora's longest is 487
MAX_CAPTION_CHARS = 1000
#: how a source handles files paired by position whose line counts differ (``IngestSource.on_misaligned``)
MISALIGNED = ("error", "quarantine")
#: row keys that locate a row in its input (not table columns): file, line or record number, raw text
LOCATION = "_location"
RECORD = "_record"  #: marks an ``images`` row that is a record of its own (an image manifest line), not derived

_COCO_NAME = re.compile(r"COCO_\w+?_0*(\d+)\.\w+$")
_FLICKR_NAME = re.compile(r"^(\d+)(?:_[0-9a-f]+)?\.\w+$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffd]")
_RAW_CHARS = 2000  # raw text kept on a quarantine row


def stable_id(*parts: object, length: int = 20) -> str:
    return hashlib.sha1("\x1f".join(str(p) for p in parts).encode("utf-8")).hexdigest()[:length]


def scene_id(image_id: str, style: str, caption: str) -> str:
    """A scene is a stylized caption with its image: same image, style and (normalised) caption = same scene."""
    return stable_id("scene", image_id, style, normalize_caption(caption))


def image_id_from_name(name: str) -> str | None:
    """``COCO_val2014_000000389081.jpg`` -> ``coco:389081``; ``2513260012_03d33305cf.jpg`` -> ``flickr30k:2513260012``."""
    if not isinstance(name, str):
        return None
    base = Path(name.strip()).name
    if (m := _COCO_NAME.search(base)) and m.group(1).isascii():
        return f"coco:{int(m.group(1))}"
    if (m := _FLICKR_NAME.match(base)) and m.group(1).isascii():
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
    #: rows set aside by :func:`prepare` (or a reader) as repeats of an earlier row's natural key
    duplicates: list[dict] = field(default_factory=list)
    #: records read, counted by the reader as it reads them (see the module docstring)
    read: int = 0
    #: records read per source (:data:`ORIGIN`), set by :func:`tag_rows`
    read_by_origin: dict[str, int] = field(default_factory=dict)

    def reject(self, source: str, source_file: str, line_no: int | None, raw: object, reason: str,
               record: int | None = None) -> None:
        """Quarantine one record; ``record`` tells apart records that share a line (sentences of one json entry)."""
        if isinstance(raw, bytes):
            raw = raw.decode("latin-1")
        raw_text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False, default=str)
        raw_text = raw_text[:_RAW_CHARS] + ("..." if len(raw_text) > _RAW_CHARS else "")
        where = (line_no,) if record is None else (line_no, record)
        self.quarantine.append({
            "quarantine_id": stable_id("quarantine", source, source_file, *where, raw_text, reason),
            "source": source, "source_file": source_file, "line_no": line_no, "raw": raw_text, "reason": reason,
        })

    def extend(self, other: "ReadResult") -> None:
        for name in ("stylized", "factual", "images", "quarantine", "descriptions", "duplicates"):
            getattr(self, name).extend(getattr(other, name))
        self.read += other.read
        for origin, n in other.read_by_origin.items():
            self.read_by_origin[origin] = self.read_by_origin.get(origin, 0) + n

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
        """Rows per kind, ``read`` (records the readers counted) and ``unaccounted`` (read - kept - quarantined -
        duplicates; 0 unless a record was lost)."""
        counts = {name: len(getattr(self, name))
                  for name in ("stylized", "factual", "descriptions", "duplicates", "quarantine", "images")}
        counts["read"] = self.read
        counts["unaccounted"] = self.read - sum(counts[k] for k in ("stylized", "factual", "descriptions",
                                                                   "duplicates", "quarantine")) - sum(
            1 for row in self.images if row.get(RECORD))
        return counts



def _caption_problem(caption: object) -> str | None:
    if caption is None or (isinstance(caption, str) and not caption.strip()):
        return "empty caption"
    if not isinstance(caption, str):
        return f"wrong type (caption is {type(caption).__name__}, not text)"
    if _CONTROL.search(caption):
        return "bad encoding (control or replacement characters in caption)"
    if len(caption) > MAX_CAPTION_CHARS:
        return f"caption too long ({len(caption)} characters; at most {MAX_CAPTION_CHARS})"
    return None


def _split_problem(split: object) -> str | None:
    if split is None or split in SPLITS:
        return None
    return f"unknown split {split!r} (allowed: {', '.join(SPLITS)})"


def _uri(image_root: str | None, name: object) -> str | None:
    return f"{image_root.rstrip('/')}/{Path(name).name}" if image_root and isinstance(name, str) and name else None


# ------------------------------------------------------------------------------------------ files
@dataclass
class Line:
    """One line of a text file: its number (from 1), its text (None when it did not decode), its raw bytes."""
    no: int
    text: str | None
    raw: bytes
    problem: str | None = None


def _read_bytes(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file ({what})",
                             "fix the path in ingest.sources (conf) or put the file there") from None
    except IsADirectoryError:
        raise InputFileError(f"{path}: is a folder, not a file ({what})", "name the file in ingest.sources") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot be read ({exc.strerror or exc})", "check the file's permissions") from None


def _wide_encoding(encoding: str) -> bool:
    return codecs.lookup(encoding).name.startswith(("utf-16", "utf-32"))


def _check_text(path: Path, data: bytes, encoding: str) -> None:
    """Reject a file that is not text in ``encoding`` as a whole: UTF-16/32 or binary where text is expected."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise InputFileError(f"{path}: unknown encoding {encoding!r}",
                             "set encoding on the source to one Python knows, e.g. utf-8 or latin-1") from None
    if _wide_encoding(encoding):
        return
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise InputFileError(f"{path}: is UTF-16 text (it starts with a UTF-16 byte-order mark), not {encoding}",
                             f"convert it to {encoding}, or set encoding: utf-16 on the source")
    head = data[:4096]
    if head and head.count(0) > len(head) // 10:
        raise InputFileError(f"{path}: is not {encoding} text ({head.count(0)} of its first {len(head)} bytes "
                             "are NUL: UTF-16 or a binary file)", "give the text file, or the encoding it is in")


def read_lines(path: Path, encoding: str = "utf-8", what: str = "text file") -> list[Line]:
    """Every line of a text file (lines end at \\n, \\r\\n or \\r), each decoded on its own: a line that does not
    decode has ``text`` None and a ``problem``. A UTF-8 byte-order mark at the start is dropped."""
    data = _read_bytes(path, what)
    _check_text(path, data, encoding)
    if _wide_encoding(encoding):
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise InputFileError(f"{path}: is not {encoding} text ({exc.reason} at byte {exc.start})",
                                 "set the source's encoding to the file's") from None
        return [Line(no, part, part.encode("utf-8")) for no, part in
                enumerate(re.split(r"\r\n|\r|\n", text.removesuffix("\n").removesuffix("\r")) if text else [], 1)]
    if data.startswith(codecs.BOM_UTF8) and codecs.lookup(encoding).name in ("utf-8", "utf-8-sig"):
        data = data[len(codecs.BOM_UTF8):]
    lines = []
    for no, raw in enumerate(data.splitlines(), start=1):
        try:
            lines.append(Line(no, raw.decode(encoding), raw))
        except UnicodeDecodeError as exc:
            lines.append(Line(no, None, raw, f"bad encoding (not {encoding}: {exc.reason})"))
    return lines


def trailing_blank(lines: list[Line]) -> tuple[list[Line], list[Line]]:
    """``lines`` split into (lines up to the last non-blank one, the blank lines after it)."""
    end = len(lines)
    while end and lines[end - 1].text is not None and not lines[end - 1].text.strip():
        end -= 1
    return lines[:end], lines[end:]


def _load_json(path: Path, what: str) -> object:
    data = _read_bytes(path, what)
    _check_text(path, data, "utf-8")
    try:
        return json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start}), so not a {what}",
                             "give the file in UTF-8, as JSON is") from None
    except json.JSONDecodeError as exc:
        cut_short = exc.msg.startswith("Unterminated string") or exc.pos >= len(exc.doc.rstrip()) - 1
        cut = " (the file looks cut short)" if cut_short else ""
        raise InputFileError(f"{path}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}{cut}",
                             f"give a complete {what}") from None
    except RecursionError:
        raise InputFileError(f"{path}: JSON nested too deeply to read", f"give a {what}") from None


class _NamesUnpickler(pickle.Unpickler):
    """Unpickles plain data only (lists, tuples, strings): a pickle that names a class or function is refused, so
    reading a name list never runs code from the file."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a name list holds strings only")


def _pickled_names(path: Path) -> list[str]:
    data = _read_bytes(path, "pickled image-name list")
    import io

    try:
        names = _NamesUnpickler(io.BytesIO(data), encoding="latin1").load()
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad file
        raise InputFileError(f"{path}: not a pickled list of image names ({type(exc).__name__}: {exc})",
                             "give the .p file as published (a Python-2 pickle of a list of file names) or the "
                             ".txt name list") from None
    if not isinstance(names, (list, tuple)):
        raise InputFileError(f"{path}: the pickle holds a {type(names).__name__}, not a list of image names",
                             "give the name list as published")
    return [n.decode("latin-1") if isinstance(n, bytes) else n if isinstance(n, str) else None for n in names]


@dataclass
class Paired:
    """What :func:`check_paired` found: ``n`` positions paired; the unpaired line numbers of each file."""
    n: int
    extra_first: range
    extra_second: range


def check_paired(first: Path, n_first: int, second: Path, n_second: int, on_misaligned: str = "error",
                 what: str = "lines") -> Paired:
    """Two files whose lines pair by position: equal counts, or :class:`InputFileError` naming both files and both
    counts (with ``on_misaligned='quarantine'``: the unpaired line numbers of the longer file, for the caller to
    quarantine with :func:`unpaired_reason`)."""
    if on_misaligned not in MISALIGNED:
        raise ValueError(f"on_misaligned must be one of {MISALIGNED}, got {on_misaligned!r}")
    if n_first != n_second and on_misaligned == "error":
        raise InputFileError(
            f"{first} has {n_first} {what} but {second} has {n_second}: they pair line by line, so a missing or "
            f"extra line would shift every later line onto the wrong image",
            "fix the files so that the counts match, or set on_misaligned: quarantine on this source to quarantine "
            "the unpaired lines")
    n = min(n_first, n_second)
    return Paired(n, range(n + 1, n_first + 1), range(n + 1, n_second + 1))


def unpaired_reason(path: Path, other: Path, n_path: int, n_other: int) -> str:
    return (f"unpaired line (misaligned: {Path(path).name} has {n_path} lines, {Path(other).name} has {n_other}; "
            "no line to pair it with)")


class Reader:
    def __init__(self, styles: list[str], factual_label: str = "factual") -> None:
        self.styles = list(styles)
        self.factual_label = factual_label

    @staticmethod
    def _located(row: dict, source_file: str, line_no: int | None, raw: object) -> dict:
        raw_text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False, default=str)
        row[LOCATION] = {"file": source_file, "line": line_no, "raw": raw_text[:_RAW_CHARS]}
        return row

    def _stylized(self, out: ReadResult, *, source: str, source_file: str, line_no: int | None, raw: object,
                  image_id: str | None, image_uri: str | None, caption: object, style: object, split: object,
                  source_key: str, record: int | None = None) -> None:
        problem = ("missing image id" if not image_id else _caption_problem(caption) or (
            None if isinstance(style, str) and style in self.styles
            else f"unknown style {style!r} (allowed: {', '.join(self.styles)})") or _split_problem(split))
        if problem:
            out.reject(source, source_file, line_no, raw, problem, record)
            return
        caption = str(caption).strip()
        out.stylized.append(self._located({
            "scene_id": scene_id(image_id, style, caption), "image_id": image_id, "image_uri": image_uri,
            "caption": caption, "style": style, "split": split, "source": source, "source_key": source_key,
        }, source_file, line_no, raw))
        out.images.append({"image_id": image_id, "uri": image_uri, "tags": None, "width": None, "height": None,
                           "source": source})

    def _factual(self, out: ReadResult, *, source: str, source_file: str, line_no: int | None, raw: object,
                 image_id: str | None, image_uri: str | None, caption: object, split: object, key: str) -> None:
        if not image_id:
            out.reject(source, source_file, line_no, raw, "missing image id")
            return
        if (problem := _caption_problem(caption)):
            out.reject(source, source_file, line_no, raw, problem)
            return
        if (problem := _split_problem(split)):
            out.reject(source, source_file, line_no, raw, problem)
            return
        out.factual.append(self._located({"caption_id": f"{source}:{key}", "image_id": image_id,
                                          "image_uri": image_uri, "caption": str(caption).strip(), "source": source,
                                          "split": split}, source_file, line_no, raw))
        out.images.append({"image_id": image_id, "uri": image_uri, "tags": None, "width": None, "height": None,
                           "source": source})

    @staticmethod
    def _trailing(out: ReadResult, source: str, path: Path, blank: list[Line]) -> None:
        for line in blank:
            out.read += 1
            out.reject(source, str(path), line.no, line.raw, "empty line (at the end of the file)")

    # ------------------------------------------------------------------------------------------ formats
    def senticap_json(self, path: Path, *, source: str = "senticap", split: str | None = None,
                      image_root: str | None = None, **_: object) -> ReadResult:
        out = ReadResult()
        what = "SentiCap json file ({'images': [...]})"
        data = _load_json(path, what)
        images = data.get("images") if isinstance(data, dict) else None
        if not isinstance(images, list):
            found = f"a {type(data).__name__}" if not isinstance(data, dict) else \
                "no 'images' key" if "images" not in data else f"'images' is a {type(images).__name__}"
            raise InputFileError(f"{path}: not a {what}: found {found}", "give the SentiCap json as published")
        for i, image in enumerate(images):
            if not isinstance(image, dict):
                out.read += 1
                out.reject(source, str(path), i, image, "malformed record (image entry is not an object)")
                continue
            sentences = image.get("sentences")
            if not isinstance(sentences, list):
                out.read += 1
                out.reject(source, str(path), i, image, "malformed record (image entry has no 'sentences' list)")
                continue
            name = image.get("filename")
            image_id = image_id_from_name(name) if isinstance(name, str) and name else None
            image_split = image.get("split", split)
            for j, sentence in enumerate(sentences):
                out.read += 1
                raw = {**image, "sentences": [sentence]}
                if not isinstance(sentence, dict):
                    out.reject(source, str(path), i, raw, "malformed record (sentence is not an object)", j)
                    continue
                sentiment = sentence.get("sentiment")
                style = ({1: "positive", 0: "negative"}.get(sentiment, sentiment)
                         if isinstance(sentiment, (int, str)) and not isinstance(sentiment, bool) else sentiment)
                self._stylized(out, source=source, source_file=str(path), line_no=i, raw=raw,
                               image_id=image_id, image_uri=_uri(image_root, name), style=style,
                               caption=sentence.get("raw"), split=image_split, source_key=f"{name}#{j}", record=j)
        return out

    def senticap_csv(self, path: Path, *, source: str = "senticap", split: str | None = None,
                     image_root: str | None = None, encoding: str = "utf-8", **_: object) -> ReadResult:
        out = ReadResult()
        lines = read_lines(path, encoding, "SentiCap csv file")
        header = None
        if lines and lines[0].text is not None:
            try:
                header = [h.strip().lower() for h in next(csv.reader([lines[0].text], strict=True))]
            except (csv.Error, StopIteration):
                header = None
        needs = ("filename", "caption|sentence", "is_positive_sentiment|sentiment")
        if header is None or not all(any(n in header for n in need.split("|")) for need in needs) \
                or len(set(header)) != len(header):
            found = "an empty file" if not lines else f"line 1: {(lines[0].text or lines[0].raw.decode('latin-1'))[:120]!r}"
            raise InputFileError(f"{path}: not a SentiCap csv file: line 1 must be a header naming filename, "
                                 f"is_positive_sentiment (or sentiment) and caption (or sentence); found {found}",
                                 "give the csv with its header line")
        body, blank = trailing_blank(lines[1:])
        for line in body:
            out.read += 1
            if line.text is None:
                out.reject(source, str(path), line.no, line.raw, line.problem)
                continue
            if not line.text.strip():
                out.reject(source, str(path), line.no, line.text, "empty line")
                continue
            try:
                fields = next(csv.reader([line.text], strict=True))
            except (csv.Error, StopIteration) as exc:
                out.reject(source, str(path), line.no, line.text, f"malformed line (csv: {exc})")
                continue
            if len(fields) != len(header):
                out.reject(source, str(path), line.no, line.text,
                           f"malformed line ({len(fields)} fields; the header has {len(header)})")
                continue
            row = dict(zip(header, fields))
            name = row.get("filename", "").strip()
            raw_style = (row.get("is_positive_sentiment") or row.get("sentiment") or "").strip()
            style = {"1": "positive", "0": "negative"}.get(raw_style, raw_style or None)
            self._stylized(out, source=source, source_file=str(path), line_no=line.no, raw=line.text,
                           image_id=image_id_from_name(name) if name else None, image_uri=_uri(image_root, name),
                           caption=row.get("caption") or row.get("sentence"), style=style,
                           split=(row.get("split") or "").strip() or split, source_key=f"{name}#{line.no}")
        self._trailing(out, source, path, blank)
        return out

    def _image_names(self, files: list[Path], on_misaligned: str, out: ReadResult,
                     source: str) -> list[tuple[str | None, str | None]]:
        """(name, problem) per position of the image-name list(s); several lists must agree position by position."""
        lists = []
        for path in files:
            if path.suffix == ".p":
                names = [(n.strip() if isinstance(n, str) else None,
                          None if isinstance(n, str) and n.strip() else f"entry {i} of {path.name} is not a file name")
                         for i, n in enumerate(_pickled_names(path), start=1)]
            else:
                lines, _ = trailing_blank(read_lines(path, "utf-8", "image-name list"))
                names = [(line.text.strip() if line.text and line.text.strip() else None,
                          None if line.text and line.text.strip() else
                          f"line {line.no} of {path.name} is {'empty' if line.text is not None else 'not utf-8'}")
                         for line in lines]
            lists.append((path, names))
        first_path, first = lists[0]
        for path, names in lists[1:]:
            paired = check_paired(first_path, len(first), path, len(names), on_misaligned, "image names")
            for i in range(paired.n):
                a, b = image_id_from_name(first[i][0] or ""), image_id_from_name(names[i][0] or "")
                if a != b and first[i][1] is None:
                    if on_misaligned == "error":
                        raise InputFileError(
                            f"{first_path} and {path} disagree at line {i + 1}: {first[i][0]!r} vs {names[i][0]!r}",
                            "give name lists of the same images in the same order, or set on_misaligned: quarantine "
                            "on this source to quarantine the captions where they disagree")
                    first[i] = (None, f"the image name lists disagree at line {i + 1}: {first[i][0]!r} in "
                                      f"{first_path.name}, {names[i][0]!r} in {path.name}")
            for i in paired.extra_first:  # positions the other list lacks: no agreed image
                first[i - 1] = (None, unpaired_reason(first_path, path, len(first), len(names)))
            for i in paired.extra_second:  # names only the other list has: quarantined as unpaired
                out.read += 1
                out.reject(source, str(path), i, names[i - 1][0] or "",
                           unpaired_reason(path, first_path, len(names), len(first)))
        return first

    @staticmethod
    def _paired_lines(out: ReadResult, source: str, path: Path, lines: list[Line], other: Path, n_other: int,
                      paired: Paired) -> Iterator[Line]:
        """The lines of ``path`` that have a partner line in ``other`` (``paired``: :func:`check_paired`'s answer),
        each counted as read; an unreadable line, or one past the last partner, goes to the quarantine with its
        reason."""
        for line in lines:
            out.read += 1
            if line.text is None:
                out.reject(source, str(path), line.no, line.raw, line.problem)
            elif line.no > paired.n:
                out.reject(source, str(path), line.no, line.text, unpaired_reason(path, other, len(lines), n_other))
            else:
                yield line

    def flickrstyle(self, path: Path, *, style: str, image_names: str | list[str], source: str = "flickrstyle10k",
                    split: str | None = None, image_root: str | None = None, encoding: str = "utf-8",
                    on_misaligned: str = "error", **_: object) -> ReadResult:
        out = ReadResult()
        files = [Path(p) for p in ([image_names] if isinstance(image_names, (str, Path)) else image_names)]
        names = self._image_names(files, on_misaligned, out, source)
        lines, blank = trailing_blank(read_lines(path, encoding, "FlickrStyle caption file"))
        paired = check_paired(path, len(lines), files[0], len(names), on_misaligned)
        for line in self._paired_lines(out, source, path, lines, files[0], len(names), paired):
            name, problem = names[line.no - 1]
            if name is None:
                out.reject(source, str(path), line.no, line.text, f"missing image id ({problem})")
                continue
            self._stylized(out, source=source, source_file=str(path), line_no=line.no, raw=line.text,
                           image_id=image_id_from_name(name), image_uri=_uri(image_root, name), caption=line.text,
                           style=style, split=split, source_key=f"{style}:{name}")
        for no in paired.extra_second:  # image names without a caption line
            out.read += 1
            out.reject(source, str(files[0]), no, names[no - 1][0] or "",
                       unpaired_reason(files[0], path, len(names), len(lines)))
        self._trailing(out, source, path, blank)
        return out

    def flickr30k_tokens(self, path: Path, *, source: str = "flickr30k", split: str | None = None,
                         image_root: str | None = None, encoding: str = "utf-8", **_: object) -> ReadResult:
        out = ReadResult()
        lines, blank = trailing_blank(read_lines(path, encoding, "Flickr30K token file"))
        for line in lines:
            out.read += 1
            if line.text is None:
                out.reject(source, str(path), line.no, line.raw, line.problem)
                continue
            key, sep, caption = line.text.partition("\t")
            name, hash_, k = key.partition("#")
            if not sep or not hash_ or not (k.strip().isdecimal() and k.strip().isascii()):
                out.reject(source, str(path), line.no, line.text,
                           "malformed line (expected '<image>.jpg#<k>\\t<caption>')")
                continue
            image_id = image_id_from_name(name) if name.strip() else None
            self._factual(out, source=source, source_file=str(path), line_no=line.no, raw=line.text,
                          image_id=image_id, image_uri=_uri(image_root, name), caption=caption, split=split,
                          key=key.strip())
        self._trailing(out, source, path, blank)
        return out

    def coco_captions(self, path: Path, *, source: str = "coco", split: str | None = None,
                      image_root: str | None = None, **_: object) -> ReadResult:
        out = ReadResult()
        what = "MSCOCO captions json file ({'images': [...], 'annotations': [...]})"
        data = _load_json(path, what)
        annotations = data.get("annotations") if isinstance(data, dict) else None
        images = data.get("images", []) if isinstance(data, dict) else None
        if not isinstance(annotations, list) or not isinstance(images, list):
            found = (f"a {type(data).__name__}" if not isinstance(data, dict) else
                     "no 'annotations' key" if "annotations" not in data else
                     f"'annotations' is a {type(annotations).__name__}" if not isinstance(annotations, list) else
                     f"'images' is a {type(images).__name__}")
            raise InputFileError(f"{path}: not an {what}: found {found}", "give the captions json as published")
        names = {img["id"]: img.get("file_name") for img in images
                 if isinstance(img, dict) and isinstance(img.get("id"), int) and not isinstance(img.get("id"), bool)
                 and isinstance(img.get("file_name"), str)}
        for i, ann in enumerate(annotations):
            out.read += 1
            if not isinstance(ann, dict):
                out.reject(source, str(path), i, ann, "malformed record (annotation is not an object)")
                continue
            ann_id, coco_id = ann.get("id"), ann.get("image_id")
            if isinstance(ann_id, bool) or not (isinstance(ann_id, int) or (
                    isinstance(ann_id, str) and ann_id.strip().isdecimal() and ann_id.isascii())):
                out.reject(source, str(path), i, ann, "malformed record (annotation without a numeric 'id')")
                continue
            if isinstance(coco_id, str) and coco_id.strip().isdecimal() and coco_id.isascii():
                coco_id = int(coco_id)
            image_id = f"coco:{coco_id}" if isinstance(coco_id, int) and not isinstance(coco_id, bool) else None
            name = names.get(coco_id) if image_id else None
            self._factual(out, source=source, source_file=str(path), line_no=i, raw=ann, image_id=image_id,
                          image_uri=_uri(image_root, name), caption=ann.get("caption"), split=split,
                          key=str(int(ann_id)))
        return out

    def coco_karpathy_refs(self, path: Path, *, source: str = "coco_karpathy", split: str | None = "test",
                           image_root: str | None = None, encoding: str = "utf-8", on_misaligned: str = "error",
                           **_: object) -> ReadResult:
        out = ReadResult()
        folder = Path(path)
        if not folder.is_dir():
            raise InputFileError(f"{folder}: not a folder (coco_karpathy_refs reads a folder)",
                                 "name the folder holding image_ID.txt and karpathy-refs-<k>.txt in ingest.sources")
        ids_file = folder / "image_ID.txt"
        ref_files = sorted(folder.glob("karpathy-refs-*.txt"))
        if not ref_files:
            raise InputFileError(f"{folder}: holds no karpathy-refs-<k>.txt file",
                                 "name the folder of the Karpathy reference files")
        id_lines, _ = trailing_blank(read_lines(ids_file, encoding, "Karpathy image_ID.txt"))
        ids: list[tuple[str, str | None, str | None]] = []  # (filename, image id, problem)
        for line in id_lines:
            name, _, coco_id = (line.text or "").partition("\t")
            coco_id = coco_id.strip()
            ok = coco_id.isdecimal() and coco_id.isascii()
            ids.append((name.strip(), f"coco:{int(coco_id)}" if ok else None, None if ok else
                        f"line {line.no} of image_ID.txt " + ("is not " + encoding if line.text is None else
                                                              "has no numeric COCO id after a tab")))
        tags_file = folder.parent / "textual_visual_context" / "visual-context_label.txt"
        tags_file = folder / "visual-context_label.txt" if (folder / "visual-context_label.txt").exists() else tags_file
        tags: list[str | None] = []
        if tags_file.exists():
            tag_lines, _ = trailing_blank(read_lines(tags_file, encoding, "visual context labels"))
            paired = check_paired(tags_file, len(tag_lines), ids_file, len(ids), on_misaligned)
            for line in tag_lines:
                if line.no > paired.n or line.text is None or _CONTROL.search(line.text):
                    out.read += 1
                    out.reject(source, str(tags_file), line.no, line.text if line.text is not None else line.raw,
                               unpaired_reason(tags_file, ids_file, len(tag_lines), len(ids)) if line.no > paired.n
                               else f"bad visual context labels ({line.problem or 'control characters'})")
                    tags.append(None)
                else:
                    tags.append(line.text.strip() or None)
        confidences = self._tag_confidences(out, source, tags_file.parent / "visual-context.txt", ids_file, len(ids),
                                            encoding, on_misaligned)
        for ref_file in ref_files:
            k = ref_file.stem.rsplit("-", 1)[-1]
            lines, blank = trailing_blank(read_lines(ref_file, encoding, "Karpathy reference file"))
            paired = check_paired(ref_file, len(lines), ids_file, len(ids), on_misaligned)
            for line in self._paired_lines(out, source, ref_file, lines, ids_file, len(ids), paired):
                name, image_id, problem = ids[line.no - 1]
                if image_id is None:
                    out.reject(source, str(ref_file), line.no, line.text, f"missing image id ({problem})")
                    continue
                self._factual(out, source=source, source_file=str(ref_file), line_no=line.no, raw=line.text,
                              image_id=image_id, image_uri=_uri(image_root, name), caption=line.text,
                              split=split, key=f"{image_id}#{k}")
            for no in paired.extra_second:  # images without a reference in this file
                out.read += 1
                out.reject(source, str(ids_file), no, id_lines[no - 1].text or id_lines[no - 1].raw,
                           unpaired_reason(ids_file, ref_file, len(ids), len(lines)))
            self._trailing(out, source, ref_file, blank)
        tagged = [{"image_id": image_id, "uri": _uri(image_root, name), "tags": tags[i], "width": None,
                   "height": None, "source": source, "tags_confidence": confidences[i] if i < len(confidences) else None}
                  for i, (name, image_id, _) in enumerate(ids) if image_id and i < len(tags) and tags[i]]
        out.images = tagged + out.images
        return out

    @staticmethod
    def _tag_confidences(out: ReadResult, source: str, path: Path, ids_file: Path, n_ids: int, encoding: str,
                         on_misaligned: str) -> list[float | None]:
        """``visual-context.txt`` beside the labels: the label classifier's confidence per image, line by line with
        ``image_ID.txt`` ([] when absent). A line that is not a number in [0, 1] is quarantined (the image keeps its
        labels, with no confidence)."""
        if not path.exists():
            return []
        lines, _ = trailing_blank(read_lines(path, encoding, "visual context confidences"))
        paired = check_paired(path, len(lines), ids_file, n_ids, on_misaligned)
        values: list[float | None] = []
        for line in lines:
            try:
                value = float(line.text) if line.text is not None and line.no <= paired.n else None
            except ValueError:
                value = None
            if value is None or not 0.0 <= value <= 1.0:  # NaN fails too
                out.read += 1
                out.reject(source, str(path), line.no, line.text if line.text is not None else line.raw,
                           unpaired_reason(path, ids_file, len(lines), n_ids) if line.no > paired.n
                           else "bad visual context confidence (not a number in [0, 1])")
                value = None
            values.append(value)
        return values

    def image_manifest(self, path: Path, *, source: str = "sample", **_: object) -> ReadResult:
        out = ReadResult()
        seen: set[str] = set()
        lines, blank = trailing_blank(read_lines(path, "utf-8", "image manifest (JSON lines)"))
        for line in lines:
            out.read += 1
            if line.text is None:
                out.reject(source, str(path), line.no, line.raw, line.problem)
                continue
            try:
                rec = json.loads(line.text)
            except (json.JSONDecodeError, RecursionError):
                out.reject(source, str(path), line.no, line.text, "malformed line (not JSON)")
                continue
            if not isinstance(rec, dict):
                out.reject(source, str(path), line.no, line.text, "malformed line (not a JSON object)")
                continue
            image_id, uri, tags = rec.get("image_id"), rec.get("uri"), rec.get("tags")
            if not isinstance(image_id, str) or not image_id.strip() or _CONTROL.search(image_id):
                out.reject(source, str(path), line.no, line.text, "missing image id")
                continue
            confidence = rec.get("tags_confidence")
            bad = [k for k, ok in (("uri", uri is None or isinstance(uri, str)),
                                   ("tags", tags is None or isinstance(tags, str)),
                                   ("tags_confidence", confidence is None or (
                                       isinstance(confidence, (int, float)) and not isinstance(confidence, bool)
                                       and 0 <= confidence <= 1)),
                                   *((k, rec.get(k) is None or (isinstance(rec.get(k), int)
                                                                and not isinstance(rec.get(k), bool)
                                                                and 0 <= rec.get(k) < 2 ** 31))
                                     for k in ("width", "height"))) if not ok]
            if bad:
                out.reject(source, str(path), line.no, line.text,
                           f"malformed record (wrong type: {', '.join(bad)})")
                continue
            if image_id in seen:
                out.duplicates.append(self._located({"image_id": image_id, "duplicate_of": image_id},
                                                    str(path), line.no, line.text))
                continue
            seen.add(image_id)
            if uri and "://" not in uri and not uri.startswith("/"):  # relative to the manifest's folder
                uri = str(path.parent / uri)
            out.images.append({"image_id": image_id, "uri": uri, "tags": tags, "width": rec.get("width"),
                               "height": rec.get("height"), "source": source, RECORD: True,
                               "tags_confidence": None if confidence is None else float(confidence)})
        self._trailing(out, source, path, blank)
        return out

    def read(self, fmt: str, path: str | Path, **options: object) -> ReadResult:
        reader = getattr(self, fmt, None)
        if reader is None or fmt.startswith("_") or fmt == "read":
            raise ValueError(f"unknown ingest format {fmt!r}")
        options = {k: v for k, v in options.items() if v is not None}
        if "name" in options:
            options["source"] = options.pop("name")
        return reader(Path(path), **options)


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
    for row in result.duplicates:
        row[ORIGIN] = origin
    result.read_by_origin[origin] = result.read_by_origin.get(origin, 0) + result.read
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


def _drop_duplicates(rows: list[dict], key: str, out: ReadResult, conflict_on: str | None = None) -> list[dict]:
    """Rows whose ``key`` repeats an earlier row's go to ``out.duplicates``; with ``conflict_on``, a repeat whose
    ``conflict_on`` value differs from the first row's is a conflict, quarantined with the reason."""
    first: dict[str, dict] = {}
    kept = []
    for row in rows:
        earlier = first.get(row[key])
        if earlier is None:
            first[row[key]] = row
            kept.append(row)
        elif conflict_on and row[conflict_on] != earlier[conflict_on]:
            where = row.get(LOCATION) or {}
            before = earlier.get(LOCATION) or {}
            out.reject(row.get("source", ""), where.get("file"), where.get("line"), where.get("raw", row[conflict_on]),
                       f"conflicting duplicate {key} {row[key]!r}: a different {conflict_on} than the row kept "
                       f"(line {before.get('line')} of {Path(str(before.get('file'))).name})")
            out.quarantine[-1][ORIGIN] = row.get(ORIGIN)
        else:
            out.duplicates.append({**row, "duplicate_of": row[key]})
    return kept


def prepare(result: ReadResult, splits: object | None = None,
            known_stylized_images: set[str] | frozenset[str] = frozenset()) -> ReadResult:
    """The paper's protocol on the rows of every source (see the module docstring), in place; returns ``result``.

    ``splits``: an object with the fields of the conf's ``ingest.splits`` (None = the paper's defaults).
    Duplicates go to ``result.duplicates``; factual rows of stylized images to ``result.descriptions``.
    """
    options = {k: getattr(splits, k) for k in ("seed", "flickrstyle_test_images", "flickrstyle_val_fraction",
                                               "senticap_val_images_per_style")} if splits is not None else {}
    result.stylized = _drop_duplicates(result.stylized, "scene_id", result)
    result.factual = _drop_duplicates(result.factual, "caption_id", result, conflict_on="caption")
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


DUPLICATE_KEYS = {"stylized": "scene_id", "factual": "caption_id", "images": "image_id"}


def _duplicate_kind(row: dict) -> str:
    return next((kind for kind, key in DUPLICATE_KEYS.items() if key in row), "images")


def origin_counts(result: ReadResult) -> dict[str, dict[str, int]]:
    """Per source (:data:`ORIGIN`): ``read`` (records its reader counted), ``kept`` (stylized + factual +
    descriptions + image-manifest records), ``quarantined``, ``duplicates`` (by kind: ``stylized_duplicates``,
    ``factual_duplicates``, ``images_duplicates``), the parts of kept, ``images``, and ``unaccounted`` =
    read - kept - quarantined - duplicates, which is 0 unless a record was lost."""
    counts: dict[str, dict[str, int]] = {}

    def bucket(origin: str | None) -> dict[str, int]:
        return counts.setdefault(origin or "unknown", {k: 0 for k in (
            "read", "kept", "quarantined", "duplicates", "unaccounted", "stylized", "factual", "descriptions",
            "manifest_images", "stylized_duplicates", "factual_duplicates", "images_duplicates")})

    for origin, n in result.read_by_origin.items():
        bucket(origin)["read"] += n
    for name in ("stylized", "factual", "descriptions"):
        for row in getattr(result, name):
            b = bucket(row.get(ORIGIN))
            b[name] += 1
            b["kept"] += 1
    for row in result.images:
        if row.get(RECORD):
            b = bucket(row.get(ORIGIN))
            b["manifest_images"] += 1
            b["kept"] += 1
    for row in result.quarantine:
        bucket(row.get(ORIGIN))["quarantined"] += 1
    for row in result.duplicates:
        b = bucket(row.get(ORIGIN))
        b["duplicates"] += 1
        b[f"{_duplicate_kind(row)}_duplicates"] += 1
    for b in counts.values():
        b["unaccounted"] = b["read"] - b["kept"] - b["quarantined"] - b["duplicates"]
    for origin, n in pd.Series([row.get(ORIGIN) for row in result.images], dtype=object).value_counts().items():
        if origin in counts:
            counts[origin]["images"] = int(n)
    return counts


def duplicate_examples(result: ReadResult, per_source: int = 20) -> dict[str, dict]:
    """Per source: the number of duplicates and the natural keys (with file and line) of the first ``per_source``."""
    out: dict[str, dict] = {}
    for row in result.duplicates:
        entry = out.setdefault(row.get(ORIGIN) or "unknown", {"count": 0, "examples": []})
        entry["count"] += 1
        if len(entry["examples"]) < per_source:
            where = row.get(LOCATION) or {}
            kind = _duplicate_kind(row)
            entry["examples"].append({"key": DUPLICATE_KEYS[kind], "value": row.get(DUPLICATE_KEYS[kind]),
                                      "file": where.get("file"), "line": where.get("line"),
                                      "caption": row.get("caption")})
    return out
