"""What the native families share: attention per input on the packed layout and loading a checkpoint
by name (all of them); BERT's post-LayerNorm encoder layer and tanh classifier head (BERT, RoBERTa,
XLM-RoBERTa, MPNet).

Module names follow transformers' BertModel, so a BERT checkpoint loads as it is and the other
families rename theirs onto these (engine/families/xlm_roberta.py, engine/families/mpnet.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from common.cpus import usable_cpus
from common.folderjson import ModelError
from engine.layers.checkpoint import read_checkpoint, renamed_as
from engine.layers.grid_attention import attend_grid
from engine.layers.packed import Packed

# config.json's hidden_act -> the function, as transformers' ACT2FN computes it
# (common.native.NATIVE_ACTIVATIONS lists the same names).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


class SelfAttention(nn.Module):
    # what fuse() stacks: each part's (fused projection, index, parts), where a LoRA adapter's update of it goes
    PARTS = {"query": ("qkv", 0, 3), "key": ("qkv", 1, 3), "value": ("qkv", 2, 3)}

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)

    def fuse(self) -> None:
        """One [H, 3H] projection instead of three: one GEMM per layer instead of three. The fused
        copy is the one weight not on the mapped file; built in the forkserver (engine/runtime/preloaded.py)
        it is one copy every engine shares."""
        self.qkv = stacked(self.query, self.key, self.value)
        del self.query, self.key, self.value  # the fused copy is the one used: keep one in memory

    def forward(self, x: torch.Tensor, p: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
        size = x.shape[-1] // self.heads
        q, k, v = (t.view(-1, self.heads, size) for t in self.qkv(x).chunk(3, dim=-1))
        return attend(q, k, v, p, bias)


def stacked(*parts: nn.Linear) -> nn.Linear:
    """One projection computing `parts` side by side (their weights stacked): one GEMM instead of
    several. A module, not a bare tensor, so that .to() and int8 quantization (engine/precision/int8.py) see it."""
    fused = nn.Linear(1, 1, bias=parts[0].bias is not None)  # 1 x 1: nothing worth initialising
    fused.in_features, fused.out_features = parts[0].in_features, sum(p.out_features for p in parts)
    fused.weight = nn.Parameter(torch.cat([p.weight for p in parts]), requires_grad=False)
    if fused.bias is not None:
        fused.bias = nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=False)
    return fused


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    p: Packed,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
    causal: bool = False,
    reach: int | None = None,
) -> torch.Tensor:
    """Attention of packed q, k, v [T, heads, size] -> [T, heads * size], one call per input on its
    own tokens: no padding, no mask, no scatter onto a grid and back. For groups of 1-40 inputs this
    measured 1.1-1.8x faster than one masked call over the padded grid, the Python loop included.

    `bias` ([heads,] longest, longest: a float bias added to the scaled scores) depends on relative
    positions alone (MPNet's), so each input takes its top-left corner. `reach`: a token attends to
    those at most this far from it, both ways (ModernBERT's and Gemma 3's local layers). `scale`
    multiplies the scores (default 1/sqrt(size)). `causal`: a token attends to itself and the tokens
    before it in its input (a decoder, Qwen3). k and v may have fewer heads than q (grouped-query
    attention): each serves a run of q's heads.

    While the forward is being exported (engine/compiling/package.py) the loop is one opaque operator over
    the lengths tensor, so the graph around it is free of Python ints and serves every batch shape."""
    if torch.compiler.is_compiling():
        return torch.ops.warmpool.attend(q, k, v, p.lengths, bias, scale, causal, -1 if reach is None else reach)
    mask = bias
    if reach is not None:  # one band per forward, not per layer: long inputs make it megabytes
        key = ("band", reach, q.device, None if bias is None else id(bias))
        if key not in p.memo:
            p.memo[key] = band_mask(max(length for _, length in p.spans), reach, q.device, bias)
        mask = p.memo[key]
    if q.device.type == "cuda" and p.keys is None and len(p.spans) > 1:  # one input: its call needs no grid
        return attend_grid(q, k, v, p, mask, scale, causal)
    return _attend_spans(q, k, v, p.spans, mask, scale, causal, p.keys)


def _attend_spans(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spans: list[tuple[int, int]],
    mask: torch.Tensor | None,
    scale: float | None,
    causal: bool,
    keys: list[int] | None = None,
) -> torch.Tensor:
    """`keys`: each input's tokens attend to its first keys[i] only (the others are still queries)."""
    tokens, heads, size = q.shape
    out = q.new_empty((tokens, heads * size))
    for i, (start, length) in enumerate(spans):
        end = start + length
        seen = start + (length if keys is None else keys[i])
        context = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1)[None],
            k[start:seen].transpose(0, 1)[None],
            v[start:seen].transpose(0, 1)[None],
            attn_mask=None if mask is None else mask[..., :length, : seen - start],
            scale=scale,
            is_causal=causal,
            enable_gqa=k.shape[1] != heads,
        )
        out[start:end] = context[0].transpose(0, 1).reshape(length, heads * size)
    return out


def band_mask(
    longest: int, reach: int | None, device: torch.device, bias: torch.Tensor | None = None
) -> torch.Tensor | None:
    """The bias, or where a token may attend (|i - j| <= reach), for inputs up to `longest`; None
    when neither applies (every input inside the band needs no mask)."""
    if reach is None or longest <= reach + 1:
        return bias
    position = torch.arange(longest, device=device)
    band = (position[None, :] - position[:, None]).abs() <= reach
    return band if bias is None else bias[..., :longest, :longest].masked_fill(~band, float("-inf"))


# The loop as one operator a compiled graph calls (engine/compiling/package.py). Defined through the low-level
# Library API: torch.library.custom_op's kernels import torch._dynamo (~3 s) on their first call.
ATTEND_SCHEMA = (
    "attend(Tensor q, Tensor k, Tensor v, Tensor lengths, Tensor? bias, float? scale, bool causal, int reach) -> Tensor"
)
_LIBRARY = torch.library.Library("warmpool", "DEF")
_LIBRARY.define(ATTEND_SCHEMA)


def _attend_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    bias: torch.Tensor | None,
    scale: float | None,
    causal: bool,
    reach: int,
) -> torch.Tensor:
    ends = torch.cumsum(lengths, 0).tolist()
    spans = [(end - n, n) for end, n in zip(ends, lengths.tolist(), strict=True)]
    mask = band_mask(max(n for _, n in spans), None if reach < 0 else reach, q.device, bias)
    return _attend_spans(q, k, v, spans, mask, scale, causal)


_LIBRARY.impl("attend", _attend_op, "CompositeExplicitAutograd")


class Rotary:
    """Rotary position tables, one inverse-frequency vector per kind of layer (ModernBERT's and
    Gemma 3's global and local layers each have their own base). Float32 whatever the model's dtype,
    as transformers keeps them: not a module, so the model's .to(dtype) leaves them be; place()
    moves them to the model's device once it is loaded."""

    def __init__(self, thetas: dict[str, float], size: int) -> None:
        self.inv_freq = {
            kind: 1.0 / (theta ** (torch.arange(0, size, 2, dtype=torch.float) / size))
            for kind, theta in thetas.items()
        }

    def place(self, device: torch.device | None) -> None:
        self.inv_freq = {kind: f.to(device or "cpu") for kind, f in self.inv_freq.items()}

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Each kind's (cos, sin) for these positions: computed in float32, kept in the model's
        dtype, [T, 1, size] to broadcast over the heads."""
        out = {}
        for kind, inv_freq in self.inv_freq.items():
            freqs = positions[:, None].float() * inv_freq
            angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
            out[kind] = (angles.cos().to(dtype), angles.sin().to(dtype))
        return out


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, in_float32: bool = False) -> torch.Tensor:
    """Rotary position embedding of x [T, heads, size] (the halves rotated, not interleaved pairs):
    in x's dtype as Llama-style models apply it, or in float32 (ModernBERT's transformers code)."""
    y = x.float() if in_float32 else x
    half = y.shape[-1] // 2
    rotated = torch.cat((-y[..., half:], y[..., :half]), dim=-1)
    return (y * cos + rotated * sin).to(x.dtype)


def rotary_base(c: dict[str, Any], kind: str | None, old_key: str, default: float) -> float:
    """A rotary base: config.json's `rope_parameters` (one dict per layer kind where `kind` is
    given, else flat), or (older configs) the flat `old_key`, else the family's default."""
    params = c.get("rope_parameters") or {}
    if kind is not None:
        params = params.get(kind) or {}
    return float(params.get("rope_theta", c.get(old_key) or default))


class DenseNorm(nn.Module):
    """dense -> + residual -> LayerNorm, the output block of attention and feed-forward alike."""

    def __init__(self, fan_in: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(fan_in, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)  # type: ignore[no-any-return]


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float) -> None:
        super().__init__()
        self.self = SelfAttention(hidden, heads)
        self.output = DenseNorm(hidden, hidden, eps)


class Intermediate(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, inner)


class Layer(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, eps = c["hidden_size"], c.get("layer_norm_eps", 1e-12)
        self.attention = Attention(hidden, c["num_attention_heads"], eps)
        self.intermediate = Intermediate(hidden, c["intermediate_size"])
        self.output = DenseNorm(c["intermediate_size"], hidden, eps)
        self.act = ACTIVATIONS[c.get("hidden_act", "gelu")]

    def forward(self, x: torch.Tensor, p: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attention.output(self.attention.self(x, p, bias), x)
        return self.output(self.act(self.intermediate.dense(x)), x)  # type: ignore[no-any-return]


class Encoder(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))


class TanhHead(nn.Module):
    """The sequence classifier on the first token: dense -> tanh -> out_proj. BERT's pooler plus
    classifier and RoBERTa's classification head are both this, under other names."""

    def __init__(self, hidden: int, labels: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, labels)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(first)))  # type: ignore[no-any-return]


class EncoderModel(nn.Module):
    """Embeddings, then the layers; the packed last hidden states [T, H], or the head's logits
    [B, labels] when built with labels. A family supplies its embeddings module and, where it has
    one, an attention bias shared by every layer."""

    def __init__(self, c: dict[str, Any], embeddings: nn.Module, num_labels: int | None) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.encoder = Encoder(c)
        if num_labels:
            self.head = TanhHead(c["hidden_size"], num_labels)
        self.num_labels = num_labels

    def attention_bias(self, p: Packed) -> torch.Tensor | None:
        return None

    def forward(self, p: Packed) -> torch.Tensor:
        x = self.embeddings(p)
        bias = self.attention_bias(p)
        for layer in self.encoder.layer:
            x = layer(x, p, bias)
        if not self.num_labels:
            return x
        return self.head(x[p.starts])  # type: ignore[no-any-return]


M = TypeVar("M", bound=nn.Module)


def encoder_loader(
    embeddings: Callable[[dict[str, Any]], nn.Module], rename: Callable[[str], str]
) -> Callable[..., nn.Module]:
    """The `load` of a BERT-shaped family (engine.families.Loader): its own embeddings under BERT's
    encoder and head, weights by its own checkpoint names."""

    def load(
        folder: Path,
        config: dict[str, Any],
        num_labels: int | None,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> nn.Module:
        return load_checkpoint(
            lambda: EncoderModel(config, embeddings(config), num_labels), folder, rename, device, dtype
        )

    return load


def load_checkpoint(
    make: Callable[[], M], folder: Path, rename: Callable[[str], str], device: torch.device | None, dtype: torch.dtype
) -> M:
    """The model make() builds (under no_init(): the checkpoint replaces every weight), taking the
    checkpoint's tensors (one safetensors file or its shards), renamed, as its parameters themselves:
    on the CPU in their own dtype they are views on the mapped files, nothing copied
    (engine/layers/checkpoint.py); on a GPU each goes from the page cache to the GPU's memory, no host copy
    kept. Then cast to `dtype` (a copy only where the checkpoint's dtype differs). Tensors the model
    has no place for (a pooler an embedding model does not use, a masked-LM head) are left out."""
    with no_init():
        model = make()
    weights = read_checkpoint(folder)
    if device is not None and device.type != "cpu":
        weights = {key: tensor.to(device) for key, tensor in weights.items()}
    state = {rename(key): tensor for key, tensor in weights.items()}
    missing, _ = model.load_state_dict(state, strict=False, assign=True)
    if missing:
        raise ModelError(f"cannot load model from {folder}: weights missing for {missing[:5]}")
    renamed_as(model, rename)
    # Fused in the checkpoint's dtype, then converted: a converted checkpoint's q, k and v are copied
    # once each way instead of converted and then copied again (a 4 GB bfloat16 one built in 4.7 s, not 9.3)
    # Every module with a fuse() (attention's q, k and v; Qwen3's MLP; CLIP's towers) is fused here.
    for module in list(model.modules()):
        fuse = getattr(module, "fuse", None)
        if callable(fuse):
            fuse()
    return converted(model, dtype).eval()


def converted(model: M, dtype: torch.dtype) -> M:
    """model.to(dtype); on the CPU each parameter converted on one of several threads, one per core.
    Converting is a core's work per tensor plus faulting in the mapped pages it reads, and both run
    side by side: a 4 GB bfloat16 checkpoint became float32 in 2.3 s on 2 cores, 4.8-8.6 s on one.
    Each thread computes on one torch thread (the forkserver must never start OpenMP's pool:
    engine/runtime/preloaded.py)."""
    todo = {id(p): p for p in model.parameters() if p.is_floating_point() and p.dtype != dtype}
    if not todo or any(p.device.type != "cpu" for p in todo.values()):
        return model.to(dtype)
    threads = torch.get_num_threads()

    def convert(param: nn.Parameter) -> torch.Tensor:
        torch.set_num_threads(1)
        return param.data.to(dtype)

    try:
        with ThreadPoolExecutor(usable_cpus(), thread_name_prefix="convert") as pool:
            for param, tensor in zip(todo.values(), pool.map(convert, todo.values()), strict=True):
                param.data = tensor  # the same Parameter: weights tied to it stay tied
    finally:
        torch.set_num_threads(threads)
    return model.to(dtype)  # buffers and anything left; the parameters are converted already


def legacy_norm_names(key: str) -> str:
    """Old checkpoints name LayerNorm's weight and bias gamma and beta."""
    return key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


@contextlib.contextmanager
def no_init() -> Iterator[None]:
    """Skip nn.init while modules are built, as transformers' no_init_weights does. (The meta
    device would too, but its first use imports sympy and torch._prims: ~1.6 s per engine.)"""
    names = ("kaiming_uniform_", "uniform_", "normal_", "zeros_", "ones_", "trunc_normal_")
    saved = {name: getattr(nn.init, name) for name in names}
    try:
        for name in names:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)
