// DecodeGraphRunner (include/pagedattn/cuda_graph.h): fixed device buffers, one captured graph
// per padded batch size, steps that copy the new tables in and replay.
//
// Device input buffer, one copy per step: [seq_lens: max_batch][block_table: max_batch x stride].
// Only the first max_batch + num_reqs x stride ints travel; seq_lens past num_reqs are 0, so the
// padding requests of the captured size have no pages (their block-table rows are never read).
// The pinned staging is double-buffered with an event per half, so filling it for step n + 1
// never races the copy of step n.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "cuda/cuda_check.h"
#include "cuda/decode/decode.h"
#include "cuda/decode/decode_params.h"
#include "cuda/workspace.h"
#include "pagedattn/cuda_graph.h"
#include "pagedattn/cuda_planner.h"

namespace pagedattn::cuda {

struct DecodeGraphRunner::State {
  DecodeGraphConfig config;
  cudaStream_t stream = nullptr;
  int32_t max_batch = 0;
  int32_t stride = 0;
  int32_t head_dim = 0;
  int64_t max_pages = 0;
  std::unique_ptr<CudaWorkspace> workspace;
  DeviceBuffer inputs, qo_indptr, kv_indptr, kv_indices, last_page_len, kv_lens, status;
  DeviceBuffer q, out, lse;
  int32_t* staging = nullptr;  // pinned, 2 halves
  cudaEvent_t staged[2] = {nullptr, nullptr};
  int next_half = 0;
  std::vector<cudaGraphExec_t> graphs;

  int64_t input_ints() const { return max_batch + int64_t{max_batch} * stride; }
  TensorView i32(const DeviceBuffer& buffer, int64_t count) const {
    return TensorView::contiguous(buffer.data(), DType::kI32, {count},
                                  Device::cuda(workspace->device()));
  }

  StepMetadata meta(int32_t batch) const {
    StepMetadata m;
    m.batch_size = batch;
    m.qo_indptr = i32(qo_indptr, batch + 1);
    m.kv_indptr = i32(kv_indptr, batch + 1);
    m.kv_indices = i32(kv_indices, max_pages);
    m.kv_last_page_len = i32(last_page_len, batch);
    m.max_q_len = 1;
    return m;
  }

  // The step's device work for padded size `batch` (captured or eager).
  void enqueue(int32_t batch) {
    const Device device = Device::cuda(workspace->device());
    DevicePlanInput input;
    input.table = TensorView::contiguous(inputs.as<int32_t>() + max_batch, DType::kI32,
                                         {batch, stride}, device);
    input.seq_lens = TensorView::contiguous(inputs.data(), DType::kI32, {batch}, device);
    input.num_reqs = batch;
    input.alloc_page_size = config.kv.alloc_page_size();
    input.page_size = config.kv.page_size;
    input.num_alloc_pages = config.kv.num_alloc_pages();
    input.validate = false;
    DevicePlanBuffers buffers{i32(qo_indptr, max_batch + 1), i32(kv_indptr, max_batch + 1),
                              i32(kv_indices, max_pages),    i32(last_page_len, max_batch),
                              i32(kv_lens, max_batch),       i32(status, 4)};
    plan_on_device(input, buffers, stream);
    DecodeArgs args;
    args.q = TensorView::contiguous(q.data(), config.q_dtype,
                                    {batch, config.num_qo_heads, head_dim}, device);
    args.out = TensorView::contiguous(out.data(), config.q_dtype,
                                      {batch, config.num_qo_heads, head_dim}, device);
    if (config.with_lse) {
      args.lse =
          TensorView::contiguous(lse.data(), DType::kF32, {batch, config.num_qo_heads}, device);
    }
    args.kv = config.kv;
    args.meta = meta(batch);
    args.options = config.options;
    args.stream = stream;
    plan_decode(*workspace, describe_op(args), args.meta);
    for (int32_t layer = 0; layer < config.num_layers; ++layer) {
      if (!config.layer_kv.empty()) args.kv = config.layer_kv[layer];
      run_decode(*workspace, args);
    }
  }
};

DecodeGraphRunner::DecodeGraphRunner(const DecodeGraphConfig& config, void* stream)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.config = config;
  s.stream = static_cast<cudaStream_t>(stream);
  PA_CHECK(!config.batch_sizes.empty(), "DecodeGraphConfig.batch_sizes: empty");
  PA_CHECK(std::is_sorted(config.batch_sizes.begin(), config.batch_sizes.end()) &&
               config.batch_sizes.front() >= 1,
           "DecodeGraphConfig.batch_sizes: expected ascending sizes >= 1");
  PA_CHECK(config.max_blocks_per_request >= 1,
           "DecodeGraphConfig.max_blocks_per_request: {} (expected >= 1)",
           config.max_blocks_per_request);
  PA_CHECK(config.num_layers >= 1, "DecodeGraphConfig.num_layers: {} (expected >= 1)",
           config.num_layers);
  PA_CHECK(s.stream != nullptr,
           "DecodeGraphRunner: stream is null (the legacy default stream cannot be captured)");
  config.kv.validate(config.kv.k.device);
  PA_CHECK(config.layer_kv.empty() || std::ssize(config.layer_kv) == config.num_layers,
           "DecodeGraphConfig.layer_kv: {} caches for {} layers (expected one a layer, or none)",
           config.layer_kv.size(), config.num_layers);
  for (size_t layer = 0; layer < config.layer_kv.size(); ++layer) {
    const PagedKv& kv = config.layer_kv[layer];
    kv.validate(config.kv.k.device);
    PA_CHECK(kv.k.dtype == config.kv.k.dtype && kv.layout == config.kv.layout &&
                 kv.page_size == config.kv.page_size && kv.k.shape == config.kv.k.shape &&
                 kv.v.shape == config.kv.v.shape,
             "DecodeGraphConfig.layer_kv[{}]: not shaped like kv (dtype, layout, page size and "
             "K / V shapes must match)",
             layer);
  }
  s.max_batch = config.batch_sizes.back();
  s.stride = config.max_blocks_per_request;
  s.head_dim = config.kv.head_dim();
  s.max_pages =
      int64_t{s.max_batch} * s.stride * (config.kv.alloc_page_size() / config.kv.page_size);
  WorkspaceLimits limits;
  limits.max_batch = s.max_batch;
  limits.max_pages = s.max_pages;
  limits.max_qo_rows = s.max_batch;
  limits.max_qo_heads = config.num_qo_heads;
  limits.max_head_dim = s.head_dim;
  s.workspace = std::make_unique<CudaWorkspace>(limits);
  s.workspace->stream = stream;
  if (config.trace) s.workspace->enable_decode_trace(config.num_layers);
  const auto i32 = sizeof(int32_t);
  s.inputs = DeviceBuffer(i32 * s.input_ints());
  PA_CUDA_CHECK(cudaMemset(s.inputs.data(), 0, i32 * s.input_ints()));
  s.qo_indptr = DeviceBuffer(i32 * (s.max_batch + 1));
  s.kv_indptr = DeviceBuffer(i32 * (s.max_batch + 1));
  s.kv_indices = DeviceBuffer(i32 * std::max<int64_t>(1, s.max_pages));
  s.last_page_len = DeviceBuffer(i32 * s.max_batch);
  s.kv_lens = DeviceBuffer(i32 * s.max_batch);
  s.status = DeviceBuffer(i32 * 4);
  const size_t rows = size_t(s.max_batch) * config.num_qo_heads;
  s.q = DeviceBuffer(rows * s.head_dim * dtype_size(config.q_dtype));
  PA_CUDA_CHECK(cudaMemset(s.q.data(), 0, s.q.bytes()));
  s.out = DeviceBuffer(rows * s.head_dim * dtype_size(config.q_dtype));
  if (config.with_lse) s.lse = DeviceBuffer(rows * sizeof(float));
  PA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s.staging), 2 * i32 * s.input_ints()));
  std::memset(s.staging, 0, 2 * i32 * s.input_ints());
  for (auto& event : s.staged) {
    PA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  // One eager run per size first: kernel attributes are set and modules loaded outside capture.
  for (int32_t size : config.batch_sizes) s.enqueue(size);
  PA_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  for (int32_t size : config.batch_sizes) {
    cudaGraph_t graph = nullptr;
    PA_CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
    try {
      s.enqueue(size);
    } catch (...) {
      cudaStreamEndCapture(s.stream, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    PA_CUDA_CHECK(cudaStreamEndCapture(s.stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    PA_CUDA_CHECK(status);
    s.graphs.push_back(exec);
  }
}

DecodeGraphRunner::~DecodeGraphRunner() {
  if (!state_) return;
  State& s = *state_;
  cudaStreamSynchronize(s.stream);
  for (cudaGraphExec_t exec : s.graphs) cudaGraphExecDestroy(exec);
  for (cudaEvent_t event : s.staged) {
    if (event != nullptr) cudaEventDestroy(event);
  }
  if (s.staging != nullptr) cudaFreeHost(s.staging);
}

int32_t DecodeGraphRunner::max_batch() const { return state_->max_batch; }

TensorView DecodeGraphRunner::q() const {
  const State& s = *state_;
  return TensorView::contiguous(s.q.data(), s.config.q_dtype,
                                {s.max_batch, s.config.num_qo_heads, s.head_dim},
                                Device::cuda(s.workspace->device()));
}

TensorView DecodeGraphRunner::out() const {
  const State& s = *state_;
  return TensorView::contiguous(s.out.data(), s.config.q_dtype,
                                {s.max_batch, s.config.num_qo_heads, s.head_dim},
                                Device::cuda(s.workspace->device()));
}

TensorView DecodeGraphRunner::lse() const {
  const State& s = *state_;
  if (!s.config.with_lse) return {};
  return TensorView::contiguous(s.lse.data(), DType::kF32, {s.max_batch, s.config.num_qo_heads},
                                Device::cuda(s.workspace->device()));
}

int32_t DecodeGraphRunner::step(std::span<const int32_t> block_table,
                                std::span<const int32_t> seq_lens, bool use_graph) {
  State& s = *state_;
  const int64_t num_reqs = static_cast<int64_t>(seq_lens.size());
  PA_CHECK(num_reqs >= 1 && num_reqs <= s.max_batch,
           "DecodeGraphRunner::step: {} requests (expected 1 .. {})", num_reqs, s.max_batch);
  PA_CHECK(static_cast<int64_t>(block_table.size()) >= num_reqs * s.stride,
           "DecodeGraphRunner::step: block_table has {} entries, expected num_reqs x {} = {}",
           block_table.size(), s.stride, num_reqs * s.stride);
  const auto size = std::lower_bound(s.config.batch_sizes.begin(), s.config.batch_sizes.end(),
                                     static_cast<int32_t>(num_reqs));
  const int32_t batch = *size;
  const size_t index = static_cast<size_t>(size - s.config.batch_sizes.begin());

  // Stage [seq_lens (zero-padded) | block table rows] and copy them in with one transfer.
  const int half = s.next_half;
  s.next_half ^= 1;
  PA_CUDA_CHECK(cudaEventSynchronize(s.staged[half]));  // its previous copy has finished
  int32_t* staging = s.staging + half * s.input_ints();
  std::memcpy(staging, seq_lens.data(), num_reqs * sizeof(int32_t));
  std::memset(staging + num_reqs, 0, (s.max_batch - num_reqs) * sizeof(int32_t));
  std::memcpy(staging + s.max_batch, block_table.data(), num_reqs * s.stride * sizeof(int32_t));
  const size_t bytes = (s.max_batch + num_reqs * s.stride) * sizeof(int32_t);
  PA_CUDA_CHECK(cudaMemcpyAsync(s.inputs.data(), staging, bytes, cudaMemcpyHostToDevice, s.stream));
  PA_CUDA_CHECK(cudaEventRecord(s.staged[half], s.stream));
  if (s.config.trace) {  // phases a CTA does not reach this step read 0, not an older stamp
    const DeviceBuffer& stamps = s.workspace->decode_trace_buffer();
    PA_CUDA_CHECK(cudaMemsetAsync(stamps.data(), 0, stamps.bytes(), s.stream));
  }
  if (use_graph) {
    PA_CUDA_CHECK(cudaGraphLaunch(s.graphs[index], s.stream));
  } else {
    s.enqueue(batch);
  }
  return batch;
}

DecodeTrace DecodeGraphRunner::trace() const {
  const State& s = *state_;
  PA_CHECK(s.config.trace, "DecodeGraphRunner::trace: the runner was built without config.trace");
  static_assert(DecodeTrace::kPhases == kDecodeTracePhases);
  DecodeTrace trace;
  trace.layers = s.config.num_layers;
  trace.ctas = s.workspace->decode_trace_ctas();
  // [layers][ctas][kDecodeTraceWords]: the phases' stamps, then the start and end clock64.
  const DeviceBuffer& rows = s.workspace->decode_trace_buffer();
  std::vector<uint64_t> words(rows.bytes() / sizeof(uint64_t));
  PA_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  PA_CUDA_CHECK(cudaMemcpy(words.data(), rows.data(), rows.bytes(), cudaMemcpyDeviceToHost));
  const size_t row_count = words.size() / kDecodeTraceWords;
  trace.stamps.reserve(row_count * kDecodeTracePhases);
  trace.sm_clocks.reserve(row_count * 2);
  for (size_t row = 0; row < row_count; ++row) {
    const uint64_t* word = words.data() + row * kDecodeTraceWords;
    trace.stamps.insert(trace.stamps.end(), word, word + kDecodeTracePhases);
    trace.sm_clocks.insert(trace.sm_clocks.end(), word + kDecodeTracePhases,
                           word + kDecodeTraceWords);
  }
  return trace;
}

void DecodeGraphRunner::check_last_step() const {
  const State& s = *state_;
  read_plan_status(s.i32(s.status, 4), s.stream);  // synchronises the stream
  s.workspace->check_device_errors();  // what the decode kernels recorded (common/guard.h)
}

}  // namespace pagedattn::cuda
