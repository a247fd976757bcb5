"""Tiny random-weight models, saved like real model folders (plain Hugging Face or sentence-transformers)."""

from __future__ import annotations

import shutil
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def build_distilbert(dest: Path, tokenizer_from: Path) -> Path:
    """A plain (non-sentence-transformers) DistilBERT encoder: served through transformers."""
    import torch
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(7)
    config = DistilBertConfig(
        vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=128
    )
    return save_with_tokenizer(DistilBertModel(config), dest, tokenizer_from)


def save_with_tokenizer(model: Any, dest: Path, tokenizer_from: Path) -> Path:
    """A model folder as a hub download looks: weights, config and the embedded model's tokenizer."""
    model.eval().save_pretrained(dest)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_from / name, dest / name)
    return dest


# Tiny models of every native family (and one the transformers fallback serves), each with the
# tokenizer class its real models use, saved as plain Hugging Face or sentence-transformers folders.

MAX_TOKENS = 64  # the tiny models' longest input: a longer text is cut here
# Wide enough weights that a wrong position, head or bias moves the outputs far past 1e-5.
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "initializer_range": 0.2}
# Unicode the XLM-R tokenizer knows (accents, Cyrillic, CJK, one emoji); anything else is <unk>.
ALPHABET = (
    string.ascii_letters
    + string.digits
    + string.punctuation
    + "éèêçàâüöäñßïøå"
    + "абвгдежзийклмнопрстуфхцчшщыьэюя"
    + "日本語中文字"
    + "🙂"
)
WORDS = ("the", "warm", "pool", "model", "engine", "text", "Hello", "world")
QWEN3_MAX_TOKENS = 8 * MAX_TOKENS  # the Qwen3 tokenizer's limit (a folder's is also bound by its positions)
QWEN3_QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"


@dataclass(frozen=True)
class Tiny:
    """One tiny model folder: its family, its head, and the sentence-transformers modules after it."""

    family: str  # model_type
    labels: int = 0  # a sequence classifier with this many labels (a plain HF folder); 0: an encoder
    pooling: str = "mean"
    dense: tuple[tuple[int, str, bool, bool], ...] = ()  # Dense modules: out_features, activation, bias, residual
    normalize: bool = False
    safetensors: bool = True  # the Dense weights as model.safetensors, else as pytorch_model.bin
    config: dict[str, Any] = field(default_factory=dict)  # config values beyond the family's
    prompts: dict[str, str] = field(default_factory=dict)  # sentence-transformers' named prompts
    causal_lm: bool = False  # a …ForCausalLM, as a plain HF folder (Qwen3-Reranker's layout)

    @property
    def plain(self) -> bool:
        """Saved as a plain Hugging Face folder, without sentence-transformers modules."""
        return bool(self.labels) or self.causal_lm


TINY: dict[str, Tiny] = {
    "xlm-roberta": Tiny("xlm-roberta", pooling="cls", dense=((16, "Tanh", True, False),), normalize=True),
    "roberta": Tiny("roberta", pooling="mean_sqrt_len_tokens"),
    "mpnet": Tiny("mpnet", dense=((24, "GELU", True, True),), normalize=True),
    "bert": Tiny(
        "bert",
        pooling="weightedmean",
        dense=((24, "ReLU", False, False), (24, "Identity", True, True)),
        normalize=True,
        safetensors=False,
    ),
    "distilbert": Tiny("distilbert", pooling="max", dense=((16, "Tanh", True, False),)),
    "xlm-roberta-reranker": Tiny("xlm-roberta", labels=1),
    "mpnet-classifier": Tiny("mpnet", labels=3),
    "modernbert": Tiny("modernbert", dense=((20, "SiLU", True, False),), normalize=True),
    # biases everywhere (real ones have none) and mean pooling before the head
    "modernbert-reranker": Tiny(
        "modernbert",
        labels=1,
        config={"attention_bias": True, "mlp_bias": True, "norm_bias": True, "classifier_pooling": "mean"},
    ),
    # EmbeddingGemma's modules: mean pooling, two Dense modules without bias or activation, Normalize
    "embeddinggemma": Tiny(
        "gemma3_text",
        dense=((64, "Identity", False, False), (24, "Identity", False, False)),
        normalize=True,
        prompts={"query": "task: search result | query: ", "document": "title: none | text: "},
    ),
    # nomic-embed-text's modules (mean pooling, Normalize) and prompts; gte-base-en-v1.5's (CLS pooling)
    "nomic-bert": Tiny(
        "nomic_bert", normalize=True, prompts={"query": "search_query: ", "document": "search_document: "}
    ),
    "gte": Tiny("gte", pooling="cls", normalize=True),
    # Qwen3-Embedding's modules (last token, Normalize) and prompts
    "qwen3": Tiny("qwen3", pooling="lasttoken", normalize=True, prompts={"query": QWEN3_QUERY, "document": ""}),
    # Qwen3-Reranker's layout: a Qwen3ForCausalLM whose LM head is its embeddings (as the 0.6B's) ...
    "qwen3-reranker": Tiny("qwen3", causal_lm=True, config={"tie_word_embeddings": True}),
    # ... or a head of its own (as the 8B's); biases on q, k, v and o too (real ones have none)
    "qwen3-reranker-untied": Tiny(
        "qwen3", causal_lm=True, config={"tie_word_embeddings": False, "attention_bias": True}
    ),
}

# model_type -> transformers' class name stem and the config keys it differs in
_CLASSES = {
    "xlm-roberta": ("XLMRoberta", {"type_vocab_size": 1, "intermediate_size": 64}),
    "roberta": ("Roberta", {"type_vocab_size": 1, "intermediate_size": 64}),
    "mpnet": ("MPNet", {"intermediate_size": 64}),
    "bert": ("Bert", {"intermediate_size": 64}),
    # 4 layers: global attention in the first and the last; a local window of 8 each way (16 in all);
    # the special tokens of the BERT vocabulary it is given
    "modernbert": (
        "ModernBert",
        {
            "intermediate_size": 48,
            "num_hidden_layers": 4,
            "global_attn_every_n_layers": 3,
            "local_attention": 16,
            **{f"{name}_token_id": 101 for name in ("cls", "bos")},
            **{f"{name}_token_id": 102 for name in ("sep", "eos")},
        },
    ),
    # bidirectional; grouped queries (4 heads on 2 key/value heads) of a head size that is not
    # hidden / heads, scaled by a query_pre_attn_scalar that is not the head size; sliding layers
    # (a window of 16: 8 each way) around a global one, each kind with its own rotary base
    "gemma3_text": (
        "Gemma3Text",
        {
            "intermediate_size": 48,
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "use_bidirectional_attention": True,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
        },
    ),
    # token types (BERT's tokenizer gives them) and a rotary base that is not the default
    "nomic_bert": (
        "NomicBert",
        {
            "intermediate_size": 48,
            "type_vocab_size": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
        },
    ),
    # no token types, as gte-base-en-v1.5; biases jittered off zero like every weight
    "gte": (
        "Gte",
        {
            "intermediate_size": 48,
            "type_vocab_size": 0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
        },
    ),
    # grouped queries (4 heads on 2 key/value heads) of a head size that is not hidden / heads; a
    # rotary base that is not the default
    "qwen3": (
        "Qwen3",
        {
            "intermediate_size": 48,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5_000.0},
        },
    ),
}


def build_tiny(dest: Path, name: str, model_dir: Path) -> Path:
    """TINY[name] at `dest`: random weights from a fixed seed, the embedded model's vocabulary where
    the family's tokenizer is WordPiece."""
    import torch

    spec = TINY[name]
    seed = sorted(TINY).index(name)
    torch.manual_seed(seed)
    if spec.family == "distilbert":
        encoder = build_distilbert(dest.with_name(f"{name}-hf"), model_dir)
    else:
        encoder = build_hf(dest if spec.plain else dest.with_name(f"{name}-hf"), spec, model_dir, seed)
    if spec.plain:
        return encoder
    return build_sentence_transformer(dest, encoder, spec)


def _tokenizer(family: str, model_dir: Path) -> Any:
    if family in ("xlm-roberta", "roberta"):
        return xlm_roberta_tokenizer()
    if family == "mpnet":
        return mpnet_tokenizer(model_dir)
    if family == "gemma3_text":
        return gemma_tokenizer()
    if family == "qwen3":
        return qwen3_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, model_max_length=MAX_TOKENS)


def build_hf(dest: Path, spec: Tiny, model_dir: Path, seed: int) -> Path:
    """A plain Hugging Face folder (weights, config, tokenizer): the base encoder, or its sequence
    classifier."""
    import transformers

    stem, extra = _CLASSES[spec.family]
    tokenizer = _tokenizer(spec.family, model_dir)
    config = getattr(transformers, f"{stem}Config")(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        max_position_embeddings=MAX_TOKENS + tokenizer.pad_token_id + 1,  # RoBERTa's positions start past it
        **({"num_labels": spec.labels} if spec.labels else {}),
        **{**SMALL, **extra, **spec.config},
    )
    head = "ForCausalLM" if spec.causal_lm else "ForSequenceClassification" if spec.labels else "Model"
    model = getattr(transformers, stem + head)(config)
    jitter(model, seed).eval().save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def build_sentence_transformer(dest: Path, encoder: Path, spec: Tiny) -> Path:
    """`encoder` under sentence-transformers' modules: Transformer, Pooling, the Dense modules, Normalize."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    transformer = Transformer(str(encoder), max_seq_length=MAX_TOKENS)
    width = transformer.get_embedding_dimension()
    modules: list[Any] = [transformer, Pooling(width, pooling_mode=spec.pooling)]
    for out, activation, bias, residual in spec.dense:
        act = getattr(torch.nn, activation)()
        modules.append(Dense(width, out, bias=bias, activation_function=act, use_residual=residual))
        width = out
    if spec.normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu", prompts=spec.prompts or None)
    model.save(str(dest), safe_serialization=spec.safetensors, create_model_card=False)  # README: ~0.1 s
    return dest


def xlm_roberta_tokenizer() -> Any:
    """A sentencepiece-style Unigram tokenizer from a fixed vocabulary (no training: the same ids every
    time), in XLM-R's layout: <s>=0, <pad>=1, </s>=2, <unk>=3 ... <mask> last."""
    from transformers import XLMRobertaTokenizer

    pieces = [*(f"▁{w}" for w in WORDS), "▁", *(f"▁{c}" for c in ALPHABET), *ALPHABET]
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(piece, -1.0 - 0.01 * i) for i, piece in enumerate(pieces)] + [("<mask>", 0.0)]
    return XLMRobertaTokenizer(vocab=vocab, model_max_length=MAX_TOKENS)


def gemma_tokenizer() -> Any:
    """Gemma's byte-fallback BPE tokenizer from a fixed vocabulary (the same ids every time), in
    Gemma's layout: <pad>=0, <eos>=1, <bos>=2; <bos> before a text and <eos> after it, as
    EmbeddingGemma's tokenizer adds them. Characters outside ALPHABET fall back to their bytes."""
    from transformers import GemmaTokenizer

    vocab = {token: i for i, token in enumerate(("<pad>", "<eos>", "<bos>", "<unk>", "<mask>"))}
    vocab.update({f"<0x{byte:02X}>": len(vocab) + byte for byte in range(256)})
    for char in ("▁", *ALPHABET):
        vocab.setdefault(char, len(vocab))
    merges = []
    for word in WORDS:  # "▁" + the word, one character at a time
        piece = "▁"
        for char in word:
            merges.append((piece, char))
            piece += char
            vocab.setdefault(piece, len(vocab))
    return GemmaTokenizer(
        vocab=vocab,
        merges=merges,
        add_bos_token=True,
        add_eos_token=True,
        padding_side="right",
        model_max_length=MAX_TOKENS,
    )


def qwen3_tokenizer() -> Any:
    """Qwen's byte-level BPE tokenizer from a fixed vocabulary (the 256 byte symbols, then WORDS and
    the reranker's words, merged one character at a time), with Qwen3's special tokens after it
    (<|endoftext|>, <|im_start|>, <|im_end|>) and Qwen3-Embedding's post-processor, which puts
    <|endoftext|> after every text. Its limit is QWEN3_MAX_TOKENS: the reranker's prompt alone is ~150
    of its tokens (an embedding folder's sentence-transformers config still cuts at MAX_TOKENS)."""
    from tokenizers import processors
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    merges: list[tuple[str, str]] = []
    for word in (*WORDS, "yes", "no", "Query", "Document", "Instruct"):
        for piece in (word, "Ġ" + word):  # Ġ: a space before it
            for end in range(2, len(piece) + 1):
                merge = (piece[: end - 1], piece[end - 1])
                if merge not in merges:
                    merges.append(merge)
                vocab.setdefault(piece[:end], len(vocab))
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, model_max_length=QWEN3_MAX_TOKENS)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A:0 <|endoftext|>:0",
        pair="$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", eos)],
    )
    return tokenizer


def mpnet_tokenizer(vocab_from: Path) -> Any:
    """MPNet's WordPiece tokenizer on the embedded model's BERT vocabulary, MPNet's special tokens
    first (<s>=0, <pad>=1, </s>=2, <unk>=3) as in all-mpnet-base-v2."""
    from transformers import MPNetTokenizer

    words = (vocab_from / "vocab.txt").read_text().splitlines()
    tokens = ["<s>", "<pad>", "</s>", "<unk>", *words, "<mask>"]
    return MPNetTokenizer(vocab={t: i for i, t in enumerate(tokens)}, model_max_length=MAX_TOKENS)


def jitter(model: Any, seed: int) -> Any:
    """Random values in every parameter, LayerNorm scales and biases included (init leaves those at
    1 and 0, where a swapped or dropped one would go unnoticed)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)
    return model


class TinyFolders:
    """TINY's folders under `root`, each built the first time it is asked for."""

    def __init__(self, root: Path, model_dir: Path) -> None:
        self.root, self.model_dir = root, model_dir
        self._built: dict[str, Path] = {}

    def __getitem__(self, name: str) -> Path:
        if name not in self._built:
            self._built[name] = build_tiny(self.root / name, name, self.model_dir)
        return self._built[name]
