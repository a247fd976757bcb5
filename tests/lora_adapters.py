"""PEFT LoRA adapters of tiny models (tests/tiny_models.py), as teams save them after fine-tuning a
sentence-transformers embedder (or a classifier or reranker, with its head), and sentence-transformers +
PEFT's vectors (transformers + PEFT's logits) with one active: the reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

BERT_TARGETS = ("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense")


def _with_lora(base: Path, seed: int, config: dict[str, Any], encoder: str) -> tuple[Any, Any]:
    """The base's sentence-transformers model (`encoder`: SentenceTransformer, SparseEncoder,
    MultiVectorEncoder) with a fresh LoRA adapter on its transformers model (a SPLADE's: the masked LM,
    its head included): random A and B (PEFT starts B at zero, which would make the update vanish)."""
    import sentence_transformers
    import torch
    from peft import LoraConfig, get_peft_model

    model = getattr(sentence_transformers, encoder)(str(base), device="cpu")
    transformer = model[0]
    peft_model = get_peft_model(transformer.auto_model, LoraConfig(**{"target_modules": list(BERT_TARGETS), **config}))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    transformer.model = peft_model.eval()
    return model, peft_model


def build_adapter(dest: Path, base: Path, seed: int, encoder: str = "SentenceTransformer", **config: Any) -> Path:
    """A PEFT folder (adapter_config.json, adapter_model.safetensors) of a LoRA adapter on `base`, a folder
    sentence-transformers' `encoder` class loads."""
    _, peft_model = _with_lora(base, seed, {"r": 4, "lora_alpha": 8, **config}, encoder)
    save_adapter(peft_model, dest)
    return dest


def with_adapter(base: Path, adapter: Path | None, encoder: str = "SentenceTransformer") -> Any:
    """sentence-transformers' `encoder` of `base` with the adapter loaded by PEFT onto its transformers model."""
    import sentence_transformers
    from peft import PeftModel

    model = getattr(sentence_transformers, encoder)(str(base), device="cpu")
    if adapter is not None:
        model[0].model = PeftModel.from_pretrained(model[0].model, str(adapter)).eval()
    return model


def reference(base: Path, adapter: Path, texts: list[str]) -> Any:
    """sentence-transformers' vectors of `texts` with the adapter loaded by PEFT onto `base`."""
    return with_adapter(base, adapter).encode(texts)


def sparse_reference(base: Path, adapter: Path | None, texts: list[str]) -> Any:
    """SparseEncoder's [texts, vocabulary] weights with the adapter on its masked LM, as dense numpy."""
    return with_adapter(base, adapter, "SparseEncoder").encode(texts, convert_to_tensor=True).to_dense().numpy()


def multi_vector_reference(base: Path, adapter: Path | None, texts: list[str], role: str) -> list[Any]:
    """MultiVectorEncoder's token vectors of queries or documents (`role`) with the adapter on its encoder."""
    model = with_adapter(base, adapter, "MultiVectorEncoder")
    encode = model.encode_query if role == "query" else model.encode_document
    return list(encode(texts, convert_to_numpy=True))


# PEFT's task type -> the transformers class it is trained on
_TASK_MODELS = {"SEQ_CLS": "AutoModelForSequenceClassification", "CAUSAL_LM": "AutoModelForCausalLM"}


def build_head_adapter(dest: Path, base: Path, seed: int, **config: Any) -> Path:
    """A PEFT folder of a fine-tuned classifier or reranker: `base` a sequence classifier, PEFT's SEQ_CLS
    task (which saves the classifier head whole: modules_to_save), LoRA on q and v; random A and B, and
    the head's values moved (the saved copy starts as the base's). task_type="CAUSAL_LM": a yes/no
    reranker's (Qwen3-Reranker's), which saves no head."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    lora = {"task_type": "SEQ_CLS", "target_modules": ["query", "value"], "r": 4, "lora_alpha": 8, **config}
    model = getattr(transformers, _TASK_MODELS[lora["task_type"]]).from_pretrained(str(base))
    peft_model = get_peft_model(model, LoraConfig(**lora))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
            elif "modules_to_save" in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.5)
    save_adapter(peft_model, dest)
    return dest


def _classifier(base: Path, adapter: Path | None) -> Any:
    """transformers' sequence classifier `base`, with PEFT's adapter loaded onto it (None: the base alone)."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(base))
    return (model if adapter is None else PeftModel.from_pretrained(model, str(adapter))).eval()


def head_reference(base: Path, adapter: Path | None, ids: list[list[int]], types: list[list[int]] | None) -> Any:
    """transformers + PEFT's logits of these token ids (padded, masked) with the adapter on `base` (None: the
    base's), as float32 numpy [inputs, labels]."""
    import torch

    model = _classifier(base, adapter)
    longest = max(len(row) for row in ids)
    mask = torch.tensor([[1] * len(row) + [0] * (longest - len(row)) for row in ids])
    pad = model.config.pad_token_id or 0
    inputs = {"input_ids": torch.tensor([row + [pad] * (longest - len(row)) for row in ids]), "attention_mask": mask}
    if types is not None:
        inputs["token_type_ids"] = torch.tensor([row + [0] * (longest - len(row)) for row in types])
    with torch.no_grad():
        return model(**inputs).logits.float().numpy()


def text_reference(base: Path, adapter: Path | None, texts: list[str], pairs: list[str] | None = None) -> Any:
    """transformers + PEFT's logits of texts (or of (text, pair) pairs, as a CrossEncoder reads them), tokenized
    by the base's tokenizer, as float64 numpy [inputs, labels]."""
    import torch
    from transformers import AutoTokenizer

    batch = AutoTokenizer.from_pretrained(str(base))(texts, pairs, padding=True, return_tensors="pt")
    with torch.no_grad():
        return _classifier(base, adapter)(**batch).logits.double().numpy()


def save_adapter(peft_model: Any, dest: Path) -> None:
    """PEFT's save_pretrained without the README model card it renders each time (~40 ms of jinja)."""
    with mock.patch.object(type(peft_model), "create_or_update_model_card", lambda self, output_dir: None):
        peft_model.save_pretrained(str(dest))
