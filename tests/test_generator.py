"""Tests of the Generate step's generator (paper Eq. 5) with tiny GPT-2 / T5 built from configs and BERT2BERT.

Tiny models are built by ``create_generator_from_config`` (an offline tokenizer trained on real FlickrStyle10K humor
captions), saved, and loaded back through ``load_generator``, the loader a cluster uses. They learn to rebuild a
handful of captions from "[style phrase] [SEP] [content]", where the crude style phrase is a caption's last 25% of
words and the content the rest.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

from models.generator import (
    IGNORE_INDEX,
    MergeConstraint,
    clause_after_sentence,
    create_word_level_generator,
    SETTINGS_FILE,
    create_bert2bert_from_minilm,
    create_generator_from_config,
    encode_training_batch,
    exact_match,
    fine_tune,
    generate,
    load_generator,
    teacher_forced_metrics,
)
from models.backbones import minilm_path
from models.text import caption_words

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

HUMOR = Path(__file__).resolve().parents[2] / "shared" / "data" / "flickrstyle10k" / "funny_train.txt"
TINY = {
    "causal": {"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 96, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
               "attn_pdrop": 0.0},
    "seq2seq": {"d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 2,
                "dropout_rate": 0.0},
}
N_TRAIN = 8
#: the decoding these tests were written for (generate takes every decoding setting explicitly; the jobs pass
#: generate.decoding)
PLAIN = dict(seed=0, no_repeat_ngram_size=0, repetition_penalty=1.0)
GREEDY = dict(strategy="greedy", batch_size=32, fast=False, **PLAIN)


def split_phrase(caption: str) -> tuple[str, str]:
    """Crude extraction: the last 25% of words (at least one) are the style phrase, the rest the content."""
    words = caption_words(caption)
    k = max(1, round(0.25 * len(words)))
    return " ".join(words[-k:]), " ".join(words[:-k])


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models on a shared 2-core machine run many times faster on one thread than on two oversubscribed ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def captions() -> list[str]:
    if not HUMOR.is_file():
        pytest.skip(f"FlickrStyle10K humor captions not found at {HUMOR}")
    lines = HUMOR.read_text(encoding="utf-8").splitlines()[:400]
    return [" ".join(caption_words(line)) for line in lines]


@pytest.fixture(scope="module")
def train_set(captions: list[str]) -> tuple[list[str], list[str], list[str]]:
    caps = captions[:N_TRAIN]
    phrases, contents = zip(*(split_phrase(c) for c in caps))
    return list(phrases), list(contents), caps


def _trained(kind: str, captions: list[str], train_set, folder: Path, steps: int):
    create_generator_from_config(kind, captions, folder, vocab_size=700, config_overrides=TINY[kind], seed=0)
    gen = load_generator(kind, str(folder), device="cpu", max_source_len=48, max_target_len=48)
    phrases, contents, caps = train_set
    before = teacher_forced_metrics(gen, phrases, contents, caps)
    seen: list[int] = []
    result = fine_tune(gen, phrases, contents, caps, epochs=steps, batch_size=N_TRAIN, lr=3e-3, seed=0,
                       on_step=lambda step, m: seen.append(step))
    return gen, before, result, seen


@pytest.fixture(scope="module")
def causal(captions, train_set, tmp_path_factory):
    torch.manual_seed(0)
    return _trained("causal", captions, train_set, tmp_path_factory.mktemp("gpt2"), steps=60)


@pytest.fixture(scope="module")
def seq2seq(captions, train_set, tmp_path_factory):
    torch.manual_seed(0)
    return _trained("seq2seq", captions, train_set, tmp_path_factory.mktemp("t5"), steps=80)


def test_causal_labels_are_masked_on_prompt_and_padding(causal, train_set):
    gen = causal[0]
    phrases, contents, caps = train_set
    batch = encode_training_batch(gen, phrases[:3], contents[:3], caps[:3])
    tok = gen.tokenizer
    for row in range(3):
        source = gen.source_text(phrases[row], contents[row])
        prompt = tok(source + gen.sep.rstrip(), add_special_tokens=False).input_ids
        target = tok(" " + caps[row], add_special_tokens=False).input_ids + [tok.eos_token_id]
        labels, ids = batch["labels"][row].tolist(), batch["input_ids"][row].tolist()
        mask = batch["attention_mask"][row]
        n = len(prompt) + len(target)
        assert ids[:n] == prompt + target and int(mask.sum()) == n
        assert labels[: len(prompt)] == [IGNORE_INDEX] * len(prompt)
        assert labels[len(prompt) : n] == target
        assert labels[n:] == [IGNORE_INDEX] * (len(labels) - n)
    assert tok.decode(prompt).count("[SEP]") == 2  # phrase [SEP] content [SEP]


def test_seq2seq_labels_are_the_caption_with_eos(seq2seq, train_set):
    gen = seq2seq[0]
    phrases, contents, caps = train_set
    batch = encode_training_batch(gen, phrases[:4], contents[:4], caps[:4])
    for row in range(4):
        labels = [t for t in batch["labels"][row].tolist() if t != IGNORE_INDEX]
        assert labels[-1] == gen.tokenizer.eos_token_id
        assert gen.tokenizer.decode(labels, skip_special_tokens=True) == caps[row]
        assert gen.tokenizer.decode(batch["input_ids"][row], skip_special_tokens=True).split() == (
            phrases[row] + " " + contents[row]).split()


@pytest.mark.parametrize("fixture", ["causal", "seq2seq"])
def test_generator_learns_to_reconstruct_its_training_captions(fixture, request, train_set):
    gen, before, result, seen = request.getfixturevalue(fixture)
    phrases, contents, caps = train_set
    assert result.steps == len(seen) and seen == list(range(1, result.steps + 1))
    assert result.final_loss < 0.1 * result.first_loss
    after = teacher_forced_metrics(gen, phrases, contents, caps)
    assert after["loss"] < 0.1 * before["loss"] and after["token_accuracy"] > 0.95 > before["token_accuracy"]
    out = generate(gen, phrases, contents, max_new_tokens=40, **GREEDY)
    assert sum(o == c for o, c in zip(out, caps)) >= 6
    assert exact_match(out, caps) >= 6 / N_TRAIN


@pytest.mark.parametrize("fixture", ["causal", "seq2seq"])
def test_batched_generation_equals_one_by_one(fixture, request, captions):
    gen = request.getfixturevalue(fixture)[0]
    # Inputs of different lengths, so the batch is padded (on the left for the causal model).
    phrases, contents = zip(*(split_phrase(c) for c in captions[20:26]))
    batched = generate(gen, list(phrases), list(contents), batch_size=6, max_new_tokens=20, strategy="greedy",
                       fast=False, **PLAIN)
    single = [generate(gen, [p], [c], max_new_tokens=20, **GREEDY)[0] for p, c in zip(phrases, contents)]
    assert batched == single
    assert len({len(gen.tokenizer(gen.source_text(p, c)).input_ids) for p, c in zip(phrases, contents)}) > 1


def test_causal_prompts_are_cut_to_fit_the_positions(causal, captions, tmp_path):
    roomy = load_generator("causal", causal[0].save(tmp_path / "tiny"), device="cpu", max_source_len=80,
                           max_target_len=64)
    long_caption = " ".join(captions[:6])
    batch = encode_training_batch(roomy, ["funny"], [long_caption], [long_caption])
    assert batch["input_ids"].shape[1] == 96  # 96 - 64 = 32 prompt tokens, then the caption cut to 64
    assert (batch["labels"][0] != IGNORE_INDEX).sum() == 64
    assert roomy.tokenizer.decode(batch["input_ids"][0, 31]) == "[SEP]"
    assert fine_tune(roomy, ["funny"], [long_caption], [long_caption], lr=1e-5, batch_size=16, seed=0).steps == 1
    out = generate(roomy, ["funny"], [long_caption], max_new_tokens=70, **GREEDY)  # prompt cut to 26 tokens
    assert len(out) == 1 and isinstance(out[0], str)


def test_beam_and_sample_strategies(causal, train_set):
    gen = causal[0]
    phrases, contents, caps = train_set
    beam = generate(gen, phrases[:4], contents[:4], strategy="beam", num_beams=3, max_new_tokens=40, batch_size=32,
                    fast=False, **PLAIN)
    assert beam == caps[:4]  # a well-fit model: beam search finds the memorised caption too
    state = torch.random.get_rng_state()
    sampled = generate(gen, phrases[:4], ["a man"] * 4, strategy="sample", top_p=0.95, temperature=1.5, seed=3,
                       batch_size=32, no_repeat_ngram_size=0, repetition_penalty=1.0, fast=False)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is untouched
    assert sampled == generate(gen, phrases[:4], ["a man"] * 4, strategy="sample", top_p=0.95, temperature=1.5,
                               seed=3, batch_size=32, no_repeat_ngram_size=0, repetition_penalty=1.0, fast=False)
    assert len(sampled) == 4 and all(isinstance(s, str) and s for s in sampled)


def test_save_and_load_round_trip(causal, train_set, tmp_path):
    gen = causal[0]
    phrases, contents, _ = train_set
    path = gen.save(tmp_path / "saved")
    assert json.loads((Path(path) / SETTINGS_FILE).read_text()) == {"kind": "causal", "sep": " [SEP] ",
                                                                      "word_level": False}
    again = load_generator("causal", path, device="cpu", max_source_len=48, max_target_len=48)
    assert again.sep == gen.sep
    assert generate(again, phrases, contents, **GREEDY) == generate(gen, phrases, contents, **GREEDY)
    with pytest.raises(ValueError, match="holds a 'causal' generator"):
        load_generator("seq2seq", path, max_source_len=128, max_target_len=64)


def test_bad_input_is_rejected(causal, captions, tmp_path):
    gen = causal[0]
    with pytest.raises(ValueError, match="kind must be one of"):
        load_generator("diffusion", "x", max_source_len=128, max_target_len=64)
    with pytest.raises(ValueError, match="strategy must be one of"):
        generate(gen, ["funny"], ["a dog"], strategy="nucleus", batch_size=32, fast=False, **PLAIN)
    with pytest.raises(ValueError, match="same length"):
        generate(gen, ["funny", "silly"], ["a dog"], **GREEDY)
    with pytest.raises(ValueError, match="must hold strings"):
        fine_tune(gen, ["funny"], [None], ["a dog"], batch_size=16, seed=0)
    with pytest.raises(ValueError, match="num_beams >= 2"):
        generate(gen, ["funny"], ["a dog"], strategy="beam", num_beams=1, batch_size=32, fast=False, **PLAIN)
    with pytest.raises(ValueError, match="unknown GPT2Config keys"):
        create_generator_from_config("causal", captions, tmp_path, vocab_size=300, config_overrides={"n_layers": 2},
                                     seed=0)
    with pytest.raises(ValueError, match="95 output tokens leave no room for a prompt in the generator's 96"):
        generate(gen, ["funny"], ["a dog"], max_new_tokens=95, **GREEDY)
    with pytest.raises(OSError, match="create_generator_from_config"):
        load_generator("causal", str(tmp_path / "no-such-model"), max_source_len=128, max_target_len=64)


def test_bert2bert_warm_started_from_minilm_loads_and_learns(tmp_path, train_set):
    path = create_bert2bert_from_minilm(tmp_path / "b2b", seed=0)
    gen = load_generator("seq2seq", path, device="cpu", max_source_len=128, max_target_len=64)
    assert type(gen.model).__name__ == "EncoderDecoderModel"
    tok = gen.tokenizer
    assert gen.model.config.decoder_start_token_id == tok.cls_token_id and gen.eos_token_id == tok.sep_token_id
    # The encoder keeps MiniLM's pretrained weights.
    minilm = AutoModel.from_pretrained(minilm_path())
    assert torch.equal(gen.model.encoder.embeddings.word_embeddings.weight, minilm.embeddings.word_embeddings.weight)
    phrases, contents, caps = (x[:4] for x in train_set)
    batch = encode_training_batch(gen, phrases, contents, caps)
    labels = [t for t in batch["labels"][0].tolist() if t != IGNORE_INDEX]
    assert labels[0] != tok.cls_token_id and labels[-1] == tok.sep_token_id
    assert tok.decode(batch["input_ids"][0]).startswith(f"[CLS] {phrases[0]} [SEP]")
    before = teacher_forced_metrics(gen, phrases, contents, caps)["loss"]
    fine_tune(gen, phrases, contents, caps, epochs=2, batch_size=4, lr=3e-4, seed=0)
    assert teacher_forced_metrics(gen, phrases, contents, caps)["loss"] < 0.7 * before  # measured: 10.9 -> 4.4
    assert all(isinstance(s, str) for s in generate(gen, phrases, contents, max_new_tokens=8, **GREEDY))


# ------------------------------------------------------------------ word-level generator and constrained decoding
@pytest.fixture(scope="module")
def word_level(captions, train_set, tmp_path_factory):
    """A tiny word-level GPT-2 (embeddings from MiniLM) fitted on the training captions."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("word")
    create_word_level_generator(captions, folder, TINY["causal"], seed=0)
    gen = load_generator("causal", str(folder), device="cpu", max_source_len=48, max_target_len=48)
    phrases, contents, caps = train_set
    fine_tune(gen, phrases, contents, caps, epochs=60, batch_size=N_TRAIN, lr=3e-3, seed=0)
    return gen


def test_word_level_generator_has_one_token_per_word_and_learns(word_level, train_set, tmp_path):
    gen = word_level
    phrases, contents, caps = train_set
    assert gen.word_level and gen.tokenizer.tokenize(" " + caps[0]) == caps[0].split()
    assert exact_match(generate(gen, phrases, contents, max_new_tokens=40, **GREEDY), caps) >= 6 / N_TRAIN
    # Word embeddings start from MiniLM's: related words are closer than unrelated ones.
    fresh = load_generator("causal", create_word_level_generator(["dog dogs puppy car"] * 3 + caps, tmp_path / "w",
                                                                  TINY["causal"], seed=0), device="cpu",
 max_source_len=128, max_target_len=64)
    emb = fresh.model.get_input_embeddings().weight
    ids = fresh.tokenizer.convert_tokens_to_ids(["dog", "puppy", "car"])
    cos = torch.nn.functional.cosine_similarity
    assert cos(emb[ids[0]], emb[ids[1]], dim=0) > cos(emb[ids[0]], emb[ids[2]], dim=0)
    assert json.loads((Path(gen.save(tmp_path / "s")) / SETTINGS_FILE).read_text())["word_level"] is True


def _is_merge(out: list[str], content: list[str], phrase: list[str], skip: bool) -> bool:
    """True when ``out`` is ``content`` in order with (a subsequence of, when ``skip``) ``phrase`` merged in; "a" and
    "an" count as one word (decoding makes the article agree with the word placed after it)."""
    def article(words: list[str]) -> list[str]:
        return ["a" if w == "an" else w for w in words]

    out, content, phrase = article(out), article(content), article(phrase)
    ci = pi = 0
    for word in out:
        if ci < len(content) and word == content[ci]:
            ci += 1
        elif word in phrase[pi:] and (skip or phrase[pi] == word):
            pi = phrase.index(word, pi) + 1
        else:
            return False
    return ci == len(content) and (skip or pi == len(phrase))


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_merge_constraint_keeps_every_content_word_in_order_and_places_the_phrase(word_level, captions, strategy):
    gen = word_level
    phrases = ["in love", "to find his lost owner", "happily", "ugly"]
    factual = captions[100:104]
    out = generate(gen, phrases, factual, strategy=strategy, num_beams=3, constraint="merge", batch_size=32,
                   fast=False, **PLAIN)
    for o, p, f in zip(out, phrases, factual):
        assert _is_merge(o.split(), f.split(), p.split(), skip=False), (o, p, f)
    blocks = generate(gen, phrases, factual, strategy=strategy, num_beams=3, constraint="merge",
                      contiguous=[False, True, False, False], batch_size=32, fast=False, **PLAIN)
    clause, content = clause_after_sentence(phrases[1], factual[1])
    assert blocks[1].split() == content.split() + clause.split(), blocks[1]  # the clause, trailing
    for i in (0, 2, 3):
        assert _is_merge(blocks[i].split(), factual[i].split(), phrases[i].split(), skip=False), blocks[i]
    skipped = generate(gen, phrases, factual, strategy=strategy, num_beams=3, constraint="merge_skip", batch_size=32,
                       fast=False, **PLAIN)
    for o, p, f in zip(skipped, phrases, factual):
        assert _is_merge(o.split(), f.split(), p.split(), skip=True), (o, p, f)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_fast_decoding_writes_the_same_captions_as_the_plain_path(word_level, captions, strategy):
    """fast: clause inputs written without the model, the rest batched by length, the merge constraint advanced
    incrementally; every caption equals the plain path's, at a length cut too."""
    gen = word_level
    phrases = ["in love", "to find his lost owner", "happily", "ugly", "dreaming of the sea", "nice", "a a nice",
               "so cute"] * 2
    factual = captions[100:116]
    contiguous = [False, True, False, False, True, False, False, False] * 2
    for max_new_tokens in (40, 6):
        common = dict(strategy=strategy, num_beams=3, constraint="merge", contiguous=contiguous, batch_size=3,
                      max_new_tokens=max_new_tokens, **PLAIN)
        assert generate(gen, phrases, factual, fast=True, **common) == generate(gen, phrases, factual, fast=False,
                                                                                **common)
    skip = dict(strategy=strategy, num_beams=3, constraint="merge_skip", batch_size=5, **PLAIN)
    assert generate(gen, phrases, factual, fast=True, **skip) == generate(gen, phrases, factual, fast=False, **skip)


def test_incremental_merge_constraint_allows_what_the_scan_allows():
    contents, phrases = [[5, 6, 7], [5, 6]], [[8, 6, 9], [8, 9]]
    prefixes = [[], [5], [5, 8], [5, 6, 7], [5, 6, 7, 8], [5, 6, 7, 8, 6, 9], [5, 0], [8, 5, 9]]
    for contiguous in ([True, False], [False, False]):
        plain = MergeConstraint(contents, phrases, offset=0, beams=1, eos=0, contiguous=contiguous)
        fast = MergeConstraint(contents, phrases, offset=0, beams=1, eos=0, contiguous=contiguous, incremental=True)
        for length in range(0, 7):  # one step at a time, as generate() calls it: two inputs x every prefix
            batch = [(row, p[:length]) for row in (0, 1) for p in prefixes if len(p) >= length]
            for beam_rows in ([b for b in batch if b[0] == 0], [b for b in batch if b[0] == 1]):
                if not beam_rows:
                    continue
                ids = torch.tensor([p for _, p in beam_rows], dtype=torch.long).reshape(len(beam_rows), length)
                row = beam_rows[0][0]
                single_fast = MergeConstraint([contents[row]], [phrases[row]], offset=0, beams=len(beam_rows), eos=0,
                                              contiguous=[contiguous[row]], incremental=True)
                scores = torch.zeros((len(beam_rows), 12))
                got = single_fast(ids, scores)
                for k, (_, prefix) in enumerate(beam_rows):
                    expected = plain.allowed(row, prefix)
                    assert sorted(torch.nonzero(got[k] == 0).flatten().tolist()) == sorted(set(expected)), prefix
        assert fast.incremental and not plain.incremental


def test_graft_appends_the_phrase_before_the_closing_period():
    from models.generator import graft

    assert graft(["happily", "excellent"], ["a dog runs on the grass .", "a hydrant"]) == [
        "a dog runs on the grass happily .", "a hydrant excellent"]
    assert graft(["in love"], ["a couple on a bench"]) == ["a couple on a bench in love"]


def test_a_trailing_clause_continues_the_sentence():
    assert clause_after_sentence("hoping for a treat", "a dog in a room.") == ("hoping for a treat .", "a dog in a room")
    assert clause_after_sentence("to win", "a man runs !? ") == ("to win !?", "a man runs")
    assert clause_after_sentence("to win", "a man runs") == ("to win", "a man runs")
    assert clause_after_sentence("to win", " . ") == ("to win", " . ")


def test_merge_constraint_replays_what_was_generated():
    c = MergeConstraint([[5, 6, 7]], [[8, 9]], offset=0, beams=1, eos=0)
    assert c.allowed(0, []) == [5, 8]
    assert c.allowed(0, [5, 8]) == [6, 9]
    assert c.allowed(0, [5, 8, 6, 7]) == [9]
    assert c.allowed(0, [5, 8, 6, 7, 9]) == [0]
    skip = MergeConstraint([[5, 6]], [[8, 9]], offset=0, beams=1, eos=0, skip_phrase=True)
    assert skip.allowed(0, [5]) == [6, 8, 9] and skip.allowed(0, [5, 9, 6]) == [0]
    # a clause is one trailing block: the whole content, then the clause (the second input is not a clause)
    block = MergeConstraint([[5, 6, 7], [5, 6]], [[8, 6, 9], [8, 9]], offset=0, beams=1, eos=0,
                            contiguous=[True, False])
    assert block.allowed(0, []) == [5] and block.allowed(0, [5]) == [6] and block.allowed(0, [5, 6, 7]) == [8]
    assert block.allowed(0, [5, 6, 7, 8]) == [6]  # this 6 is the phrase's: the content is used up
    assert block.allowed(0, [5, 6, 7, 8, 6, 9]) == [0] and block.allowed(0, [5, 0]) == [0]
    assert block.allowed(1, [5, 8]) == [6, 9]
    with pytest.raises(ValueError, match="1 flags for 2 inputs"):
        MergeConstraint([[5], [6]], [[8], [9]], offset=0, beams=1, eos=0, contiguous=[True])


def test_source_words_constraint_and_unknown_words_are_copied_back(word_level):
    gen = word_level
    phrase, factual = "zorblax happily", "a dog with a qwertyuiop runs on the grass"
    out = generate(gen, [phrase], [factual], constraint="source_words", max_new_tokens=20, **GREEDY)[0].split()
    out = ["a" if w == "an" else w for w in out]  # the article agrees with the next word after decoding
    pool = (phrase + " " + factual).split()
    assert all(out.count(w) <= pool.count(w) for w in out)  # only input words, each at most as often
    merged = generate(gen, [phrase], [factual], constraint="merge", **GREEDY)[0].split()
    assert "qwertyuiop" in merged and "zorblax" in merged  # [UNK] tokens decode to the input's own words
    merged = ["a" if w == "an" else w for w in merged]
    assert [w for w in merged if w in factual.split()] == factual.split()


def test_no_repeat_ngrams_and_repetition_penalty_stop_loops(tmp_path, captions):
    torch.manual_seed(0)
    gen = load_generator("causal", create_word_level_generator(captions, tmp_path / "raw", TINY["causal"], seed=0),
                         device="cpu", max_source_len=128, max_target_len=64)  # untrained: free decoding loops
    looping = generate(gen, ["funny"] * 4, captions[:4], max_new_tokens=30, **GREEDY)
    fixed = generate(gen, ["funny"] * 4, captions[:4], max_new_tokens=30, no_repeat_ngram_size=2,
                     repetition_penalty=1.5, strategy="greedy", batch_size=32, seed=0, fast=False)

    def repeats(text: str) -> bool:
        w = text.split()
        grams = list(zip(w, w[1:]))
        return len(grams) != len(set(grams))

    assert any(repeats(t) for t in looping)
    assert not any(repeats(t) for t in fixed)
    with pytest.raises(ValueError, match="constraint must be one of"):
        generate(gen, ["funny"], ["a dog"], constraint="bag", **GREEDY)


def test_articles_agree_with_the_next_word():
    from models.generator import agree_articles

    words = "a excellent hydrant with an dog near a university an hour ago A apple".split()
    assert agree_articles(words) == "an excellent hydrant with a dog near a university an hour ago An apple".split()
