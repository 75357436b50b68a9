"""Reader fuzzing: seeded mutations of every caption format (truncation, wrong encodings, NUL and control bytes,
empty and overlong lines, deleted / duplicated / swapped lines, missing fields, wrong types, duplicated ids).

Each mutated input is either read with every record accounted for -- read = kept + quarantined + duplicates per
source, and read = the records the files hold, counted here on the bytes independently of the reader -- or rejected
with :class:`readers.errors.InputFileError` naming the file and the problem. Any other exception fails the test, as
does a kept row that is not what its line says (wrong type, control characters, a caption that is not its line's).
Pandas only (no Spark), seeded, a few seconds for all readers.
"""
from __future__ import annotations

import copy
import json
import pickle
import random
from pathlib import Path
from typing import Callable

import pytest

from readers.corpora import (LOCATION, MAX_CAPTION_CHARS, ORIGIN, SPLITS, Reader, ReadResult, origin_counts, prepare,
                             tag_rows)
from readers.errors import InputFileError

STYLES = ["humor", "romantic", "positive", "negative"]
SEED = 15
CASES = 250  # mutated inputs per reader (and per alignment mode for the formats that pair files)
CONTROL_BYTES = [b"\x00", b"\x01", b"\x08", b"\x1b", b"\x7f", b"\x0b", b"\x0c", b"\x1c", "\x85".encode(),
                 "\u2028".encode(), "\ufeff".encode(), "\ufffd".encode()]
WRONG_VALUES = [None, 0, 1, -1, 2 ** 70, 1.5, float("nan"), True, "", " ", "x", "1", [], {}, [1, 2], {"a": 1},
                "COCO_val2014_000000000042.jpg", "\x00"]

CAPTIONS = ["a dog runs on the beach .", "two kids play in a café near the park .", "a man rides a red bike .",
            "a woman sits on a bench , reading .", "the cat sleeps in the sun", "a bird flies over the water",
            "a girl jumps into the pool .", "three men walk down the street", "a horse stands in the field .",
            "a couple dances under the lights ."]


# ----------------------------------------------------------------------------------------------- mutations
def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One byte-level mutation of a text file; returns (new bytes, what was done)."""
    lines = _lines(data)
    kind = rng.choice(["truncate", "bad_byte", "latin1", "utf16", "control", "empty_line", "blank_line",
                       "overlong", "delete_line", "duplicate_line", "swap_lines", "drop_separator", "crlf", "cr",
                       "bom", "flip", "empty_file", "trailing_blank", "no_final_newline"])
    pos = rng.randrange(len(data) + 1) if data else 0
    at = rng.randrange(len(lines) + 1) if lines else 0
    if kind == "truncate":
        return data[:pos], f"truncate at {pos}"
    if kind == "bad_byte":
        b = rng.choice([b"\xff", b"\xc3", b"\xe9", b"\x80", b"\xed\xa0\x80"])
        return data[:pos] + b + data[pos:], f"insert {b!r} at {pos}"
    if kind == "latin1":
        try:
            return data.decode("utf-8").encode("latin-1", errors="replace"), "re-encode as latin-1"
        except UnicodeDecodeError:
            return data, "latin-1 (unchanged)"
    if kind == "utf16":
        return data.decode("utf-8", errors="replace").encode("utf-16"), "re-encode as utf-16"
    if kind == "control":
        b = rng.choice(CONTROL_BYTES)
        return data[:pos] + b + data[pos:], f"insert {b!r} at {pos}"
    if kind == "empty_line":
        return b"".join(lines[:at] + [b"\n"] + lines[at:]), f"empty line at {at}"
    if kind == "blank_line":
        return b"".join(lines[:at] + [b"   \t \n"] + lines[at:]), f"blank line at {at}"
    if kind == "overlong":
        long = (b"word " * rng.choice([50, 400, 5000])).strip() + b"\n"
        return b"".join(lines[:at] + [long] + lines[at:]), f"overlong line at {at}"
    if kind == "delete_line" and lines:
        i = rng.randrange(len(lines))
        return b"".join(lines[:i] + lines[i + 1:]), f"delete line {i}"
    if kind == "duplicate_line" and lines:
        i = rng.randrange(len(lines))
        line = lines[i] if lines[i].endswith((b"\n", b"\r")) else lines[i] + b"\n"
        return b"".join(lines[:i] + [line] + lines[i:]), f"duplicate line {i}"
    if kind == "swap_lines" and len(lines) > 1:
        i, j = rng.sample(range(len(lines)), 2)
        lines = [(x if x.endswith((b"\n", b"\r")) else x + b"\n") for x in lines]
        lines[i], lines[j] = lines[j], lines[i]
        return b"".join(lines), f"swap lines {i} and {j}"
    if kind == "drop_separator":
        for sep in rng.sample([b"\t", b",", b"#", b".jpg", b"_", b"\""], 6):
            if sep in data:
                i = rng.choice([k for k in range(len(data)) if data.startswith(sep, k)])
                return data[:i] + data[i + len(sep):], f"drop {sep!r} at {i}"
        return data, "drop separator (none)"
    if kind == "crlf":
        return data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"), "CRLF line ends"
    if kind == "cr":
        return data.replace(b"\r\n", b"\n").replace(b"\n", b"\r"), "CR line ends"
    if kind == "bom":
        return b"\xef\xbb\xbf" + data, "UTF-8 byte-order mark"
    if kind == "flip" and data:
        out = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out), "random bytes"
    if kind == "empty_file":
        return b"", "empty file"
    if kind == "trailing_blank":
        return data + b"\n\n  \n", "blank lines at the end"
    if kind == "no_final_newline":
        return data.rstrip(b"\r\n"), "no final newline"
    return data, f"{kind} (unchanged)"


def _paths(obj, prefix=()):
    """Every (path, value) in a JSON value."""
    yield prefix, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _set(obj, path, value):
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = value


def mutate_json(doc, rng: random.Random) -> tuple[object, str]:
    """One structural mutation of a JSON document: a missing key, a wrong type, a duplicated entry, control
    characters or an overlong string, or a different top level."""
    doc = copy.deepcopy(doc)
    paths = [p for p, _ in _paths(doc) if p]
    if not paths:
        return doc, "no field to mutate"
    kind = rng.choice(["delete", "wrong_type", "wrong_type", "duplicate", "control", "overlong", "top"])
    path = rng.choice(paths)
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    if kind == "delete":
        del parent[path[-1]]
        return doc, f"delete {path}"
    if kind == "wrong_type":
        value = copy.deepcopy(rng.choice(WRONG_VALUES))
        _set(doc, path, value)
        return doc, f"{path} = {value!r}"
    if kind == "duplicate":
        lists = [p for p, v in _paths(doc) if isinstance(v, list) and v]
        if lists:
            p = rng.choice(lists)
            target = doc
            for q in p:
                target = target[q]
            i = rng.randrange(len(target))
            target.insert(i, copy.deepcopy(target[i]))
            return doc, f"duplicate {p}[{i}]"
        return doc, "duplicate (none)"
    strings = [p for p, v in _paths(doc) if isinstance(v, str)]
    if kind == "control" and strings:
        p = rng.choice(strings)
        value = _get(doc, p)
        i = rng.randrange(len(value) + 1)
        _set(doc, p, value[:i] + rng.choice(["\x00", "\x1b", "\x7f", "\x85", "\ufffd", "\u2028"]) + value[i:])
        return doc, f"control character in {p}"
    if kind == "overlong" and strings:
        p = rng.choice(strings)
        _set(doc, p, "word " * rng.choice([100, 1000]))
        return doc, f"overlong {p}"
    if kind == "top":
        return rng.choice([[doc], "text", 3, None, {}]), "top level replaced"
    return doc, f"{kind} (unchanged)"


def _get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def json_bytes(doc, rng: random.Random) -> tuple[bytes, str]:
    """A mutated JSON document serialised, sometimes with a byte-level mutation on top (truncation and the like)."""
    what = []
    for _ in range(rng.randint(1, 3)):
        doc, w = mutate_json(doc, rng)
        what.append(w)
    data = json.dumps(doc, ensure_ascii=rng.random() < 0.5, allow_nan=True).encode("utf-8")
    if rng.random() < 0.3:
        data, w = mutate_bytes(data, rng)
        what.append(w)
    return data, "; ".join(what)


# ----------------------------------------------------------------------------------------------- checking
def physical_lines(data: bytes) -> list[bytes]:
    """The lines of a file as the readers define them (\\n, \\r\\n or \\r end a line; a UTF-8 BOM is not text)."""
    return data.removeprefix(b"\xef\xbb\xbf").splitlines()


def non_trailing(lines: list[bytes]) -> int:
    """Lines up to the last one that is not blank (as text)."""
    n = len(lines)
    while n and _decodes(lines[n - 1]) and not lines[n - 1].decode("utf-8").strip():
        n -= 1
    return n


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def read_or_reject(read: Callable[[], ReadResult], files: list[Path], what: str) -> ReadResult | None:
    """The reader's result with the protocol applied, or None when it raised an InputFileError naming a file."""
    try:
        result = read()
    except InputFileError as exc:
        assert any(str(f) in str(exc) for f in files), f"{what}: the error names no input file: {exc}"
        assert exc.fix, f"{what}: the error says no fix: {exc}"
        return None
    except Exception as exc:  # noqa: BLE001 - the point of the test
        raise AssertionError(f"{what}: {type(exc).__name__}: {exc}") from exc
    tag_rows(result, "src", "fuzz")
    try:
        prepare(result)
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"{what}: prepare: {type(exc).__name__}: {exc}") from exc
    return result


def check_accounted(result: ReadResult, expected_read: int | None, what: str) -> None:
    counts = origin_counts(result).get("src") or {"read": 0, "kept": 0, "quarantined": 0, "duplicates": 0}
    assert counts["read"] == counts["kept"] + counts["quarantined"] + counts["duplicates"], (what, counts)
    if expected_read is not None:
        assert counts["read"] == expected_read, (what, counts, expected_read)
    frames = result.frames()
    for row in result.stylized + result.factual:
        assert isinstance(row["image_id"], str) and row["image_id"], (what, row)
        caption = row["caption"]
        assert isinstance(caption, str) and caption.strip() == caption and caption, (what, row)
        assert len(caption) <= MAX_CAPTION_CHARS, what
        assert not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f or c == "\ufffd" for c in caption.replace("\t", "")), (
            what, row)
        assert row["split"] is None or row["split"] in SPLITS, (what, row)
    ids = [row["quarantine_id"] for row in result.quarantine]  # the table MERGEs on it: one row per record
    assert len(set(ids)) == len(ids), (what, [r for r in result.quarantine if ids.count(r["quarantine_id"]) > 1][:2])
    for row in result.quarantine:
        assert isinstance(row["reason"], str) and row["reason"] and isinstance(row["raw"], str), (what, row)
        assert row[ORIGIN] == "src", (what, row)
    for frame in frames.values():
        for col in frame.columns:
            values = frame[col].dropna()
            if col in ("width", "height", "line_no"):
                assert all(float(v).is_integer() for v in values), (what, col)  # int, or float where NaN
            elif col != "descriptions":
                assert all(isinstance(v, str) for v in values), (what, col, values.tolist()[:3])


def captions_from_their_lines(result: ReadResult, files: dict[str, bytes], after_tab: bool, what: str) -> None:
    """Every kept caption is the text of the line its row says it came from (nothing shifted or merged)."""
    for row in result.stylized + result.factual:
        where = row[LOCATION]
        lines = physical_lines(files[where["file"]])
        raw = lines[where["line"] - 1]
        text = raw.decode("utf-8") if _decodes(raw) else raw.decode("latin-1")
        if after_tab:
            text = text.partition("\t")[2]
        assert text.strip() == row["caption"], (what, row["caption"], text)


# ----------------------------------------------------------------------------------------------- base inputs
def flickr_name(i: int) -> str:
    return f"{1000 + i}_{i:04x}ab.jpg"


def base_flickrstyle(n: int = 10) -> tuple[bytes, bytes]:
    captions = "\r\n".join(f"{c} to impress {i}" for i, c in enumerate(CAPTIONS[:n])) + "\r\n"
    names = "\n".join(flickr_name(i) for i in range(n)) + "\n"
    return captions.encode("utf-8"), names.encode("utf-8")


def base_tokens() -> bytes:
    return "".join(f"{1000 + i // 2}.jpg#{i % 2}\t{c}\n" for i, c in enumerate(CAPTIONS)).encode("utf-8")


def base_senticap_json() -> dict:
    return {"images": [{"filename": f"COCO_val2014_{i:012d}.jpg", "imgid": i, "split": ["train", "val", "test"][i % 3],
                        "sentences": [{"raw": CAPTIONS[(2 * i) % 10], "sentiment": 1, "tokens": ["a"]},
                                      {"raw": CAPTIONS[(2 * i + 1) % 10], "sentiment": 0}]} for i in range(5)]}


def base_senticap_csv() -> bytes:
    rows = ["filename,is_positive_sentiment,caption,split"]
    rows += [f"COCO_val2014_{i:012d}.jpg,{i % 2},\"{c}\",{['train', 'val', 'test'][i % 3]}"
             for i, c in enumerate(CAPTIONS)]
    return ("\n".join(rows) + "\n").encode("utf-8")


def base_coco() -> dict:
    return {"info": {"year": 2014}, "images": [{"id": 40 + i, "file_name": f"COCO_val2014_{40 + i:012d}.jpg"}
                                               for i in range(5)],
            "annotations": [{"id": 100 + i, "image_id": 40 + i // 2, "caption": c} for i, c in enumerate(CAPTIONS)]}


def base_karpathy(n: int = 6) -> dict[str, bytes]:
    ids = "".join(f"COCO_val2014_{40 + i:012d}.jpg\t{40 + i}\n" for i in range(n))
    refs = {f"karpathy-refs-{k}.txt": "\n".join(CAPTIONS[(i + k) % 10] for i in range(n)) for k in (1, 2)}
    tags = "".join(f"dog tree {i}\n" for i in range(n))
    return {"image_ID.txt": ids.encode(), **{k: v.encode() for k, v in refs.items()},
            "visual-context_label.txt": tags.encode()}


# ----------------------------------------------------------------------------------------------- the tests
@pytest.fixture
def reader():
    return Reader(STYLES)


@pytest.mark.parametrize("mode", ["error", "quarantine"])
def test_fuzz_flickrstyle(tmp_path, reader, mode):
    rng = random.Random(f"{SEED}-flickrstyle-{mode}")
    base_captions, base_names = base_flickrstyle()
    cap_path, names_path = tmp_path / "funny_train.txt", tmp_path / "image_names.txt"
    outcomes = {"read": 0, "rejected": 0}
    for case in range(CASES):
        captions, names, what = base_captions, base_names, []
        for _ in range(rng.randint(1, 2)):
            if rng.random() < 0.75:
                captions, w = mutate_bytes(captions, rng)
                what.append(f"captions: {w}")
            else:
                names, w = mutate_bytes(names, rng)
                what.append(f"names: {w}")
        what = f"case {case} ({mode}): " + "; ".join(what)
        cap_path.write_bytes(captions)
        names_path.write_bytes(names)
        result = read_or_reject(lambda: reader.read("flickrstyle", cap_path, style="humor",
                                                    image_names=str(names_path), on_misaligned=mode),
                                [cap_path, names_path], what)
        cap_lines = physical_lines(captions)
        n_names = non_trailing(physical_lines(names))
        aligned = non_trailing(cap_lines) == n_names
        if result is None:
            outcomes["rejected"] += 1
            continue
        outcomes["read"] += 1
        assert aligned or mode == "quarantine", f"{what}: misaligned files were read without an error"
        check_accounted(result, len(cap_lines) + max(0, n_names - non_trailing(cap_lines)), what)
        captions_from_their_lines(result, {str(cap_path): captions}, False, what)
        name_lines = physical_lines(names)
        for row in result.stylized:  # caption of line i, image of name line i
            name = name_lines[row[LOCATION]["line"] - 1].decode("utf-8").strip()
            assert row["image_id"] == f"flickr30k:{name.split('_')[0]}", (what, row, name)
    print("fuzz:", f"flickrstyle ({mode})", outcomes)  # shown with pytest -s
    assert outcomes["read"] > CASES // 4 and outcomes["rejected"] > 0, outcomes


def test_fuzz_flickrstyle_pickled_names(tmp_path, reader):
    """The pickled name list: damaged pickles are rejected naming the file; a pickle that names a class never runs
    it; a pickled and a text list that disagree are an error naming both."""
    rng = random.Random(f"{SEED}-pickle")
    captions, names = base_flickrstyle()
    name_list = names.decode().split()
    (tmp_path / "funny.txt").write_bytes(captions)
    good = pickle.dumps(name_list, protocol=0)
    outcomes = {"read": 0, "rejected": 0}
    for case in range(CASES // 2):
        data, what = mutate_bytes(good, rng) if rng.random() < 0.7 else (
            pickle.dumps(rng.choice([{"a": 1}, 3, "x", [1, 2], name_list[:-1], name_list + ["x.jpg"],
                                     [n.encode("latin-1") for n in name_list], tuple(name_list)]), protocol=2),
            "other pickled value")
        path = tmp_path / "train_fu.p"
        path.write_bytes(data)
        result = read_or_reject(lambda: reader.read("flickrstyle", tmp_path / "funny.txt", style="humor",
                                                    image_names=str(path), on_misaligned="quarantine"),
                                [path, tmp_path / "funny.txt"], f"case {case}: {what}")
        outcomes["rejected" if result is None else "read"] += 1
        if result is not None:
            check_accounted(result, None, what)
    print("fuzz:", "flickrstyle pickled names", outcomes)  # shown with pytest -s
    assert outcomes["read"] and outcomes["rejected"], outcomes
    (tmp_path / "evil.p").write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(InputFileError, match="evil.p: not a pickled list of image names"):
        reader.read("flickrstyle", tmp_path / "funny.txt", style="humor", image_names=str(tmp_path / "evil.p"))
    # the pickled and the text list of the same images must agree, line by line
    (tmp_path / "names.p").write_bytes(good)
    (tmp_path / "names.txt").write_text("\n".join(f"{n.split('_')[0]}.jpg" for n in name_list) + "\n")
    both = [str(tmp_path / "names.p"), str(tmp_path / "names.txt")]
    assert len(reader.read("flickrstyle", tmp_path / "funny.txt", style="humor", image_names=both).stylized) == 10
    (tmp_path / "names.txt").write_text("\n".join(f"{n.split('_')[0]}.jpg" for n in name_list[:-1]) + "\n")
    with pytest.raises(InputFileError, match=r"names.p has 10 image names but .*names.txt has 9"):
        reader.read("flickrstyle", tmp_path / "funny.txt", style="humor", image_names=both)
    (tmp_path / "names.txt").write_text("\n".join(f"{n.split('_')[0]}.jpg" for n in reversed(name_list)) + "\n")
    with pytest.raises(InputFileError, match="disagree at line 1"):
        reader.read("flickrstyle", tmp_path / "funny.txt", style="humor", image_names=both)
    res = reader.read("flickrstyle", tmp_path / "funny.txt", style="humor", image_names=both,
                      on_misaligned="quarantine")
    assert not res.stylized and len(res.quarantine) == 10 and "disagree" in res.quarantine[0]["reason"]


def test_fuzz_flickr30k_tokens(tmp_path, reader):
    rng = random.Random(f"{SEED}-tokens")
    path = tmp_path / "results.token"
    outcomes = {"read": 0, "rejected": 0}
    for case in range(CASES):
        data, what = base_tokens(), []
        for _ in range(rng.randint(1, 3)):
            data, w = mutate_bytes(data, rng)
            what.append(w)
        what = f"case {case}: " + "; ".join(what)
        path.write_bytes(data)
        result = read_or_reject(lambda: reader.read("flickr30k_tokens", path), [path], what)
        if result is None:
            outcomes["rejected"] += 1
            continue
        outcomes["read"] += 1
        check_accounted(result, len(physical_lines(data)), what)
        captions_from_their_lines(result, {str(path): data}, True, what)
    print("fuzz:", "flickr30k_tokens", outcomes)  # shown with pytest -s
    assert outcomes["read"] > CASES // 2 and outcomes["rejected"] > 0, outcomes


def test_fuzz_senticap_csv(tmp_path, reader):
    rng = random.Random(f"{SEED}-csv")
    path = tmp_path / "senticap.csv"
    outcomes = {"read": 0, "rejected": 0}
    for case in range(CASES):
        data, what = base_senticap_csv(), []
        for _ in range(rng.randint(1, 3)):
            data, w = mutate_bytes(data, rng)
            what.append(w)
        what = f"case {case}: " + "; ".join(what)
        path.write_bytes(data)
        result = read_or_reject(lambda: reader.read("senticap_csv", path), [path], what)
        if result is None:
            outcomes["rejected"] += 1
            continue
        outcomes["read"] += 1
        check_accounted(result, len(physical_lines(data)) - 1, what)  # every line after the header
    print("fuzz:", "senticap_csv", outcomes)  # shown with pytest -s
    assert outcomes["read"] > CASES // 2 and outcomes["rejected"] > 0, outcomes


def _senticap_records(doc) -> int | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        return None
    return sum(len(im["sentences"]) if isinstance(im, dict) and isinstance(im.get("sentences"), list) else 1
               for im in doc["images"])


def _coco_records(doc) -> int | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("annotations"), list) \
            or not isinstance(doc.get("images", []), list):
        return None
    return len(doc["annotations"])


@pytest.mark.parametrize("fmt,base,records", [("senticap_json", base_senticap_json, _senticap_records),
                                              ("coco_captions", base_coco, _coco_records)])
def test_fuzz_json_formats(tmp_path, reader, fmt, base, records):
    rng = random.Random(f"{SEED}-{fmt}")
    path = tmp_path / f"{fmt}.json"
    outcomes = {"read": 0, "rejected": 0}
    for case in range(CASES):
        data, what = json_bytes(base(), rng)
        what = f"case {case}: {what}"
        path.write_bytes(data)
        result = read_or_reject(lambda: reader.read(fmt, path, split="train" if fmt == "coco_captions" else None),
                                [path], what)
        try:
            doc = json.loads(data.decode("utf-8-sig"))
        except (UnicodeDecodeError, ValueError):
            doc = None
        expected = records(doc) if doc is not None else None
        if result is None:
            outcomes["rejected"] += 1
            assert expected is None, f"{what}: a readable {fmt} file was rejected"
            continue
        outcomes["read"] += 1
        assert expected is not None, f"{what}: an unreadable file was read"
        check_accounted(result, expected, what)
    print("fuzz:", fmt, outcomes)  # shown with pytest -s
    assert outcomes["read"] > CASES // 3 and outcomes["rejected"] > 0, outcomes


@pytest.mark.parametrize("mode", ["error", "quarantine"])
def test_fuzz_karpathy_refs(tmp_path, reader, mode):
    rng = random.Random(f"{SEED}-karpathy-{mode}")
    folder = tmp_path / "coco_karpathy_test"
    folder.mkdir()
    outcomes = {"read": 0, "rejected": 0}
    for case in range(CASES):
        files = base_karpathy()
        what = []
        for _ in range(rng.randint(1, 2)):
            name = rng.choice(sorted(files))
            files[name], w = mutate_bytes(files[name], rng)
            what.append(f"{name}: {w}")
        what = f"case {case} ({mode}): " + "; ".join(what)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        result = read_or_reject(lambda: reader.read("coco_karpathy_refs", folder, on_misaligned=mode),
                                [folder / n for n in files], what)
        n_ids = non_trailing(physical_lines(files["image_ID.txt"]))
        refs = {n: physical_lines(d) for n, d in files.items() if n.startswith("karpathy-refs")}
        n_tags = non_trailing(physical_lines(files["visual-context_label.txt"]))
        aligned = all(non_trailing(lines) == n_ids for lines in refs.values()) and n_tags == n_ids
        if result is None:
            outcomes["rejected"] += 1
            continue
        outcomes["read"] += 1
        assert aligned or mode == "quarantine", f"{what}: misaligned files were read without an error"
        from_tags = sum(1 for q in result.quarantine if q["source_file"].endswith("visual-context_label.txt"))
        expected = sum(len(lines) + max(0, n_ids - non_trailing(lines)) for lines in refs.values()) + from_tags
        check_accounted(result, expected, what)
        captions_from_their_lines(result, {str(folder / n): d for n, d in files.items()}, False, what)
        id_lines = physical_lines(files["image_ID.txt"])
        for row in result.factual + result.descriptions:
            if "caption_id" in row and LOCATION in row:
                coco_id = id_lines[row[LOCATION]["line"] - 1].decode("utf-8").partition("\t")[2].strip()
                assert row["image_id"] == f"coco:{int(coco_id)}", (what, row)
    print("fuzz:", f"coco_karpathy_refs ({mode})", outcomes)  # shown with pytest -s
    assert outcomes["read"] > CASES // 4 and outcomes["rejected"] > 0, outcomes


def test_fuzz_image_manifest(tmp_path, reader):
    rng = random.Random(f"{SEED}-manifest")
    path = tmp_path / "images.jsonl"
    base = "".join(json.dumps({"image_id": f"coco:{i}", "uri": f"images/{i}.png", "tags": "dog park",
                               "width": 32, "height": 32}) + "\n" for i in range(10)).encode()
    outcomes = {"read": 0, "rejected": 0}
    for case in range(CASES // 2):
        data, what = mutate_bytes(base, rng)
        path.write_bytes(data)
        result = read_or_reject(lambda: reader.read("image_manifest", path), [path], f"case {case}: {what}")
        outcomes["rejected" if result is None else "read"] += 1
        if result is not None:
            check_accounted(result, len(physical_lines(data)), what)
    print("fuzz:", "image_manifest", outcomes)  # shown with pytest -s
    assert outcomes["read"] > CASES // 4, outcomes


def test_missing_and_wrong_files_are_named(tmp_path, reader):
    """Files that are not there, folders where files should be, and a CSV without its header."""
    for fmt in ("senticap_json", "senticap_csv", "flickr30k_tokens", "coco_captions", "image_manifest"):
        with pytest.raises(InputFileError, match=f"{tmp_path / 'nope'}: no such file"):
            reader.read(fmt, tmp_path / "nope")
    with pytest.raises(InputFileError, match="is a folder"):
        reader.read("flickr30k_tokens", tmp_path)
    with pytest.raises(InputFileError, match="not a folder"):
        reader.read("coco_karpathy_refs", tmp_path / "nope")
    (tmp_path / "no_header.csv").write_text("COCO_val2014_000000000001.jpg,1,a nice dog\n")
    with pytest.raises(InputFileError, match="no_header.csv: not a SentiCap csv file: line 1 must be a header"):
        reader.read("senticap_csv", tmp_path / "no_header.csv")
    (tmp_path / "cut.json").write_text('{"images": [{"filename": "COCO_val2014_000000000001.jpg", "sent')
    with pytest.raises(InputFileError, match=r"cut.json: not valid JSON .*cut short"):
        reader.read("senticap_json", tmp_path / "cut.json")
    (tmp_path / "wide.txt").write_bytes("1000.jpg#0\ta dog .\n".encode("utf-16"))
    with pytest.raises(InputFileError, match="wide.txt: is UTF-16 text"):
        reader.read("flickr30k_tokens", tmp_path / "wide.txt")
    assert len(reader.read("flickr30k_tokens", tmp_path / "wide.txt", encoding="utf-16").factual) == 1


def test_every_record_accounted_for_on_planted_data(tmp_path):
    """Per source, read = kept + quarantined + duplicates on files with planted duplicates (by natural key), bad
    rows and unpaired lines; the duplicates' keys are listed with their file and line."""
    from jobs.ingest import read_sources, summary_lines
    from jobs.platform.config import IngestSource, load_config
    from readers.corpora import duplicate_examples

    senti = {"images": [
        {"filename": "COCO_val2014_000000000001.jpg", "split": "train", "sentences": [
            {"raw": "a lovely dog .", "sentiment": 1}, {"raw": "a sad dog .", "sentiment": 0},
            {"raw": "A lovely dog", "sentiment": 1},      # duplicate scene (same image, style, normalised caption)
            {"raw": "", "sentiment": 1},                  # quarantined: empty caption
            {"raw": "a dog .", "sentiment": 7},           # quarantined: unknown style
            "not a sentence"]},                           # quarantined: malformed
        {"filename": "COCO_val2014_000000000002.jpg", "split": "test", "sentences": [
            {"raw": "a nice cat .", "sentiment": 1}, {"raw": "a dull cat .", "sentiment": 0}]}]}
    (tmp_path / "senticap.json").write_text(json.dumps(senti))
    (tmp_path / "names.txt").write_text("1001_aa.jpg\n1002_bb.jpg\n1003_cc.jpg\n1001_aa.jpg\n")
    (tmp_path / "funny.txt").write_text("a dog in love with a bone .\na cat on a plan .\n\n"
                                        "a dog in love with a bone .\none line too many .\n")
    (tmp_path / "results.token").write_text("1001.jpg#0\ta dog .\n1004.jpg#0\ta cat .\n1004.jpg#0\ta cat .\n"
                                            "1004.jpg#0\ta different cat .\nno tab here\n1005.jpg#1\ta bird .\n")
    (tmp_path / "coco.json").write_text(json.dumps({"images": [], "annotations": [
        {"id": 1, "image_id": 9, "caption": "a horse ."}, {"id": 1, "image_id": 9, "caption": "a horse ."},
        {"id": 2, "image_id": 9, "caption": None}, {"id": 3, "image_id": 1, "caption": "a dog on grass ."}]}))
    cfg = load_config("test")
    sources = [IngestSource(format="senticap_json", path=str(tmp_path / "senticap.json")),
               IngestSource(format="flickrstyle", style="humor", path=str(tmp_path / "funny.txt"),
                            image_names=str(tmp_path / "names.txt"), on_misaligned="quarantine"),
               IngestSource(format="flickr30k_tokens", path=str(tmp_path / "results.token")),
               IngestSource(format="coco_captions", path=str(tmp_path / "coco.json"))]
    result, per_source = read_sources(cfg, sources)
    got = {name.split(":")[0]: {k: c[k] for k in ("read", "kept", "quarantined", "duplicates")}
           for name, c in per_source.items()}
    assert got == {
        "senticap_json": {"read": 8, "kept": 4, "quarantined": 3, "duplicates": 1},
        "flickrstyle": {"read": 5, "kept": 2, "quarantined": 2, "duplicates": 1},   # empty line; unpaired line 5
        # 1001.jpg#0 and coco:1 describe stylized images (kept as descriptions); a conflicting 1004.jpg#0 is
        # quarantined, an identical one is a duplicate
        "flickr30k_tokens": {"read": 6, "kept": 3, "quarantined": 2, "duplicates": 1},
        "coco_captions": {"read": 4, "kept": 2, "quarantined": 1, "duplicates": 1},
    }
    for c in per_source.values():
        assert c["read"] == c["kept"] + c["quarantined"] + c["duplicates"] and c["unaccounted"] == 0
    reasons = sorted(q["reason"].split(" (")[0].split(" '")[0] for q in result.quarantine)
    assert reasons == ["conflicting duplicate caption_id", "empty caption", "empty caption", "empty caption",
                       "malformed line", "malformed record", "unknown style 7", "unpaired line"]
    examples = duplicate_examples(result)
    assert {name.split(":")[0]: e["count"] for name, e in examples.items()} == {
        "senticap_json": 1, "flickrstyle": 1, "flickr30k_tokens": 1, "coco_captions": 1}
    token_dup = next(e for name, e in examples.items() if name.startswith("flickr30k"))["examples"][0]
    assert token_dup["key"] == "caption_id" and token_dup["value"] == "flickr30k:1004.jpg#0"
    assert token_dup["file"].endswith("results.token") and token_dup["line"] == 3
    table = summary_lines(per_source)
    assert table[0].split() == ["source", "read", "=", "kept", "+", "quarantined", "+", "duplicates"]
    assert table[-1].split() == ["total", "23", "=", "11", "+", "8", "+", "4"]
