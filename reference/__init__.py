"""reference: the float64 NumPy oracle of the course. Imports nothing from the GPU world."""

from .attention import attention, attention_scores, causal_mask, softmax_rows
from .llmc import attention_forward_llmc, permute_qkv, unpermute
from .softmax import online_update, softmax_naive, softmax_online, softmax_safe
from .tiled import flash_attention_1, flash_attention_2, merge_partials, split_kv_attention
from .inputs import make_qkv
from .backward import attention_backward, attention_probabilities
from .decode import (append_kv, decode_attention, decode_attention_rows, decode_attention_split,
                     decode_split_bounds, gather_kv)
from .sampling import (beam_step, cdf_margin, log_softmax, philox4x32, philox_uniform, ranking, reorder_cache, sample,
                       sample_from, sampling_probs, top_k_mask, top_p_mask)
from .varlen import (bert_layer_packed, bert_layer_padded, check_cu_seqlens, cu_seqlens_from_lengths,
                     lengths_from_mask, make_bert_weights, padded_attention, remove_padding, restore_padding,
                     token_offsets, varlen_attention)
from .variants import EMPTY, FULL, PARTIAL, attention_variant, attention_variant_backward, block_mask, variant_mask

__all__ = [
    "attention", "attention_scores", "causal_mask", "softmax_rows",
    "attention_forward_llmc", "permute_qkv", "unpermute",
    "online_update", "softmax_naive", "softmax_online", "softmax_safe",
    "flash_attention_1", "flash_attention_2", "merge_partials", "split_kv_attention",
    "make_qkv",
    "decode_attention", "decode_attention_rows", "decode_attention_split", "decode_split_bounds", "gather_kv",
    "append_kv",
    "attention_backward", "attention_probabilities",
    "lengths_from_mask", "cu_seqlens_from_lengths", "check_cu_seqlens", "token_offsets", "remove_padding",
    "restore_padding", "varlen_attention", "padded_attention", "bert_layer_padded", "bert_layer_packed",
    "make_bert_weights",
    "beam_step", "cdf_margin", "log_softmax", "philox4x32", "philox_uniform", "ranking", "reorder_cache", "sample",
    "sample_from", "sampling_probs", "top_k_mask", "top_p_mask",
    "attention_variant", "attention_variant_backward", "variant_mask", "block_mask", "EMPTY", "FULL", "PARTIAL",
]
