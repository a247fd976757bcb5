"""Named prompts (sentence-transformers' `prompts`): the text put before each input, chosen per
request by name (`prompt_name`) or by Cohere's `input_type`, else the model's default prompt."""

from __future__ import annotations

import json

from common.modelfolder import ModelFolder
from server.http.errors import bad_request

# Cohere's input types and the prompt names models use for the same role, most specific first.
COHERE_INPUT_TYPES: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "corpus"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def prompt_text(folder: ModelFolder, name: str | None) -> str:
    """The text of the prompt `name` (the model's default prompt when None; "" when it has none);
    a 400 naming the available prompts for a name the model does not have."""
    if name is None:
        name = folder.default_prompt_name
        if name is None:
            return ""
    if name not in folder.prompts:
        available = json.dumps(sorted(folder.prompts))
        raise bad_request(
            f"prompt_name '{name}' is not a prompt of this model. Available prompts: {available}", "prompt_name"
        )
    return folder.prompts[name]


def prompt_for_input_type(folder: ModelFolder, input_type: str | None) -> str:
    """Cohere's `input_type` as the model's matching prompt: the prompt of that very name, or of a
    name models use for the same role (search_query -> query); the default prompt when the model
    has none for it, since every Cohere v3 call names an input type."""
    if input_type is not None:
        for name in (input_type, *COHERE_INPUT_TYPES.get(input_type, ())):
            if name in folder.prompts:
                return folder.prompts[name]
    return prompt_text(folder, None)
