"""Qwen3-Reranker's scoring as its model card writes it, with transformers: the reference the native
reranker is checked against. The template is spelt out here, apart from warmpool's copy of it."""

from __future__ import annotations

from pathlib import Path

PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def model_card_prompts(folder: Path, pairs: list[tuple[str, str]], max_length: int) -> list[list[int]]:
    """Each pair's token ids: the formatted text through the tokenizer (its special tokens added, cut to
    what the prefix and suffix leave of max_length), between the prefix's and the suffix's tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    prefix = tokenizer.encode(PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(SUFFIX, add_special_tokens=False)
    texts = [f"<Instruct>: {INSTRUCTION}\n<Query>: {query}\n<Document>: {doc}" for query, doc in pairs]
    room = max_length - len(prefix) - len(suffix)
    bodies = tokenizer(texts, truncation="longest_first", max_length=room)["input_ids"]
    return [prefix + body + suffix for body in bodies]


def model_card_scores(folder: Path, prompts: list[list[int]], adapter: Path | None = None) -> list[float]:
    """P(yes): the softmax over the "no" and "yes" logits of Qwen3ForCausalLM at each prompt's last
    token, one prompt at a time (no padding to get wrong); with PEFT's `adapter` loaded onto it if given."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    no, yes = tokenizer.convert_tokens_to_ids("no"), tokenizer.convert_tokens_to_ids("yes")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = (model if adapter is None else PeftModel.from_pretrained(model, str(adapter))).eval()
    scores = []
    with torch.inference_mode():
        for ids in prompts:
            logits = model(torch.tensor([ids])).logits[0, -1]
            scores.append(float(torch.log_softmax(logits[[no, yes]], dim=0)[1].exp()))
    return scores
