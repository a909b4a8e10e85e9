// launch_kernel (src/cuda/launch.h): programmatic dependent launch where the device has compute
// capability 9.0+ (unless PAGEDATTN_CUDA_PDL=0), and its rule kept by kernels that wait first.
//   - a reader sees what a slow writer wrote, both right after it and two launches later through a
//     kernel that touches no memory (completion is transitive), eagerly and in graph replays;
//   - stream capture turns a kernel-after-kernel launch into a programmatic edge exactly where PDL
//     applies (the expectation derived here from the device's capability and the variable, not
//     from the library), and a kernel after a memset into an ordinary edge.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/cuda_test_util.h"
#include "cuda/launch_test_kernels.h"
#include "cuda/workspace.h"

namespace pagedattn::testing {
namespace {

using cuda::DeviceBuffer;

struct Stream {
  cudaStream_t stream = nullptr;
  Stream() { PA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(stream); }
};

// Whether launches on the current device should carry the PDL attribute: compute capability 9.0
// or later and PAGEDATTN_CUDA_PDL not "0".
bool pdl_expected() {
  int device = 0, major = 0;
  PA_CUDA_CHECK(cudaGetDevice(&device));
  PA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  const char* env = std::getenv("PAGEDATTN_CUDA_PDL");
  return major >= 9 && (env == nullptr || std::strcmp(env, "0") != 0);
}

std::vector<int32_t> download(const DeviceBuffer& buffer, int64_t count, cudaStream_t stream) {
  std::vector<int32_t> host(static_cast<size_t>(count));
  PA_CUDA_CHECK(cudaMemcpyAsync(host.data(), buffer.data(), host.size() * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, stream));
  PA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

constexpr int kRounds = 16;
constexpr int64_t kWriteDelayNs = 50'000;  // the writer runs long after its successors could start

// Per round r: the writer puts r + 1 in slot r after a delay; a copy right after it reads the slot
// into direct[r]; an idle kernel; a second copy reads it into chained[r].
void enqueue_rounds(const DeviceBuffer& slots, const DeviceBuffer& direct,
                    const DeviceBuffer& chained, cudaStream_t stream) {
  for (int r = 0; r < kRounds; ++r) {
    launch_slow_write(slots.as<int32_t>() + r, r + 1, kWriteDelayNs, stream);
    launch_copy(slots.as<int32_t>() + r, direct.as<int32_t>() + r, stream);
    launch_idle(stream);
    launch_copy(slots.as<int32_t>() + r, chained.as<int32_t>() + r, stream);
  }
}

void clear(const DeviceBuffer& buffer, cudaStream_t stream) {
  PA_CUDA_CHECK(cudaMemsetAsync(buffer.data(), 0, buffer.bytes(), stream));
}

void expect_rounds(const DeviceBuffer& direct, const DeviceBuffer& chained, cudaStream_t stream,
                   const char* what) {
  const std::vector<int32_t> d = download(direct, kRounds, stream);
  const std::vector<int32_t> c = download(chained, kRounds, stream);
  for (int r = 0; r < kRounds; ++r) {
    EXPECT_EQ(d[static_cast<size_t>(r)], r + 1) << what << ": round " << r << ", next kernel";
    EXPECT_EQ(c[static_cast<size_t>(r)], r + 1) << what << ": round " << r << ", two kernels on";
  }
}

TEST(CudaLaunch, LaterKernelsSeeEarlierWrites) {
  PA_REQUIRE_GPU();
  Stream s;
  const size_t bytes = kRounds * sizeof(int32_t);
  DeviceBuffer slots(bytes), direct(bytes), chained(bytes);

  for (const DeviceBuffer* b : {&slots, &direct, &chained}) clear(*b, s.stream);
  enqueue_rounds(slots, direct, chained, s.stream);
  expect_rounds(direct, chained, s.stream, "eager");

  // The same launches captured once and replayed: the edges between them are the graph's.
  cudaGraph_t graph = nullptr;
  PA_CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue_rounds(slots, direct, chained, s.stream);
  } catch (...) {
    cudaStreamEndCapture(s.stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  PA_CUDA_CHECK(cudaStreamEndCapture(s.stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  PA_CUDA_CHECK(instantiated);
  for (int replay = 0; replay < 3; ++replay) {
    for (const DeviceBuffer* b : {&slots, &direct, &chained}) clear(*b, s.stream);
    PA_CUDA_CHECK(cudaGraphLaunch(exec, s.stream));
    expect_rounds(direct, chained, s.stream, "graph replay");
  }
  PA_CUDA_CHECK(cudaGraphExecDestroy(exec));
}

TEST(CudaLaunch, CaptureMakesProgrammaticEdgesBetweenKernels) {
  PA_REQUIRE_GPU();
  Stream s;
  DeviceBuffer slot(sizeof(int32_t)), out(2 * sizeof(int32_t)), zeros(sizeof(int32_t));
  int32_t* out_values = out.as<int32_t>();

  // writer -> copy (kernel after kernel), memset -> copy (kernel after a memset).
  cudaGraph_t graph = nullptr;
  PA_CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  try {
    launch_slow_write(slot.as<int32_t>(), 7, 1000, s.stream);
    launch_copy(slot.as<int32_t>(), out_values, s.stream);
    PA_CUDA_CHECK(cudaMemsetAsync(zeros.data(), 0, zeros.bytes(), s.stream));
    launch_copy(zeros.as<int32_t>(), out_values + 1, s.stream);
  } catch (...) {
    cudaStreamEndCapture(s.stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  PA_CUDA_CHECK(cudaStreamEndCapture(s.stream, &graph));

  size_t count = 0;
  PA_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> from(count), to(count);
  std::vector<cudaGraphEdgeData> data(count);
  PA_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &count));
  const bool pdl = pdl_expected();
  // writer -> copy, copy -> memset, memset -> copy.
  ASSERT_EQ(count, 3u);
  int kernel_kernel = 0, kernel_memset = 0, memset_kernel = 0;
  for (size_t i = 0; i < count; ++i) {
    cudaGraphNodeType from_type{}, to_type{};
    PA_CUDA_CHECK(cudaGraphNodeGetType(from[i], &from_type));
    PA_CUDA_CHECK(cudaGraphNodeGetType(to[i], &to_type));
    if (from_type == cudaGraphNodeTypeKernel && to_type == cudaGraphNodeTypeKernel) {
      ++kernel_kernel;
      EXPECT_EQ(data[i].type,
                pdl ? cudaGraphDependencyTypeProgrammatic : cudaGraphDependencyTypeDefault)
          << "kernel -> kernel, PDL " << (pdl ? "expected" : "not expected");
    } else if (from_type == cudaGraphNodeTypeKernel && to_type == cudaGraphNodeTypeMemset) {
      ++kernel_memset;
      EXPECT_EQ(data[i].type, cudaGraphDependencyTypeDefault) << "kernel -> memset";
    } else if (from_type == cudaGraphNodeTypeMemset && to_type == cudaGraphNodeTypeKernel) {
      ++memset_kernel;
      EXPECT_EQ(data[i].type, cudaGraphDependencyTypeDefault) << "memset -> kernel";
    }
  }
  EXPECT_EQ(kernel_kernel, 1);
  EXPECT_EQ(kernel_memset, 1);
  EXPECT_EQ(memset_kernel, 1);

  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  PA_CUDA_CHECK(instantiated);
  clear(out, s.stream);
  PA_CUDA_CHECK(cudaMemsetAsync(zeros.data(), 0xff, zeros.bytes(), s.stream));  // the graph zeroes
  PA_CUDA_CHECK(cudaGraphLaunch(exec, s.stream));
  const std::vector<int32_t> values = download(out, 2, s.stream);
  PA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  EXPECT_EQ(values[0], 7);
  EXPECT_EQ(values[1], 0);
}

}  // namespace
}  // namespace pagedattn::testing
