"""The peers' response schemas, field for field, where no installed client carries them: Text
Embeddings Inference's (its OpenAPI document, v1.7) and vLLM's (its pooling entrypoints'
response models, v0.32), and Jina's rerank answer. Written out here as pydantic models in which
every field the peer sends is required (a field a peer fills with a default still reaches its
clients) and extra fields are allowed, as clients ignore them.

OpenAI's, Cohere's and Infinity's schemas come from their own client packages (tests/app/test_schemas.py).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, RootModel, StrictBool, StrictFloat, StrictInt, StrictStr

Number = StrictFloat | StrictInt  # JSON numbers: a whole float may arrive as an integer


class Schema(BaseModel):
    model_config = ConfigDict(extra="allow")


# Text Embeddings Inference


class TEIEmbeddingModel(Schema):
    pooling: StrictStr


class TEIClassifierModel(Schema):
    id2label: dict[str, StrictStr]
    label2id: dict[str, StrictInt]


class TEIEmbeddingType(Schema):
    embedding: TEIEmbeddingModel


class TEIClassifierType(Schema):
    classifier: TEIClassifierModel


class TEIRerankerType(Schema):
    reranker: TEIClassifierModel


class TEIInfo(Schema):
    model_id: StrictStr
    model_sha: StrictStr | None = None
    model_dtype: StrictStr
    model_type: TEIEmbeddingType | TEIClassifierType | TEIRerankerType
    max_concurrent_requests: StrictInt
    max_input_length: StrictInt
    max_batch_tokens: StrictInt
    max_batch_requests: StrictInt | None = None
    max_client_batch_size: StrictInt
    auto_truncate: StrictBool
    tokenization_workers: StrictInt
    version: StrictStr
    sha: StrictStr | None = None
    docker_label: StrictStr | None = None


class TEIPrediction(Schema):
    score: Number
    label: StrictStr


class TEIRank(Schema):
    index: StrictInt
    score: Number
    text: StrictStr | None = None


class TEISparseValue(Schema):
    index: StrictInt
    value: Number


class TEISimpleToken(Schema):
    id: StrictInt
    text: StrictStr
    special: StrictBool
    start: StrictInt | None
    stop: StrictInt | None


TEIEmbedResponse = RootModel[list[list[Number]]]
TEIEmbedAllResponse = RootModel[list[list[list[Number]]]]
TEIEmbedSparseResponse = RootModel[list[list[TEISparseValue]]]
TEIPredictResponse = RootModel[list[TEIPrediction] | list[list[TEIPrediction]]]
TEIRerankResponse = RootModel[list[TEIRank]]
TEISimilarityResponse = RootModel[list[Number]]
TEITokenizeResponse = RootModel[list[list[TEISimpleToken]]]
TEIDecodeResponse = RootModel[list[StrictStr]]


class TEIError(Schema):
    error: StrictStr
    error_type: StrictStr


# vLLM


class VLLMUsage(Schema):
    prompt_tokens: StrictInt
    total_tokens: StrictInt


class VLLMEmbeddingData(Schema):
    index: StrictInt
    object: StrictStr
    embedding: list[Number] | StrictStr


class VLLMEmbeddingResponse(Schema):
    id: StrictStr
    object: StrictStr
    created: StrictInt
    model: StrictStr
    data: list[VLLMEmbeddingData]
    usage: VLLMUsage


class VLLMPoolingData(Schema):
    index: StrictInt
    object: StrictStr
    data: list[list[Number]] | list[Number] | StrictStr


class VLLMPoolingResponse(Schema):
    id: StrictStr
    object: StrictStr
    created: StrictInt
    model: StrictStr
    data: list[VLLMPoolingData]
    usage: VLLMUsage


class VLLMScoreData(Schema):
    index: StrictInt
    object: StrictStr
    score: Number


class VLLMScoreResponse(Schema):
    id: StrictStr
    object: StrictStr
    created: StrictInt
    model: StrictStr
    data: list[VLLMScoreData]
    usage: VLLMUsage


class VLLMClassificationData(Schema):
    index: StrictInt
    label: StrictStr | None
    probs: list[Number]
    num_classes: StrictInt


class VLLMClassificationResponse(Schema):
    id: StrictStr
    object: StrictStr
    created: StrictInt
    model: StrictStr
    data: list[VLLMClassificationData]
    usage: VLLMUsage


class VLLMRerankDocument(Schema):
    text: StrictStr | None


class VLLMRerankResult(Schema):
    index: StrictInt
    document: VLLMRerankDocument
    relevance_score: Number


class VLLMRerankResponse(Schema):
    id: StrictStr
    model: StrictStr
    usage: VLLMUsage
    results: list[VLLMRerankResult]


class VLLMTokenizeResponse(Schema):
    count: StrictInt
    max_model_len: StrictInt
    tokens: list[StrictInt]


class VLLMDetokenizeResponse(Schema):
    prompt: StrictStr


# Jina's rerank API


class JinaUsage(Schema):
    total_tokens: StrictInt


class JinaDocument(Schema):
    text: StrictStr


class JinaRerankResult(Schema):
    index: StrictInt
    relevance_score: Number
    document: JinaDocument | None = None


class JinaRerankResponse(Schema):
    model: StrictStr
    usage: JinaUsage
    results: list[JinaRerankResult]
