// Ragged-group decode attention driven by the split map (Tangram, paper 4.3).
// Plain CUDA interface shared by the kernels (ragged_decode.cu) and the torch
// binding (binding.cpp); no torch headers here, so nvcc alone compiles the
// kernels. Layouts are those of tangram_sglang/attention (layer_meta.py,
// split_row.py): q [B, Hq, d]; k/v pages [num_pages, P, H_p, d] contiguous, in q's
// dtype or FP8 (e4m3 / e5m2, scales applied by the caller);
// block_table int32 [B, G, max_pages]; seq_lens int32 [B, G];
// q_head int64 [G, H_p * gqa]; group_size int32 [G];
// splits, cta_offset int32 [G]; cta_group, cta_split int32 [T], T = sum(splits).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

enum TangramDType { TANGRAM_F32 = 0, TANGRAM_F16 = 1, TANGRAM_BF16 = 2, TANGRAM_FP8_E4M3 = 3, TANGRAM_FP8_E5M2 = 4 };

struct TangramDecodeParams {
  const void* q;
  const void* k_pages;
  const void* v_pages;
  void* o;              // [B, Hq, d], q's dtype
  float* lse;           // [B, Hq]
  float* mid_o;         // [B, T, H_p * gqa, d] scratch
  float* mid_lse;       // [B, T, H_p * gqa] scratch
  const int32_t* block_table;
  const int32_t* seq_lens;
  const int32_t* splits;
  const int32_t* cta_offset;
  const int32_t* cta_group;
  const int32_t* cta_split;
  const int64_t* q_head;
  const int32_t* group_size;
  int64_t stride_qb, stride_qh, stride_ob, stride_oh;
  int64_t stride_btb, stride_btg, stride_lb, stride_lseb;
  int batch, num_groups, num_ctas, page_size, heads_per_group, gqa, head_dim;
  int window;           // 0, or a sliding-window layer's window: read the newest `window` slots
  float sm_scale;
};

#ifdef __cplusplus
extern "C" {
#endif
// Launches the split and merge kernels on `stream`; returns the launch status. dtype: q's and
// o's; kv_dtype: the pages' (dtype itself or an FP8 code).
cudaError_t tangram_ragged_decode(const TangramDecodeParams* params, int dtype, int kv_dtype, cudaStream_t stream);
// Largest gqa and head_dim the kernels accept.
int tangram_ragged_decode_max_gqa(void);
int tangram_ragged_decode_max_head_dim(void);
#ifdef __cplusplus
}
#endif
