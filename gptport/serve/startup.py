"""What serve's startup line says beyond the model and its slots: whether the KV cache is held from the start,
prefix caching's state, and a gated int8 variant beside the fp32 graph that runs. No torch here."""

from __future__ import annotations

from typing import Any

from gptport import contract
from gptport.errors import GptportError


def int8_hint(s: Any, opened: Any) -> str:
    """Serve runs the precision asked for (fp32 by default; nothing is substituted); where a gated int8
    variant of the same graph is here, the startup line says so (on CPUs with VNNI it serves faster)."""
    from gptport.runtime.onnx_engine import file_metadata  # onnxruntime: loaded with the model, not before

    if opened.precision != "fp32" or opened.provider != "cpu":
        return ""
    kind = contract.CACHE_STATIC_KV8 if s.kv_dtype == "int8" else opened.cache
    path = s.model_dir / contract.onnx_file("int8", kind)
    try:
        gated = path.is_file() and file_metadata(path).get(contract.META_GATED) == "true"
    except GptportError:
        return ""
    return f" · a gated int8 variant is here ({path.name}: --precision int8)" if gated else ""


def prefix_cache(s: Any, scheduler: Any) -> str:
    """What the startup line says of prefix caching."""
    if scheduler.prefix_cache:
        return "on"
    return "off (--no-prefix-cache)" if not s.prefix_cache else "off (static-cache graphs only)"


def residency(slots: Any) -> str:
    """What the startup line says of the KV cache's memory: held from the start, or taken as rows are written
    because half of the memory known to be available is less (hugepages.fits)."""
    resident = getattr(slots, "resident", None)
    if resident is None:  # a cache on the device, or the contract graph's
        return ""
    return ", resident" if resident else ", taken as rows fill: more than half the memory known to be available"
