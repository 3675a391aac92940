"""Attention that keeps every sample of a varpack batch to itself, without a ``T x T`` mask.

:func:`packed_attention` ``(q, k, v, meta)`` takes ``q``, ``k``, ``v`` as ``[B, H, T, D]`` (the
layout of ``scaled_dot_product_attention``; ``k``/``v`` may have fewer heads, GQA) and returns
``[B, H, T, D]``. ``B x T`` is the batch's shape: ``[1, N]`` packed, ``[B, T]`` padded,
``[num_blocks, T]`` blocks. What every layer needs (``cu_seqlens``, a FlexAttention ``BlockMask``
or a dense mask) is built once per batch by :func:`attention_meta` and passed to all layers.

Backends, a registry ``name -> Backend`` (:data:`BACKENDS`, :func:`register_backend`):

- ``flash``: flash-attn's ``flash_attn_varlen_func`` over ``cu_seqlens`` (installed, CUDA, fp16/bf16);
- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10, CUDA, fp16/bf16); causal
  is ``window_size=(-1, 0)`` or ``is_causal=True``, whichever its signature has;
- ``flex``: FlexAttention with a document-causal ``BlockMask`` from segment ids (compiled once per
  process on CUDA; eager and forward-only on the CPU);
- ``segments``: SDPA on each sample's own tokens (:mod:`varpack.torch.segments`): the CPU's path,
  ``sum(L_i^2)`` scores per row instead of ``T^2``, no mask built;
- ``mask``: SDPA with the dense boolean ``[B, 1, T, T]`` mask (an explicit choice);
- ``causal``: SDPA ``is_causal=True``, for right-padded batches (one sample per row): real tokens
  never see padding, and padding rows' outputs are ignored by the labels.

Packed and blocks batches run the varlen kernels over ``cu_seqlens`` of the flattened
``[B * T]`` view (segments never cross a row); a padded batch is one segment per row there.
``auto`` (:func:`resolve_backend`) is ``causal`` for padded batches; for packed and blocks it is
the first available of ``flash``, ``varlen``, ``flex`` on CUDA, and ``segments`` elsewhere.

>>> resolve_backend("auto", torch.device("cpu"), torch.float32, "padded")
'causal'
>>> resolve_backend("auto", torch.device("cpu"), torch.float32, "packed")
'segments'
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from varpack.errors import ConfigError
from varpack.torch import masks
from varpack.torch.batch import BlockBatch, PackedBatch, PaddedBatch
from varpack.torch.segments import segment_attention, segment_bounds

HALF = (torch.float16, torch.bfloat16)
MAX_SEQLEN = ("row", "batch")


def _optional(module: str, name: str) -> Any:
    """``module.name`` or ``None`` when the package (or the name) is missing or broken."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, OSError, AttributeError):
        return None


# Module attributes, looked up at call time, so tests can stand fake kernels in for them. Each
# is imported on first use: FlexAttention's module loads torch._dynamo, which costs every
# process (each DataLoader worker, each torchrun rank) seconds of start-up it may never need.
_LAZY = object()
_KERNELS = {
    "flash_attn_varlen_func": ("flash_attn", "flash_attn_varlen_func"),
    "varlen_attn": ("torch.nn.attention.varlen", "varlen_attn"),
    "flex_attention": ("torch.nn.attention.flex_attention", "flex_attention"),
}
flash_attn_varlen_func: Any = _LAZY
varlen_attn: Any = _LAZY
flex_attention: Any = _LAZY
_COMPILED_FLEX: Any = None


_HERE = globals()  # not globals() in _kernel: dynamo breaks the graph there, and a static
# compile then recompiles every batch


def _kernel(name: str) -> Any:
    """The kernel ``name`` (one of :data:`_KERNELS`), imported on first use; ``None`` if absent."""
    got = _HERE[name]
    if got is _LAZY:
        got = _HERE[name] = _optional(*_KERNELS[name])
    return got


class BackendUnavailableError(ConfigError):
    """An explicitly chosen attention backend cannot run here (or on this batch layout)."""


@dataclass(frozen=True, eq=False)
class AttentionMeta:
    """What every layer needs for one batch, built once by :func:`attention_meta`.

    ``cu_seqlens``/``max_seqlen`` for ``flash`` and ``varlen`` (``max_seqlen`` is a bound on the
    longest segment: the row length by default, constant per shape), ``block_mask`` for ``flex``,
    ``mask`` for ``mask``; ``kernel_kwargs`` are the varlen kernel's causal keywords (and
    ``enable_gqa`` where its signature has it), or for ``segments`` the samples' ``bounds``,
    read once here rather than in every layer.
    """

    backend: str
    causal: bool = True
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0
    block_mask: Any = None
    mask: torch.Tensor | None = None
    kernel_kwargs: dict[str, Any] = field(default_factory=dict)


Runner = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMeta, float | None], Any]


@dataclass(frozen=True)
class Backend:
    """One attention implementation: what it needs per batch, when it can run, how it runs.

    ``needs``: ``"cu_seqlens"``, ``"block_mask"``, ``"mask"`` or ``"none"``; ``unavailable(device,
    dtype)`` returns why it cannot run there (``None``: it can); ``run(q, k, v, meta, scale)``.
    """

    name: str
    needs: str
    run: Runner
    unavailable: Callable[[torch.device, torch.dtype], str | None]


BACKENDS: dict[str, Backend] = {}
AUTO_ORDER = ("flash", "varlen", "flex", "segments", "mask")


def register_backend(backend: Backend) -> Backend:
    """Add (or replace) a backend under its name; explicit choices find it, ``auto`` does not."""
    BACKENDS[backend.name] = backend
    return backend


def batch_layout(batch: Any) -> str:
    """``"packed"``, ``"padded"`` or ``"blocks"`` for a varpack batch."""
    if isinstance(batch, PackedBatch):
        return "packed"
    if isinstance(batch, PaddedBatch):
        return "padded"
    if isinstance(batch, BlockBatch):
        return "blocks"
    raise TypeError(f"not a varpack batch: {type(batch).__name__}")


def varlen_causal_kwargs(fn: Callable[..., Any], causal: bool = True) -> dict[str, Any]:
    """The keywords that make ``varlen_attn`` causal, read from its signature (not the version).

    >>> varlen_causal_kwargs(lambda q, k, v, *, window_size=(-1, -1): None)
    {'window_size': (-1, 0)}
    >>> varlen_causal_kwargs(lambda q, k, v, *, is_causal=False: None)
    {'is_causal': True}
    """
    params = inspect.signature(fn).parameters
    if "window_size" in params:
        return {"window_size": (-1, 0) if causal else (-1, -1)}
    if "is_causal" in params:
        return {"is_causal": causal}
    raise TypeError(f"{fn!r} takes neither window_size nor is_causal")


def _cuda_half(device: torch.device, dtype: torch.dtype) -> str | None:
    if device.type != "cuda":
        return f"needs a CUDA device, the batch is on {device}"
    if dtype not in HALF:
        return f"needs fp16 or bf16 inputs, not {dtype} (train with autocast or --dtype bf16)"
    return None


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """Compute capability of a CUDA device ((0, 0) without CUDA)."""
    return torch.cuda.get_device_capability(device) if torch.cuda.is_available() else (0, 0)


def _flash_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    if _kernel("flash_attn_varlen_func") is None:
        return "flash-attn is not installed (pip install flash-attn)"
    return _cuda_half(device, dtype)


def _varlen_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    if _kernel("varlen_attn") is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen (torch >= 2.10)"
    try:
        varlen_causal_kwargs(_kernel("varlen_attn"))
    except (TypeError, ValueError) as exc:
        return f"unrecognised varlen_attn signature: {exc}"
    reason = _cuda_half(device, dtype)
    if reason is None and cuda_capability(device) < (8, 0):
        reason = "its flash kernels need a GPU of compute capability 8.0 or newer"
    return reason


def _flex_unavailable(device: torch.device, dtype: torch.dtype) -> str | None:
    if _kernel("flex_attention") is None:
        return f"torch {torch.__version__} has no FlexAttention (torch >= 2.5)"
    return None


def _always(device: torch.device, dtype: torch.dtype) -> str | None:
    return None


def _flat(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, D]`` -> ``[B * T, H, D]``, the varlen kernels' layout."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b * t, h, d)


def _unflat(y: torch.Tensor, b: int, t: int) -> torch.Tensor:
    return y.view(b, t, y.shape[-2], y.shape[-1]).transpose(1, 2)


def _repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    rep = q.shape[1] // k.shape[1]
    return q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def _run_flash(q: Any, k: Any, v: Any, meta: AttentionMeta, scale: float | None) -> Any:
    b, _, t, _ = q.shape
    cu = meta.cu_seqlens
    y = _kernel("flash_attn_varlen_func")(
        _flat(q), _flat(k), _flat(v), cu, cu, meta.max_seqlen, meta.max_seqlen,
        dropout_p=0.0, softmax_scale=scale, causal=meta.causal,
    )  # fmt: skip
    return _unflat(y, b, t)


def _run_varlen(q: Any, k: Any, v: Any, meta: AttentionMeta, scale: float | None) -> Any:
    b, _, t, _ = q.shape
    kwargs = dict(meta.kernel_kwargs)
    gqa_keyword = kwargs.pop("enable_gqa", False)
    if k.shape[1] != q.shape[1]:
        if gqa_keyword:
            kwargs["enable_gqa"] = True
        else:
            q, k, v = _repeat_kv(q, k, v)
    cu, longest = meta.cu_seqlens, meta.max_seqlen
    kernel = _kernel("varlen_attn")
    y = kernel(_flat(q), _flat(k), _flat(v), cu, cu, longest, longest, scale=scale, **kwargs)
    return _unflat(y, b, t)


def compiled_flex_attention() -> Callable[..., Any]:
    """``torch.compile(flex_attention)``, compiled once per process (module-level cache)."""
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(_kernel("flex_attention"))
    return _COMPILED_FLEX


def _run_flex(q: Any, k: Any, v: Any, meta: AttentionMeta, scale: float | None) -> Any:
    kwargs = {"block_mask": meta.block_mask, "scale": scale, "enable_gqa": k.shape[1] != q.shape[1]}
    if torch.compiler.is_compiling():  # inside a compiled model: dynamo traces flex itself
        return _kernel("flex_attention")(q, k, v, **kwargs)
    if q.is_cuda:
        return compiled_flex_attention()(q, k, v, **kwargs)
    with warnings.catch_warnings():  # the CPU's eager path materialises the scores: a test path
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        return _kernel("flex_attention")(q, k, v, **kwargs)


def sdpa(q: Any, k: Any, v: Any, scale: float | None, **kwargs: Any) -> Any:
    if k.shape[1] != q.shape[1]:
        kwargs["enable_gqa"] = True
    return F.scaled_dot_product_attention(q, k, v, scale=scale, **kwargs)


def _run_mask(q: Any, k: Any, v: Any, meta: AttentionMeta, scale: float | None) -> Any:
    return sdpa(q, k, v, scale, attn_mask=meta.mask)


def _run_segments(q: Any, k: Any, v: Any, meta: AttentionMeta, scale: float | None) -> Any:
    if torch.compiler.is_compiling():  # bounds would be graph constants: the mask, of fixed shape
        mask = masks.causal_mask_from_segments(meta.kernel_kwargs["segments"], meta.causal)
        return sdpa(q, k, v, scale, attn_mask=mask)
    return segment_attention(q, k, v, meta.kernel_kwargs["bounds"], meta.causal, scale)


def _run_causal(q: Any, k: Any, v: Any, meta: AttentionMeta, scale: float | None) -> Any:
    return sdpa(q, k, v, scale, is_causal=True)


for _backend in (
    Backend("flash", "cu_seqlens", _run_flash, _flash_unavailable),
    Backend("varlen", "cu_seqlens", _run_varlen, _varlen_unavailable),
    Backend("flex", "block_mask", _run_flex, _flex_unavailable),
    Backend("segments", "cu_seqlens", _run_segments, _always),
    Backend("mask", "mask", _run_mask, _always),
    Backend("causal", "none", _run_causal, _always),
):
    register_backend(_backend)


def _layout_problem(name: str, layout: str, causal: bool) -> str | None:
    if name == "causal" and layout != "padded":
        return "is_causal lets packed samples attend to each other; it is for padded batches"
    if layout == "padded" and not causal and name in ("causal", "flash", "varlen", "segments"):
        return "non-causal attention over right-padded rows must mask the padding: use mask or flex"
    return None


def _ruled_out(name: str, device: torch.device, dtype: torch.dtype) -> bool:
    """``auto`` skips ``name`` here whatever its kernel: flex off CUDA (eager there), flash and
    varlen off CUDA or outside fp16/bf16. Asked before ``unavailable``, which imports the kernel:
    varlen's and flex's modules load torch._dynamo, seconds of start-up in a CPU process."""
    if name == "flex":
        return device.type != "cuda"
    kernel_check = BACKENDS[name].unavailable in (_flash_unavailable, _varlen_unavailable)
    return kernel_check and _cuda_half(device, dtype) is not None


def resolve_backend(
    name: str,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    layout: str = "packed",
    causal: bool = True,
    compiled: bool = False,
) -> str:
    """The backend ``name`` runs as for this device, compute dtype and batch layout.

    ``auto``: ``causal`` for causal padded batches; else the first available of ``flash``,
    ``varlen``, ``flex`` (CUDA only: on the CPU flex is eager) and ``segments``. An explicit name that
    cannot run raises :class:`BackendUnavailableError` saying why. ``compiled``: under
    ``torch.compile`` ``auto`` takes ``mask``, not ``segments`` (an eager loop over the samples).
    """
    device = torch.device(device)
    if name == "auto":
        if layout == "padded" and causal:
            return "causal"
        for cand in AUTO_ORDER:
            if _ruled_out(cand, device, dtype) or (compiled and cand == "segments"):
                continue
            ok = BACKENDS[cand].unavailable(device, dtype) is None
            if ok and _layout_problem(cand, layout, causal) is None:
                return cand
        return "mask"
    if name not in BACKENDS:
        raise BackendUnavailableError(
            f"unknown attention backend {name!r}; choose auto or one of {', '.join(BACKENDS)}"
        )
    reason = _layout_problem(name, layout, causal) or BACKENDS[name].unavailable(device, dtype)
    if reason:
        raise BackendUnavailableError(f"attention {name!r} cannot run here: {reason}")
    return name


def _varlen_kwargs(causal: bool) -> dict[str, Any]:
    kernel = _kernel("varlen_attn")
    kwargs = varlen_causal_kwargs(kernel, causal)
    if "enable_gqa" in inspect.signature(kernel).parameters:
        kwargs["enable_gqa"] = True  # used only when k/v have fewer heads than q
    return kwargs


def _cu_seqlens(batch: Any, layout: str) -> torch.Tensor:
    if layout == "padded":  # one segment per row: right padding is causal-safe
        b, t = batch.input_ids.shape
        return torch.arange(0, b * t + 1, t, dtype=torch.int32, device=batch.input_ids.device)
    return batch.cu_seqlens.to(torch.int32)


def attention_meta(
    batch: Any,
    backend: str = "auto",
    *,
    dtype: torch.dtype | None = None,
    causal: bool = True,
    max_seqlen: str = "row",
    block_size: int = masks.FLEX_BLOCK,
) -> AttentionMeta:
    """Resolve ``backend`` for ``batch`` and precompute what its layers need, once.

    ``dtype``: the dtype q/k/v have in the model (the autocast dtype; default float32).
    ``max_seqlen``: ``"row"`` (the row length ``pad_to``, constant per shape: a compiled model
    never specialises on it) or ``"batch"`` (the longest segment: the tightest kernel grid, for
    models that are not compiled). ``cu_seqlens`` is marked dynamic for ``torch.compile``: its
    length (samples + 1) changes from batch to batch while the shape stays.
    """
    if max_seqlen not in MAX_SEQLEN:
        raise ValueError(f"max_seqlen={max_seqlen!r}: choose row or batch")
    layout = batch_layout(batch)
    ids = batch.input_ids
    name = resolve_backend(backend, ids.device, dtype or torch.float32, layout, causal)
    needs = BACKENDS[name].needs
    if needs == "cu_seqlens":
        cu = _cu_seqlens(batch, layout)
        if name == "segments":  # bounds read once, not in every layer; segment ids if compiled
            kw = {"bounds": segment_bounds(cu), "segments": batch.segment_ids()}
            return AttentionMeta(name, causal, cu_seqlens=cu, kernel_kwargs=kw)
        torch._dynamo.mark_dynamic(cu, 0)
        longest = int(ids.shape[1])
        if max_seqlen == "batch" and layout != "padded":
            longest = int(batch.max_seqlen)
        kwargs = _varlen_kwargs(causal) if name == "varlen" else {}
        return AttentionMeta(name, causal, cu_seqlens=cu, max_seqlen=longest, kernel_kwargs=kwargs)
    if needs == "block_mask":
        bm = masks.document_block_mask(batch.segment_ids(), causal, block_size)
        return AttentionMeta(name, causal, block_mask=bm)
    if needs == "mask":
        mask = masks.causal_mask_from_segments(batch.segment_ids(), causal)
        return AttentionMeta(name, causal, mask=mask)
    return AttentionMeta(name, causal)


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch_or_meta: Any,
    causal: bool | None = None,
    backend: str = "auto",
    scale: float | None = None,
) -> torch.Tensor:
    """Attention over ``[B, H, T, D]`` q/k/v that keeps every sample of the batch to itself.

    ``batch_or_meta``: an :class:`AttentionMeta` (built once per batch, shared by all layers;
    ``backend``/``causal`` then come from it) or a varpack batch (a meta is built for this call).
    """
    if isinstance(batch_or_meta, AttentionMeta):
        meta = batch_or_meta
        if causal is not None and causal != meta.causal:
            raise ValueError(f"causal={causal} but the meta was built with causal={meta.causal}")
    else:
        meta = attention_meta(
            batch_or_meta, backend, dtype=q.dtype, causal=True if causal is None else causal
        )
    return BACKENDS[meta.backend].run(q, k, v, meta, scale)


__all__ = [
    "BACKENDS",
    "AttentionMeta",
    "Backend",
    "BackendUnavailableError",
    "attention_meta",
    "batch_layout",
    "packed_attention",
    "register_backend",
    "resolve_backend",
    "varlen_causal_kwargs",
]
