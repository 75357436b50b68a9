"""Tokenizers trained offline from a caption corpus, for generators built from a config (``init: config``).

Where no model hub is reachable there is no pretrained GPT-2 or T5 tokenizer to load, so a generator built from a
config gets one trained on the captions themselves with the ``tokenizers`` library:

- ``train_gpt2_tokenizer``: byte-level BPE as in GPT-2 (``<|endoftext|>`` is bos, eos and pad; no unknown tokens).
- ``train_t5_tokenizer``: Unigram over Metaspace pieces as in T5 (``<pad>`` = 0, ``</s>`` = 1, ``<unk>`` = 2, and
  ``</s>`` appended to every encoded text).
- ``train_word_tokenizer``: one token per caption word (whitespace split of normalised captions; ``<|endoftext|>``
  is bos, eos and pad, ``[UNK]`` the unknown word). A generator over whole words can only write words it has seen,
  and copying a word is one decision, not several pieces that may recombine into a non-word.

Both carry ``[SEP]`` as a special token, so the separator of "[style phrase] [SEP] [content]" (paper Eq. 5) is one
token and is dropped when generated text is decoded with ``skip_special_tokens``. Both return a
``PreTrainedTokenizerFast`` that ``save_pretrained`` writes and ``AutoTokenizer.from_pretrained`` loads back.
"""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SEP_TOKEN = "[SEP]"
GPT2_EOS = "<|endoftext|>"
T5_PAD, T5_EOS, T5_UNK = "<pad>", "</s>", "<unk>"
MIN_VOCAB_SIZE = 64


def _check_corpus(corpus: Iterable[str], vocab_size: int) -> list[str]:
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE}, got {vocab_size}")
    texts = [t for t in corpus if isinstance(t, str) and t.strip()]
    if not texts:
        raise ValueError("tokenizer corpus is empty: give at least one non-empty caption string")
    return texts


def _sep_token() -> AddedToken:
    # lstrip: "phrase [SEP] content" keeps no stray space token before the separator.
    return AddedToken(SEP_TOKEN, lstrip=True, rstrip=False, special=True)


def train_gpt2_tokenizer(
    corpus: Iterable[str], vocab_size: int, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a GPT-2 style byte-level BPE tokenizer on ``corpus`` (bos = eos = pad = ``<|endoftext|>``)."""
    texts = _check_corpus(corpus, vocab_size)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[GPT2_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([_sep_token()])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=GPT2_EOS, eos_token=GPT2_EOS, pad_token=GPT2_EOS, sep_token=SEP_TOKEN
    )


def train_t5_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a T5 style Unigram tokenizer on ``corpus`` (pad 0, eos 1, unk 2; ``</s>`` appended on encode)."""
    texts = _check_corpus(corpus, vocab_size)
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=[T5_PAD, T5_EOS, T5_UNK], unk_token=T5_UNK, show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([_sep_token()])
    eos_id = tok.token_to_id(T5_EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {T5_EOS}", pair=f"$A {T5_EOS} $B {T5_EOS}", special_tokens=[(T5_EOS, eos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=T5_PAD, eos_token=T5_EOS, unk_token=T5_UNK, sep_token=SEP_TOKEN
    )


WORD_UNK = "[UNK]"


def train_word_tokenizer(corpus: Iterable[str], min_frequency: int = 1,
                         max_vocab: int | None = None) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the whitespace words of ``corpus`` (normalised captions), most frequent first.

    Words seen fewer than ``min_frequency`` times, or beyond the ``max_vocab`` most frequent, map to ``[UNK]``.
    Decoding joins words with single spaces.
    """
    texts = _check_corpus(corpus, MIN_VOCAB_SIZE)
    counts: dict[str, int] = {}
    for text in texts:
        for word in text.split():
            counts[word] = counts.get(word, 0) + 1
    specials = [GPT2_EOS, WORD_UNK, SEP_TOKEN]
    words = sorted((w for w, c in counts.items() if c >= min_frequency and w not in specials),
                   key=lambda w: (-counts[w], w))
    if max_vocab is not None:
        words = words[: max(0, max_vocab - len(specials))]
    vocab = {token: i for i, token in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=WORD_UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with one space
    tok.add_special_tokens([AddedToken(GPT2_EOS, special=True), AddedToken(WORD_UNK, special=True), _sep_token()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=GPT2_EOS, eos_token=GPT2_EOS, pad_token=GPT2_EOS,
                                   unk_token=WORD_UNK, sep_token=SEP_TOKEN)


BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def train_bert_tokenizer(corpus: Iterable[str], vocab_size: int = 8000) -> PreTrainedTokenizerFast:
    """A BERT style uncased WordPiece tokenizer trained on ``corpus`` (``[PAD]`` 0, ``[UNK]`` 1, ``[CLS]`` 2,
    ``[SEP]`` 3, ``[MASK]`` 4; ``[CLS] text [SEP]`` on encode, token type ids as BERT's), for a BERT-family model
    built from a config where no pretrained vocabulary can be downloaded."""
    texts = _check_corpus(corpus, vocab_size)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(BERT_SPECIALS),
                                        show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id),
                                                                                 ("[SEP]", sep_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_input_names=[
                                       "input_ids", "token_type_ids", "attention_mask"])
