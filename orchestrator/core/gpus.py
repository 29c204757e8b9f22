"""What this project knows of each GPU type, in one table: memory, peak throughput, bf16, SkyPilot's name.

Keys are the price catalog's ``gpu_type`` names (``conf/pricing.yaml``); the
catalog's own ``memory_gb`` wins where it has one. Figures are from vendor data
sheets (peak dense 16-bit tensor TFLOPs; T4 has no bf16, so its fp16 figure).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

CPU_TYPES = frozenset({"cpu", "none", ""})  # gpu_type values of a job without a GPU


@dataclass(frozen=True)
class GpuType:
    memory_gb: float
    peak_tflops: Optional[float]
    bf16: bool
    skypilot_name: str


GPUS: dict[str, GpuType] = {
    "t4": GpuType(16, 65.0, False, "T4"),  # pre-Ampere: bfloat16 is emulated or refused
    "v100": GpuType(16, 125.0, False, "V100"),
    "a10g": GpuType(24, 70.0, True, "A10G"),
    "l4": GpuType(24, 121.0, True, "L4"),
    "l40s": GpuType(48, 362.0, True, "L40S"),
    "a100-40gb": GpuType(40, 312.0, True, "A100"),
    "a100-80gb": GpuType(80, 312.0, True, "A100-80GB"),
    "h100-80gb": GpuType(80, 989.0, True, "H100"),
    "h200": GpuType(141, 989.0, True, "H200"),
}


def is_cpu(gpu_type: Any) -> bool:
    return str(gpu_type or "none").lower() in CPU_TYPES


def gpu_memory_gb(gpu_type: str, catalog: Optional[Mapping[str, Any]] = None) -> Optional[float]:
    """Memory of one GPU of ``gpu_type``: the catalog's memory_gb, else the table's; None if unknown."""
    entry = (catalog or {}).get(gpu_type)
    if isinstance(entry, Mapping) and entry.get("memory_gb"):
        return float(entry["memory_gb"])
    known = GPUS.get(str(gpu_type).lower())
    return float(known.memory_gb) if known else None


def skypilot_name(gpu_type: str) -> str:
    known = GPUS.get(str(gpu_type).lower())
    return known.skypilot_name if known else str(gpu_type).upper()
