"""flashattn: hand-written CUDA FlashAttention kernels for PyTorch.

``flash_attn_func`` and its packed variants are drop-ins for FlashAttention-2's
functions. They run the CUDA kernels on CUDA tensors and a PyTorch
implementation of the same algorithm on CPU tensors. The naive reference used
by tests and benchmarks is ``flashattn.reference.attention_ref``.
"""

from . import nn  # the modules: flashattn.nn.MultiheadAttention, MHA, ...
from ._extension import HAS_CUDA_KERNELS, NOT_BUILT_REASON, cuda_available, cuda_unavailable_reason
from .interface import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func

__version__ = "0.1.0"

__all__ = [
    "HAS_CUDA_KERNELS",
    "NOT_BUILT_REASON",
    "__version__",
    "cuda_available",
    "cuda_unavailable_reason",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "nn",
]
