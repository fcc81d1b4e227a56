"""Between padded batches and the packed tokens of flash_attn_varlen_func: unpad_input and pad_input.

FlashAttention-2's ``flash_attn.bert_padding`` helpers, with the same arguments
and return values (those of FlashAttention-2 >= 2.6, whose unpad_input also
returns seqused). Both are differentiable in hidden_states.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["pad_input", "unpad_input"]


def unpad_input(
    hidden_states: Tensor, attention_mask: Tensor, unused_mask: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, int, Tensor]:
    """The tokens of a padded batch that the mask keeps, packed one sequence after another.

    Args:
        hidden_states: (batch, seqlen, ...).
        attention_mask: (batch, seqlen), bool or int: 1 (True) for a real token, 0 for padding.
        unused_mask: (batch, seqlen), bool or int, optional: 1 for tokens that are allocated
            but unused; they are packed with the others (and count in cu_seqlens), but not in
            seqused.

    Returns:
        hidden_states: (total, ...), the kept tokens in order (total = number kept);
        indices: (total,) int64, each kept token's position in the flattened (batch * seqlen) input;
        cu_seqlens: (batch + 1,) int32, the offsets flash_attn_varlen_func takes;
        max_seqlen_in_batch: int, the longest sequence (read on the host: a sync on CUDA);
        seqused: (batch,) int32, the number of tokens attention_mask keeps in each sequence.
    """
    all_masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens_in_batch = all_masks.sum(dim=-1, dtype=torch.int32)
    used_seqlens_in_batch = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen_in_batch = int(seqlens_in_batch.max()) if seqlens_in_batch.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens_in_batch, dim=0, dtype=torch.int32), (1, 0))
    return (
        hidden_states.flatten(0, 1).index_select(0, indices),
        indices,
        cu_seqlens,
        max_seqlen_in_batch,
        used_seqlens_in_batch,
    )


def pad_input(hidden_states: Tensor, indices: Tensor, batch: int, seqlen: int) -> Tensor:
    """The inverse of unpad_input: packed tokens (total, ...) back to (batch, seqlen, ...), zeros
    where no token goes.

    Args:
        hidden_states: (total, ...), e.g. flash_attn_varlen_func's out.
        indices: (total,), unpad_input's indices: each token's position in (batch * seqlen).
        batch, seqlen: the padded shape.
    """
    output = hidden_states.new_zeros((batch * seqlen, *hidden_states.shape[1:]))
    output = output.index_put((indices,), hidden_states)
    return output.unflatten(0, (batch, seqlen))
