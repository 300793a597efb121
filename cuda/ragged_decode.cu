// Ragged-group decode attention with the AOT split map (CUDA). Same math as
// tangram_sglang/attention/reference.py::ragged_decode_torch (split cut) and
// triton_decode.py:
//   split kernel, grid (T, B): CTA (t, b) takes group g = cta_group[t], piece
//     s = cta_split[t] of (b, g): slots [lo + s*c, min(lo + (s+1)*c, len)), c = ceil((len - lo) / S[g]),
//     lo = 0, or max(len - window, 0) in a sliding-window layer;
//     for each head slot p < group_size[g] it runs an online softmax of the gqa
//     query heads of that KV head over the piece, TILE slots at a time, and
//     writes a partial (o, lse) per row r = p * gqa + j;
//   merge kernel, grid (G, B): log-sum-exp merge of the S[g] partials of every
//     row, written to the row's query head q_head[g, r].
// Scores: one warp per slot (lanes split d, coalesced K reads); values: one
// thread per (row, channel) (coalesced V reads). Accumulation in float32.
// Pages are q's type or FP8 (e4m3 / e5m2): read as float, their scales applied by
// the caller (k_scale folded into sm_scale, v_scale on the output).
#include "ragged_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;          // slots per step
constexpr int kMaxGqa = 16;
constexpr int kMaxHeadDim = 256;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 x) { return static_cast<float>(x); }
__device__ __forceinline__ float to_float(__nv_fp8_e5m2 x) { return static_cast<float>(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, o));
  return x;
}

struct Smem {  // dynamic shared memory carve-up for one head slot
  float* q;      // [gqa][d]
  float* acc;    // [gqa][d]
  float* score;  // [gqa][kTile]
  float* m;      // [gqa]
  float* l;      // [gqa]
  float* alpha;  // [gqa]
  int64_t* loc;  // [kTile]
};

__device__ Smem carve(char* base, int gqa, int d) {
  Smem s;
  s.loc = reinterpret_cast<int64_t*>(base);
  s.q = reinterpret_cast<float*>(base + kTile * sizeof(int64_t));
  s.acc = s.q + gqa * d;
  s.score = s.acc + gqa * d;
  s.m = s.score + gqa * kTile;
  s.l = s.m + gqa;
  s.alpha = s.l + gqa;
  return s;
}

// Scores of one tile: warp w takes slots w, w + kWarps, ...; then per-row
// online-softmax bookkeeping (one warp per row).
template <typename KV>
__device__ void score_tile(const TangramDecodeParams& p, const KV* k, Smem& s, int head_slot, int t0, int n) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, d = p.head_dim, gqa = p.gqa;
  for (int i = warp; i < kTile; i += kWarps) {
    float part[kMaxGqa];
    for (int j = 0; j < gqa; ++j) part[j] = 0.f;
    const bool valid = i < n;
    if (valid) {
      const int64_t loc = s.loc[i];
      const KV* krow = k + (loc * p.heads_per_group + head_slot) * d;
      for (int c = lane; c < d; c += 32) {
        const float kc = to_float(krow[c]);
        for (int j = 0; j < gqa; ++j) part[j] += s.q[j * d + c] * kc;
      }
    }
    for (int j = 0; j < gqa; ++j) {
      const float dot = warp_sum(part[j]);
      if (lane == 0) s.score[j * kTile + i] = valid ? dot * p.sm_scale : -INFINITY;
    }
  }
  __syncthreads();
  for (int j = warp; j < gqa; j += kWarps) {
    float mx = -INFINITY;
    for (int i = lane; i < kTile; i += 32) mx = fmaxf(mx, s.score[j * kTile + i]);
    mx = warp_max(mx);
    const float m_new = fmaxf(s.m[j], mx);  // finite: the tile has >= 1 slot
    float sum = 0.f;
    for (int i = lane; i < kTile; i += 32) {
      const float e = __expf(s.score[j * kTile + i] - m_new);
      s.score[j * kTile + i] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      const float a = __expf(s.m[j] - m_new);
      s.alpha[j] = a;
      s.l[j] = s.l[j] * a + sum;
      s.m[j] = m_new;
    }
  }
  __syncthreads();
}

template <typename T, typename KV>
__global__ void split_kernel(TangramDecodeParams p) {
  extern __shared__ __align__(16) char smem_raw[];
  const int t = blockIdx.x, b = blockIdx.y, d = p.head_dim, gqa = p.gqa, rows = p.heads_per_group * gqa;
  const int g = p.cta_group[t], piece_id = p.cta_split[t], nsplit = p.splits[g];
  const int len = p.seq_lens[b * p.stride_lb + g];
  const int lo = p.window > 0 ? max(len - p.window, 0) : 0;  // a window layer: its newest window slots
  const int piece = (len - lo + nsplit - 1) / nsplit;
  const int start = lo + piece_id * piece;
  const int end = min(start + piece, len);
  const int32_t* table = p.block_table + b * p.stride_btb + g * p.stride_btg;
  const T* q = static_cast<const T*>(p.q);
  const KV* k = static_cast<const KV*>(p.k_pages);
  const KV* v = static_cast<const KV*>(p.v_pages);
  Smem s = carve(smem_raw, gqa, d);
  for (int hs = 0; hs < p.group_size[g]; ++hs) {
    const int64_t* qh = p.q_head + static_cast<int64_t>(g) * rows + hs * gqa;
    for (int i = threadIdx.x; i < gqa * d; i += kThreads) {
      s.q[i] = to_float(q[b * p.stride_qb + qh[i / d] * p.stride_qh + i % d]);
      s.acc[i] = 0.f;
    }
    for (int j = threadIdx.x; j < gqa; j += kThreads) { s.m[j] = -INFINITY; s.l[j] = 0.f; }
    __syncthreads();
    for (int t0 = start; t0 < end; t0 += kTile) {
      const int n = min(kTile, end - t0);
      for (int i = threadIdx.x; i < n; i += kThreads) {
        const int slot = t0 + i;
        s.loc[i] = static_cast<int64_t>(table[slot / p.page_size]) * p.page_size + slot % p.page_size;
      }
      __syncthreads();
      score_tile<KV>(p, k, s, hs, t0, n);
      for (int i = threadIdx.x; i < gqa * d; i += kThreads) {
        const int j = i / d, c = i % d;
        float a = s.acc[i] * s.alpha[j];
        for (int u = 0; u < n; ++u)
          a += s.score[j * kTile + u] * to_float(v[(s.loc[u] * p.heads_per_group + hs) * d + c]);
        s.acc[i] = a;
      }
      __syncthreads();
    }
    const int64_t base = (static_cast<int64_t>(b) * p.num_ctas + t) * rows + hs * gqa;
    for (int i = threadIdx.x; i < gqa * d; i += kThreads) {
      const int j = i / d;
      const float l = s.l[j];
      p.mid_o[(base + j) * d + i % d] = l > 0.f ? s.acc[i] / l : 0.f;
    }
    for (int j = threadIdx.x; j < gqa; j += kThreads)
      p.mid_lse[base + j] = s.l[j] > 0.f ? s.m[j] + logf(s.l[j]) : -INFINITY;
    __syncthreads();
  }
}

template <typename T>
__global__ void merge_kernel(TangramDecodeParams p) {
  const int g = blockIdx.x, b = blockIdx.y, d = p.head_dim, rows = p.heads_per_group * p.gqa;
  const int valid_rows = p.group_size[g] * p.gqa, nsplit = p.splits[g], off = p.cta_offset[g];
  T* o = static_cast<T*>(p.o);
  for (int i = threadIdx.x; i < valid_rows * d; i += blockDim.x) {
    const int r = i / d, c = i % d;
    float m = -INFINITY, den = 0.f, acc = 0.f;
    for (int sp = 0; sp < nsplit; ++sp) {
      const int64_t row = (static_cast<int64_t>(b) * p.num_ctas + off + sp) * rows + r;
      const float lse = p.mid_lse[row];
      if (lse == -INFINITY) continue;
      const float m_new = fmaxf(m, lse);
      const float a = __expf(m - m_new), w = __expf(lse - m_new);
      den = den * a + w;
      acc = acc * a + p.mid_o[row * d + c] * w;
      m = m_new;
    }
    const int64_t qh = p.q_head[static_cast<int64_t>(g) * rows + r];
    o[b * p.stride_ob + qh * p.stride_oh + c] = from_float<T>(den > 0.f ? acc / den : 0.f);
    if (c == 0) p.lse[b * p.stride_lseb + qh] = den > 0.f ? m + logf(den) : -INFINITY;
  }
}

template <typename T, typename KV>
cudaError_t launch(const TangramDecodeParams& p, cudaStream_t stream) {
  const size_t smem = kTile * sizeof(int64_t) + sizeof(float) * (2 * p.gqa * p.head_dim + p.gqa * kTile + 3 * p.gqa);
  if (p.gqa > kMaxGqa || p.head_dim > kMaxHeadDim) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.num_ctas == 0) return cudaSuccess;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(split_kernel<T, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  split_kernel<T, KV><<<dim3(p.num_ctas, p.batch), kThreads, smem, stream>>>(p);
  merge_kernel<T><<<dim3(p.num_groups, p.batch), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_pages(const TangramDecodeParams& p, int kv_dtype, int dtype, cudaStream_t stream) {
  if (kv_dtype == dtype) return launch<T, T>(p, stream);
  if (kv_dtype == TANGRAM_FP8_E4M3) return launch<T, __nv_fp8_e4m3>(p, stream);
  if (kv_dtype == TANGRAM_FP8_E5M2) return launch<T, __nv_fp8_e5m2>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

extern "C" cudaError_t tangram_ragged_decode(const TangramDecodeParams* params, int dtype, int kv_dtype,
                                             cudaStream_t stream) {
  switch (dtype) {
    case TANGRAM_F32: return launch_pages<float>(*params, kv_dtype, dtype, stream);
    case TANGRAM_F16: return launch_pages<__half>(*params, kv_dtype, dtype, stream);
    case TANGRAM_BF16: return launch_pages<__nv_bfloat16>(*params, kv_dtype, dtype, stream);
    default: return cudaErrorInvalidValue;
  }
}

extern "C" int tangram_ragged_decode_max_gqa(void) { return kMaxGqa; }
extern "C" int tangram_ragged_decode_max_head_dim(void) { return kMaxHeadDim; }
