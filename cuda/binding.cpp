// Torch binding of the ragged decode kernels (built by
// tangram_sglang/attention/cuda_ext.py with torch.utils.cpp_extension).
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "ragged_decode.h"

namespace {

int dtype_code(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat) return TANGRAM_F32;
  if (t.scalar_type() == at::kHalf) return TANGRAM_F16;
  if (t.scalar_type() == at::kBFloat16) return TANGRAM_BF16;
  if (t.scalar_type() == at::kFloat8_e4m3fn) return TANGRAM_FP8_E4M3;
  if (t.scalar_type() == at::kFloat8_e5m2) return TANGRAM_FP8_E5M2;
  TORCH_CHECK(false, "tangram ragged decode: unsupported dtype ", t.scalar_type());
}

void check_int(const at::Tensor& t, at::ScalarType want, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == want, name, " must be a CUDA tensor of ", want);
  TORCH_CHECK(t.stride(-1) == 1, name, " needs a unit stride on its last dimension");
}

}  // namespace

// Returns (o [B, Hq, d] in q's dtype, lse float32 [B, Hq]).
std::vector<at::Tensor> ragged_decode(at::Tensor q, at::Tensor k_pages, at::Tensor v_pages,
                                      at::Tensor block_table, at::Tensor seq_lens, at::Tensor q_head,
                                      at::Tensor group_size, at::Tensor splits, at::Tensor cta_offset,
                                      at::Tensor cta_group, at::Tensor cta_split, int64_t gqa,
                                      double sm_scale, int64_t window) {
  TORCH_CHECK(q.is_cuda() && q.dim() == 3 && q.stride(-1) == 1, "q must be CUDA [B, Hq, d] with unit last stride");
  TORCH_CHECK(k_pages.is_contiguous() && v_pages.is_contiguous(), "k_pages and v_pages must be contiguous");
  const bool fp8 = k_pages.scalar_type() == at::kFloat8_e4m3fn || k_pages.scalar_type() == at::kFloat8_e5m2;
  TORCH_CHECK((fp8 || k_pages.scalar_type() == q.scalar_type()) && v_pages.scalar_type() == k_pages.scalar_type(),
              "k_pages and v_pages must share a dtype: q's, or FP8 (e4m3fn / e5m2)");
  check_int(block_table, at::kInt, "block_table");
  check_int(seq_lens, at::kInt, "seq_lens");
  check_int(q_head, at::kLong, "q_head");
  for (auto* t : {&group_size, &splits, &cta_offset, &cta_group, &cta_split}) check_int(*t, at::kInt, "split/group table");
  const int64_t batch = q.size(0), d = q.size(2), hp = k_pages.size(2), num_ctas = cta_group.size(0);
  TORCH_CHECK(d <= tangram_ragged_decode_max_head_dim() && gqa <= tangram_ragged_decode_max_gqa(),
              "head_dim or gqa above the kernel's limits");
  auto f32 = q.options().dtype(at::kFloat);
  auto o = at::empty_like(q);
  auto lse = at::empty({batch, q.size(1)}, f32);
  auto mid_o = at::empty({batch, num_ctas, hp * gqa, d}, f32);
  auto mid_lse = at::empty({batch, num_ctas, hp * gqa}, f32);
  TangramDecodeParams p{};
  p.q = q.data_ptr(); p.k_pages = k_pages.data_ptr(); p.v_pages = v_pages.data_ptr();
  p.o = o.data_ptr(); p.lse = lse.data_ptr<float>();
  p.mid_o = mid_o.data_ptr<float>(); p.mid_lse = mid_lse.data_ptr<float>();
  p.block_table = block_table.data_ptr<int32_t>(); p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.splits = splits.data_ptr<int32_t>(); p.cta_offset = cta_offset.data_ptr<int32_t>();
  p.cta_group = cta_group.data_ptr<int32_t>(); p.cta_split = cta_split.data_ptr<int32_t>();
  p.q_head = q_head.data_ptr<int64_t>(); p.group_size = group_size.data_ptr<int32_t>();
  p.stride_qb = q.stride(0); p.stride_qh = q.stride(1); p.stride_ob = o.stride(0); p.stride_oh = o.stride(1);
  p.stride_btb = block_table.stride(0); p.stride_btg = block_table.stride(1);
  p.stride_lb = seq_lens.stride(0); p.stride_lseb = lse.stride(0);
  p.batch = static_cast<int>(batch); p.num_groups = static_cast<int>(splits.size(0));
  p.num_ctas = static_cast<int>(num_ctas); p.page_size = static_cast<int>(k_pages.size(1));
  p.heads_per_group = static_cast<int>(hp); p.gqa = static_cast<int>(gqa); p.head_dim = static_cast<int>(d);
  p.sm_scale = static_cast<float>(sm_scale);
  p.window = static_cast<int>(window);
  const cudaError_t err = tangram_ragged_decode(&p, dtype_code(q), dtype_code(k_pages),
                                                c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "tangram ragged decode launch failed: ", cudaGetErrorString(err));
  return {o, lse};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("ragged_decode", &ragged_decode, "Ragged-group decode attention with the AOT split map");
}
