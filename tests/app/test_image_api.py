"""CLIP and SigLIP over HTTP: images (PNG, JPEG, WebP made here) and texts into one space through
vLLM's `messages`, Infinity's `modality` and Cohere's `images`/`inputs`, equal to transformers'
normalised features; bad images are 400s; image URLs are refused by default and fetched from an
allowlisted host. The CLIP model is served beside a text embedder."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from server.batches.runner import LOOP_LINE_BYTES
from tests.app.inprocess import serving
from tests.image_host import png_host
from tests.server_process import Served, wait_for
from tests.tiny_vision import build_clip, build_siglip, image_bytes
from tests.unit.test_images import bomb

FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
SLOW_S = 1.0  # how long the test host's /slow.png takes to answer
TEXTS = ["the warm pool", "hello world"]


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vision")
    return {
        "clip": build_clip(root / "clip"),
        "siglip": build_siglip(root / "siglip"),
        "siglip-spm": build_siglip(root / "siglip-spm", spm=True),  # spiece.model, no tokenizer.json
    }


@pytest.fixture(scope="module")
def appliance(folders: dict[str, Path], model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """CLIP (the default) beside the text embedder; image URLs off (the default)."""
    models = f"clip={folders['clip']},minilm={model_dir}"
    with serving(folders["clip"], models=models, max_image_bytes=100_000, max_image_pixels=1_000_000) as proc:
        yield proc


@pytest.fixture(scope="module")
def images_host() -> Iterator[str]:
    """A local HTTP server with one PNG at /cat.png, /moved redirecting to it, and /slow.png: the same
    PNG from a slow host (answered SLOW_S after it is asked)."""
    with png_host(SLOW_S) as url:
        yield url


@pytest.fixture(scope="module")
def siglip_server(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """SigLIP (the default) with image URLs fetched from 127.0.0.1 alone (the test's HTTP server), and
    beside it the SigLIP folder that ships sentencepiece's model alone."""
    models = f"siglip={folders['siglip']},siglip-spm={folders['siglip-spm']}"
    batches = tmp_path_factory.mktemp("batches")
    with serving(
        folders["siglip"], models=models, image_urls="allowlist", image_url_allowlist="127.0.0.1", batch_dir=batches
    ) as proc:
        yield proc


def expected_images(folder: Path, files: list[bytes]) -> np.ndarray:
    import torch
    from transformers import AutoModel, CLIPImageProcessorPil, SiglipImageProcessorPil

    kind = CLIPImageProcessorPil if folder.name == "clip" else SiglipImageProcessorPil
    pixels = kind.from_pretrained(str(folder))([Image.open(io.BytesIO(f)) for f in files], return_tensors="pt")
    with torch.no_grad():
        vectors = AutoModel.from_pretrained(str(folder)).get_image_features(**pixels).pooler_output.numpy()
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)  # type: ignore[no-any-return]


def expected_texts(folder: Path, texts: list[str]) -> np.ndarray:
    import torch
    from transformers import AutoModel, AutoTokenizer

    # SigLIP's processor pads to the full length and passes no attention mask (its tokenizer's only input
    # is input_ids): the padding is attended to
    padding = "max_length" if folder.name.startswith("siglip") else False
    model, tokenizer = AutoModel.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(folder))
    with torch.no_grad():
        ids = [tokenizer([t], return_tensors="pt", padding=padding)["input_ids"] for t in texts]
        rows = [model.get_text_features(input_ids=i).pooler_output[0].numpy() for i in ids]
    vectors = np.stack(rows)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)  # type: ignore[no-any-return]


def vectors(response: Any) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float32)


def test_modality_image_embeds_png_jpeg_and_webp(appliance: Served, folders: dict[str, Path]) -> None:
    """Infinity's `modality: "image"`: a PNG, a JPEG and a WebP (data: URLs and bare base64) answer
    transformers' normalised image features within 1e-5."""
    files = [image_bytes(fmt, seed=i) for i, fmt in enumerate(FORMATS.values())]
    sources = [data_url(files[0]), data_url(files[1], "jpeg"), base64.b64encode(files[2]).decode()]
    got = vectors(appliance.post("/v1/embeddings", json={"input": sources, "modality": "image"}))
    np.testing.assert_allclose(got, expected_images(folders["clip"], files), atol=1e-5, rtol=0)


def test_messages_embed_an_image_and_a_text(appliance: Served, folders: dict[str, Path]) -> None:
    """vLLM's chat-style `messages`: one image_url part is that image's vector; text parts are the text's."""
    file = image_bytes("PNG", seed=9)
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(file)}}]}]
    text = [{"role": "user", "content": [{"type": "text", "text": TEXTS[0]}]}]
    got_image = vectors(appliance.post("/v1/embeddings", json={"messages": image, "model": "clip"}))
    got_text = vectors(appliance.post("/v1/embeddings", json={"messages": text}))
    np.testing.assert_allclose(got_image, expected_images(folders["clip"], [file]), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got_text, expected_texts(folders["clip"], TEXTS[:1]), atol=1e-5, rtol=0)


def test_openai_client_embeds_texts_and_images(appliance: Served, folders: dict[str, Path]) -> None:
    """openai's embeddings.create: texts as `input`, images with extra_body={"modality": "image"}."""
    import openai

    client = openai.OpenAI(http_client=appliance.client, base_url=f"{appliance.url}/v1", api_key="unused")
    texts = client.embeddings.create(input=TEXTS, model="clip")
    file = image_bytes("WEBP", seed=4)
    images = client.embeddings.create(input=[data_url(file, "webp")], model="clip", extra_body={"modality": "image"})
    np.testing.assert_allclose(
        [d.embedding for d in texts.data], expected_texts(folders["clip"], TEXTS), atol=1e-5, rtol=0
    )
    np.testing.assert_allclose([d.embedding for d in images.data], expected_images(folders["clip"], [file]), atol=1e-5)


def test_cohere_client_embeds_images_and_inputs(appliance: Served, folders: dict[str, Path]) -> None:
    """cohere.ClientV2.embed: `images` (data: URLs) and `inputs` (content parts) on /v2/embed."""
    import cohere

    client = cohere.ClientV2(httpx_client=appliance.client, base_url=appliance.url, api_key="unused")
    files = [image_bytes("JPEG", seed=6), image_bytes("PNG", seed=7)]
    by_images = client.embed(model="clip", input_type="image", embedding_types=["float"], images=[data_url(files[0])])
    parts = [
        {"content": [{"type": "image_url", "image_url": {"url": data_url(files[1])}}]},
        {"content": [{"type": "text", "text": TEXTS[1]}]},
    ]
    by_inputs = client.embed(model="clip", input_type="search_document", embedding_types=["float"], inputs=parts)
    clip = folders["clip"]
    np.testing.assert_allclose(by_images.embeddings.float_, expected_images(clip, files[:1]), atol=1e-5, rtol=0)
    want = np.concatenate([expected_images(clip, files[1:]), expected_texts(clip, TEXTS[1:])])
    np.testing.assert_allclose(by_inputs.embeddings.float_, want, atol=1e-5, rtol=0)


def test_cohere_answer_describes_each_image_as_sent(appliance: Served) -> None:
    """Cohere's answer lists each image's width, height, format and bits per pixel, as sent (an RGBA
    PNG is 32 bits though it is embedded as RGB), in the order of the inputs; texts add none."""
    import cohere

    client = cohere.ClientV2(httpx_client=appliance.client, base_url=appliance.url, api_key="unused")
    files = [image_bytes("PNG", (30, 20), "RGBA"), image_bytes("JPEG", (40, 50)), image_bytes("WEBP", (33, 33))]
    parts = [{"content": [{"type": "text", "text": TEXTS[0]}]}]
    parts += [{"content": [{"type": "image_url", "image_url": {"url": data_url(f)}}]} for f in files]
    answer = client.embed(model="clip", input_type="search_document", embedding_types=["float"], inputs=parts)
    got = [(i.width, i.height, i.format, i.bit_depth) for i in answer.images or []]
    assert got == [(30, 20, "png", 32), (40, 50, "jpeg", 24), (33, 33, "webp", 24)]


def refusal(server: Served, sources: list[str]) -> str:
    r = server.post("/v1/embeddings", json={"input": sources, "modality": "image"})
    assert r.status_code == 400, r.text
    return str(r.json()["error"]["message"])


def test_corrupt_image_is_a_400_naming_its_index(appliance: Served) -> None:
    """A PNG cut short, second of two: 400 naming input[1]."""
    good, cut = image_bytes("PNG"), image_bytes("PNG", (64, 64))[:200]
    assert "input[1]" in refusal(appliance, [data_url(good), data_url(cut)])


def test_oversized_image_is_a_400(appliance: Served) -> None:
    """An image past WARMPOOL_MAX_IMAGE_BYTES (100 kB here) is refused, within the body limit."""
    noise = image_bytes("PNG", (200, 200))
    assert len(noise) > 100_000
    assert "MAX_IMAGE_BYTES" in refusal(appliance, [data_url(noise)])


def test_decompression_bomb_is_a_400(appliance: Served) -> None:
    """A PNG claiming 50,000 x 50,000 pixels is refused from its header; the server stays up."""
    assert "MAX_IMAGE_PIXELS" in refusal(appliance, [data_url(bomb(50_000, 50_000))])
    assert appliance.get("/health/ready").status_code == 200


def test_image_url_is_refused_by_default(appliance: Served, images_host: str) -> None:
    """WARMPOOL_IMAGE_URLS=off (the default): an http URL is a 400, nothing fetched."""
    assert "WARMPOOL_IMAGE_URLS=off" in refusal(appliance, [f"{images_host}/cat.png"])


def test_allowlisted_url_is_fetched_and_redirects_followed(
    siglip_server: Served, images_host: str, folders: dict[str, Path]
) -> None:
    """With 127.0.0.1 allowlisted, the test server's PNG (directly and through a redirect) answers the
    same vector as the image sent inline, equal to transformers' SigLIP features."""
    body = {"input": [f"{images_host}/cat.png", f"{images_host}/moved"], "modality": "image"}
    got = vectors(siglip_server.post("/v1/embeddings", json=body))
    want = expected_images(folders["siglip"], [image_bytes("PNG", seed=5)] * 2)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_a_batch_line_naming_an_image_url_is_answered_as_the_route_answers_it(
    siglip_server: Served, images_host: str
) -> None:
    """A Batch API line (short: the size of line prepared on the event loop for a text model) whose
    input is an image URL: fetched through the pipeline, its vector the route's."""
    body = {"input": [f"{images_host}/cat.png"], "modality": "image"}
    line = {"custom_id": "cat", "method": "POST", "url": "/v1/embeddings", "body": body}
    assert len(json.dumps(body)) <= LOOP_LINE_BYTES
    files = {"file": ("in.jsonl", json.dumps(line).encode() + b"\n", "application/jsonl")}
    upload = siglip_server.client.post("/v1/files", files=files, data={"purpose": "batch"})
    assert upload.status_code == 200, upload.text
    create = {"input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
    batch_id = siglip_server.post("/v1/batches", json=create).json()["id"]

    def done() -> dict[str, Any] | None:
        record: dict[str, Any] = siglip_server.get(f"/v1/batches/{batch_id}").json()
        return record if record["status"] == "completed" else None

    record = wait_for(done, 60, "the batch to complete")
    assert record["request_counts"] == {"total": 1, "completed": 1, "failed": 0}, record
    (answer,) = siglip_server.get(f"/v1/files/{record['output_file_id']}/content").text.splitlines()
    got = np.array(json.loads(answer)["response"]["body"]["data"][0]["embedding"], dtype=np.float32)
    np.testing.assert_allclose(got, vectors(siglip_server.post("/v1/embeddings", json=body))[0], atol=1e-6, rtol=0)


def test_a_requests_image_urls_are_fetched_at_once_within_one_timeout(
    folders: dict[str, Path], images_host: str, tmp_path: Path
) -> None:
    """A request's image URLs are fetched at once: two from a slow host fit a WARMPOOL_IMAGE_URL_TIMEOUT
    that one after the other would not. The timeout bounds all of a request's fetches together: /score
    fetches its second side after its first, and that one, from the same slow host, is a 400 naming it."""
    with serving(
        folders["siglip"],
        image_urls="allowlist",
        image_url_allowlist="127.0.0.1",
        image_url_timeout=1.6 * SLOW_S,
    ) as server:
        two = server.post("/v1/embeddings", json={"input": [f"{images_host}/slow.png"] * 2, "modality": "image"})
        assert two.status_code == 200, two.text
        slow = {"content": [{"type": "image_url", "image_url": {"url": f"{images_host}/slow.png"}}]}
        sides = server.post("/score", json={"text_1": slow, "text_2": slow})
        assert sides.status_code == 400, sides.text
        assert "text_2" in sides.json()["error"]["message"] and "timed out" in sides.json()["error"]["message"]


def test_siglip_texts_are_padded_as_its_processor_pads(siglip_server: Served, folders: dict[str, Path]) -> None:
    """SigLIP's text vectors equal transformers' on texts padded to the full length."""
    got = vectors(siglip_server.post("/v1/embeddings", json={"input": TEXTS}))
    np.testing.assert_allclose(got, expected_texts(folders["siglip"], TEXTS), atol=1e-5, rtol=0)


def test_siglip_folder_with_only_spiece_model_embeds_texts_as_transformers(
    siglip_server: Served, folders: dict[str, Path]
) -> None:
    """A SigLIP folder with spiece.model and no tokenizer.json: texts (punctuation, capitals, extra spaces,
    unicode, one left empty by the canonicalisation) answer SiglipModel's text features on SiglipTokenizer's
    ids padded to the full length, within 1e-5."""
    texts = ["A photo of a CAT!", "  ΟΔΟΣ,  résumé… 東京  ", "e-mail: someone@example.com (50% off)", "ﬁne Ⅻ", "..."]
    got = vectors(siglip_server.post("/v1/embeddings", json={"model": "siglip-spm", "input": texts}))
    np.testing.assert_allclose(got, expected_texts(folders["siglip-spm"], texts), atol=1e-5, rtol=0)


def test_models_list_image_among_input_modalities(appliance: Served) -> None:
    """/v1/models: the CLIP model takes text and images, the text embedder beside it text alone."""
    cards = {card["id"]: card for card in appliance.get("/v1/models").json()["data"]}
    assert cards["clip"]["input_modalities"] == ["text", "image"]
    assert cards["minilm"]["input_modalities"] == ["text"]
    assert appliance.get("/info").json()["input_modalities"] == ["text", "image"]


def test_text_embedder_beside_refuses_images_and_embeds_texts(appliance: Served) -> None:
    """The text model served beside CLIP embeds its texts as before; images sent to it are a 400."""
    r = appliance.post("/v1/embeddings", json={"input": TEXTS, "model": "minilm"})
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
    body = {"input": [data_url(image_bytes("PNG"))], "modality": "image", "model": "minilm"}
    r = appliance.post("/v1/embeddings", json=body)
    assert r.status_code == 400 and "text only" in r.json()["error"]["message"]


def test_rerank_scores_a_text_against_images_and_texts(appliance: Served, folders: dict[str, Path]) -> None:
    """/rerank with Jina's {"image": ...} documents beside texts: each document's score is the cosine of
    its vector and the query's in the shared space, best first."""
    files = [image_bytes("PNG", seed=11), image_bytes("JPEG", seed=12)]
    documents = [{"image": data_url(files[0])}, TEXTS[1], {"image": data_url(files[1], "jpeg")}]
    r = appliance.post("/rerank", json={"model": "clip", "query": TEXTS[0], "documents": documents})
    assert r.status_code == 200, r.text
    clip = folders["clip"]
    query = expected_texts(clip, TEXTS[:1])[0]
    rows = [
        expected_images(clip, files[:1])[0],
        expected_texts(clip, TEXTS[1:])[0],
        expected_images(clip, files[1:])[0],
    ]
    want = [float(np.dot(query, row)) for row in rows]
    results = r.json()["results"]
    assert [x["index"] for x in results] == sorted(range(3), key=lambda i: -want[i])
    np.testing.assert_allclose([want[x["index"]] for x in results], [x["relevance_score"] for x in results], atol=1e-5)
    assert results[[x["index"] for x in results].index(0)]["document"] == documents[0]


def test_score_a_text_against_images_in_vllms_content_shape(appliance: Served, folders: dict[str, Path]) -> None:
    """/score with vLLM's {"content": [parts]} as text_2: one score per part (images and a text), the
    cosine of text_1's vector and the part's in the shared space."""
    files = [image_bytes("PNG", seed=13), image_bytes("WEBP", seed=14)]
    parts = [{"type": "image_url", "image_url": {"url": data_url(f)}} for f in files]
    parts.append({"type": "text", "text": TEXTS[1]})
    r = appliance.post("/score", json={"model": "clip", "text_1": TEXTS[0], "text_2": {"content": parts}})
    assert r.status_code == 200, r.text
    clip = folders["clip"]
    rows = np.concatenate([expected_images(clip, files), expected_texts(clip, TEXTS[1:])])
    want = rows @ expected_texts(clip, TEXTS[:1])[0]
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], want, atol=1e-5, rtol=0)


def test_score_with_an_image_on_a_text_model_is_a_400_naming_its_side(appliance: Served) -> None:
    """An image in /score's content for a text-only model is a 400 naming text_2, not a 5xx."""
    parts = [{"type": "image_url", "image_url": {"url": data_url(image_bytes("PNG"))}}]
    r = appliance.post("/score", json={"model": "minilm", "text_1": TEXTS[0], "text_2": {"content": parts}})
    assert r.status_code == 400, r.text
    assert "text only" in r.json()["error"]["message"] and r.json()["error"]["param"] == "text_2"


def test_siglip_score_between_texts_is_the_cosine_of_padded_texts(
    siglip_server: Served, folders: dict[str, Path]
) -> None:
    """/score on a SigLIP model: the cosine of the two texts' vectors, each padded as its processor pads."""
    r = siglip_server.post("/score", json={"text_1": TEXTS[0], "text_2": TEXTS})
    assert r.status_code == 200, r.text
    want = expected_texts(folders["siglip"], TEXTS)
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], want @ want[0], atol=1e-5)


def test_siglip_tei_embed_pads_texts_too(siglip_server: Served, folders: dict[str, Path]) -> None:
    """TEI's /embed on a SigLIP model pads its texts as /v1/embeddings does: the same vectors."""
    r = siglip_server.post("/embed", json={"inputs": TEXTS})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json(), expected_texts(folders["siglip"], TEXTS), atol=1e-5, rtol=0)
