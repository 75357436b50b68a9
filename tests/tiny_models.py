"""Tiny models built from configs and saved the way their hub checkpoints are, so that tests load them by path
through the same code a cluster uses with bert-base-uncased, openai/clip-vit-base-patch32 or gpt2."""
from __future__ import annotations

from pathlib import Path

import torch


def save_tiny_clip(folder: Path, layers: int = 2) -> str:
    """A CLIP (vision patch 8 on 32 x 32 images, projection 16) with a real byte-level BPE CLIP tokenizer."""
    from tokenizers import pre_tokenizers
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    for symbol in alphabet + [symbol + "</w>" for symbol in alphabet]:
        vocab[symbol] = len(vocab)
    CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(folder)
    text = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                num_attention_heads=4, max_position_embeddings=77, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                  image_size=32, patch_size=8)
    torch.manual_seed(0)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return str(folder)


def save_tiny_bert(folder: Path) -> str:
    """A BERT backbone (2 layers, hidden 32, no head) with MiniLM's WordPiece tokenizer (bert-base-uncased's)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from models.backbones import minilm_path

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    folder.mkdir(parents=True, exist_ok=True)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
