"""Tiny random-weight CLIP and SigLIP folders, saved as transformers saves them (weights, config,
tokenizer.json or SigLIP's spiece.model, preprocessor_config.json), built offline; and images made in
the test. A CLIP folder can also take a real model's shapes (VIT_B_32, for bench.images), still with
random weights."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.tiny_models import WORDS, jitter, xlm_roberta_tokenizer

# Small, but every part present: 2 layers a tower, 4 heads, a projection narrower than the towers.
TEXT = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4}
VISION = {**TEXT, "image_size": 32, "patch_size": 8}


@dataclass(frozen=True)
class ClipShape:
    """A CLIP folder's shapes: each tower's config keys, the projection's width, the text positions
    (and the tokenizer's limit), and the processor's resize (its crop is the image tower's square)."""

    text: dict[str, int] = field(default_factory=lambda: dict(TEXT))
    vision: dict[str, int] = field(default_factory=lambda: dict(VISION))
    projection: int = 24
    positions: int = 16
    shortest_edge: int = 40  # then a 32 x 32 crop: both steps do something to every test image


# openai/clip-vit-base-patch32's shapes; its vocabulary's size, which covers clip_tokenizer's few ids
VIT_B_32 = ClipShape(
    text={
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 8,
        "vocab_size": 49408,
    },
    vision={
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "image_size": 224,
        "patch_size": 32,
    },
    projection=512,
    positions=77,
    shortest_edge=224,
)


def clip_tokenizer(max_length: int = 16) -> Any:
    """CLIP's byte-level BPE (words end in </w>) from a fixed vocabulary: the byte symbols, WORDS merged
    one character at a time, then <|startoftext|> and <|endoftext|> last (the highest ids, as in
    openai/clip-vit-base-patch32), added around every text."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate([*symbols, *(f"{s}</w>" for s in symbols)])}
    merges: list[tuple[str, str]] = []
    for word in WORDS:
        piece = word.lower()[0]
        for i, char in enumerate(word.lower()[1:], start=2):
            part = char + ("</w>" if i == len(word) else "")
            if (piece, part) not in merges:
                merges.append((piece, part))
            piece += part
            vocab.setdefault(piece, len(vocab))
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=max_length)


def build_clip(dest: Path, seed: int = 21, legacy_eos: bool = False, shape: ClipShape | None = None) -> Path:
    """A CLIPModel: causal text tower pooled at its end-of-text token (with `legacy_eos`, the config's
    eos_token_id is 2, as folders from before transformers fixed it: the highest id is pooled); the
    tiny shapes unless `shape` says otherwise."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    shape = shape or ClipShape()
    tokenizer = clip_tokenizer(shape.positions)
    eos = 2 if legacy_eos else tokenizer.eos_token_id
    text = {"vocab_size": len(tokenizer), **shape.text, "max_position_embeddings": shape.positions}
    text.update(eos_token_id=eos, bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id)
    config = CLIPConfig(text_config=text, vision_config=shape.vision, projection_dim=shape.projection)
    torch.manual_seed(seed)
    jitter(CLIPModel(config), seed).eval().save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    crop = shape.vision["image_size"]
    processor = CLIPImageProcessor(
        size={"shortest_edge": shape.shortest_edge}, crop_size={"height": crop, "width": crop}
    )
    processor.save_pretrained(dest)
    return dest


# What the sentencepiece model of build_siglip(spm=True) is trained on: words with case, punctuation,
# accents, Greek (final sigma), Cyrillic, CJK, digits; characters outside it encode as <unk>.
SPM_CORPUS = (
    "A photo of a cat, a dog and two birds! The warm pool serves models.",
    "Hello world: the engine encodes text quickly; résumé, café, naïve, Über, smörgåsbord.",
    "ΟΔΟΣ σας Σίσυφος οδός. Привет мир, как дела? 東京 タワー 日本語 中文字.",
    "Numbers 12345 and 3.14, e-mail someone@example.com (parens) [brackets] {braces} #tag 50% off.",
    "“Quotes” and ‘single’ ones… ellipsis — dash – and the ends of lines.",  # noqa: RUF001
    "Tags <b>bold</b> and a -> b, x < y > z.",  # "<", "/" and ">" in the vocabulary, as in google/siglip-*'s
)


def train_spm(**options: Any) -> bytes:
    """A sentencepiece model trained on SPM_CORPUS, with nmt_nfkc normalisation unless `options` name
    another (deterministic: the same pieces every time)."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SPM_CORPUS * 3),
        model_writer=model,
        vocab_size=160,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
        **{"normalization_rule_name": "nmt_nfkc", **options},
    )
    return model.getvalue()


def siglip_spm_tokenizer(folder: Path, max_length: int) -> Any:
    """SigLIP's tokenizer as google/siglip-* ship it: a sentencepiece Unigram model (spiece.model, nmt_nfkc
    normalisation, T5's layout: <pad>=0, </s>=1, <unk>=2) trained here on SPM_CORPUS, loaded by
    transformers' SiglipTokenizer, which saves spiece.model and tokenizer_config.json into `folder`
    (no tokenizer.json). Training is deterministic: the same ids every time."""
    from transformers import SiglipTokenizer

    model = train_spm(model_type="unigram", character_coverage=1.0, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spiece.model").write_bytes(model)
    tokenizer = SiglipTokenizer(vocab_file=str(folder / "spiece.model"), model_max_length=max_length)
    tokenizer.save_pretrained(folder)
    (folder / "tokenizer.json").unlink(missing_ok=True)
    return tokenizer


def build_siglip(dest: Path, seed: int = 22, spm: bool = False) -> Path:
    """A SiglipModel: bidirectional text tower pooled at its last token through a head, image tower
    pooled by attention. Its tokenizer is a Unigram one in tokenizer.json (16 positions); with `spm`,
    sentencepiece's spiece.model alone, as real SigLIP folders ship it (64 positions, as theirs)."""
    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    positions = 64 if spm else 16
    tokenizer = siglip_spm_tokenizer(dest, positions) if spm else xlm_roberta_tokenizer()
    text = {**TEXT, "vocab_size": len(tokenizer), "max_position_embeddings": positions, "projection_size": 32}
    text.update(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    text.update(bos_token_id=tokenizer.bos_token_id)
    config = SiglipConfig(text_config=text, vision_config=VISION)
    torch.manual_seed(seed)
    jitter(SiglipModel(config), seed).eval().save_pretrained(dest)
    if not spm:
        tokenizer.model_max_length = positions
        tokenizer.save_pretrained(dest)
    SiglipImageProcessor(size={"height": 32, "width": 32}, resample=2).save_pretrained(dest)  # bilinear
    return dest


def image_bytes(fmt: str, size: tuple[int, int] = (48, 40), mode: str = "RGB", seed: int = 0) -> bytes:
    """A noisy image encoded as `fmt` (PNG, JPEG, WEBP): noise, so that every pixel matters."""
    import numpy as np
    from PIL import Image

    channels = len(mode) if mode != "L" else 1
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode=mode)
    out = io.BytesIO()
    image.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()
