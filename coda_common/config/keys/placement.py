"""``coda.conf`` keys: the submit hook's placement (PCIe and memory-bandwidth spreading,
preferred GPU types, the partitions of CPU-only jobs); every switch is off by default."""

from coda_common.config.keys import key
from coda_common.config.values import (
    gpu_features,
    gpu_types,
    gres_name,
    partition_list,
    positive_float,
)

PCIE_SPREAD_GRES = key(
    "PcieSpreadGres",
    "name or empty",
    "",
    gres_name,
    "Count-only GRES (its per-node count = the node's PCIe domains) that PCIe-heavy "
    "multi-GPU jobs get one unit of, so Slurm never puts more of them on a node than it "
    "has domains; empty = off.",
)

PCIE_HEAVY_BYTES_PER_S = key(
    "PcieHeavyBytesPerS",
    "float",
    "8e9",
    positive_float,
    "A multi-GPU job is PCIe-heavy when its measured PCIe traffic per GPU times its GPUs "
    "per node reaches this many bytes/s (CODA: AlexNet/ResNet50 at 8-12 GB/s) (> 0).",
)

PREFER_GPU_TYPES = key(
    "PreferGpuTypes",
    "list",
    "",
    gpu_types,
    "GPU types, fastest first (e.g. h100,a100,v100): a job that names no GPU type gets "
    "--prefer toward the type it gains most from, or away from the newest when it gains "
    "little; empty = off.",
)

PREFER_GPU_FEATURES = key(
    "PreferGpuFeatures",
    "list of type:feature",
    "",
    gpu_features,
    "Node feature --prefer names for each type of PreferGpuTypes (e.g. "
    "h100:gpu_h100,a100:gpu_a100); a type not listed uses its own name as the feature.",
)

MEM_BW_SPREAD_GRES = key(
    "MemBwSpreadGres",
    "name or empty",
    "",
    gres_name,
    "Count-only GRES (its per-node count = the node's memory bandwidth in "
    "MemBwUnitBytesPerS units) that memory-bound CPU jobs ask for in proportion to their "
    "measured bandwidth; CPU-only jobs get a coda record so coda-node measures them; "
    "empty = off.",
)

MEM_BW_HEAVY_BYTES_PER_S_PER_CPU = key(
    "MemBwHeavyBytesPerSPerCpu",
    "float",
    "2e9",
    positive_float,
    "A CPU job is memory-bound when its measured memory bandwidth per allocated CPU "
    "reaches this many bytes/s; lighter jobs ask for no MemBwSpreadGres (> 0).",
)

MEM_BW_UNIT_BYTES_PER_S = key(
    "MemBwUnitBytesPerS",
    "float",
    "1e9",
    positive_float,
    "Bytes/s one unit of MemBwSpreadGres stands for (> 0).",
)

CPU_JOB_PARTITIONS = key(
    "CpuJobPartitions",
    "list",
    "",
    partition_list,
    "CPU-only jobs submitted without --partition get this partition list (e.g. "
    "batch,gpu_spare; Slurm starts them in whichever can run them first); empty = off.",
)
