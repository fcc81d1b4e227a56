"""flashattn: hand-written CUDA FlashAttention kernels for PyTorch.

``flash_attn_func`` and its packed variants, ``flash_attn_varlen_func`` and
its packed variants (with ``unpad_input`` and ``pad_input`` to get there from
a padded batch) and ``flash_attn_with_kvcache`` (inference over a contiguous
or paged KV cache, with ``KVCache`` for generation loops and
``apply_rotary_emb``) are drop-ins for FlashAttention-2's functions. They run the
CUDA kernels on CUDA tensors and a PyTorch implementation of the same
algorithm on CPU tensors. The naive reference used by tests and benchmarks is
``flashattn.reference.attention_ref``. ``flashattn.parallel`` splits one sequence across the
ranks of a torch.distributed process group (ring attention, Ulysses).
"""

from . import flash_attn_interface  # flash-attn's module of that name: the private entry points too
from . import nn  # the modules: flashattn.nn.MultiheadAttention, MHA, ...
from . import parallel  # context parallelism over torch.distributed: ring_attention, ulysses_attention
from ._extension import (HAS_CUDA_KERNELS, NOT_BUILT_REASON, check_faults, cuda_available, cuda_unavailable_reason,
                         kernel_family)
from .interface import (
    flash_attn_combine,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from .kvcache import KVCache, apply_rotary_emb, flash_attn_with_kvcache
from .padding import pad_input, unpad_input

__version__ = "0.1.0"

__all__ = [
    "HAS_CUDA_KERNELS",
    "KVCache",
    "NOT_BUILT_REASON",
    "__version__",
    "apply_rotary_emb",
    "check_faults",
    "cuda_available",
    "cuda_unavailable_reason",
    "flash_attn_interface",
    "flash_attn_combine",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "kernel_family",
    "nn",
    "pad_input",
    "parallel",
    "unpad_input",
]
