// Host planner vs GPU planner on the same tables (see bench_cuda_device.h): for each form (block
// table or token->slot table), batch, kv_len and attention page size P,
//   host_us     the host's plan() + split_kv_partition(), wall time (steady_clock), median;
//   gpu_us      the device's plan_on_device() + split_kv_on_device(), DEVICE time between CUDA
//               events, median. The launches are queued behind a 256 MiB memset (the L2 flush
//               of median_device_ns), so the events time the kernels back to back, not the
//               host's launch latency (an idle GPU waiting for each launch would time the host);
//   enqueue_us  the host time to issue those GPU planner calls (argument checks + launches, no
//               synchronisation): what the GPU planner costs the CPU each step outside a graph;
//   idle_us     the same calls timed by events on an idle GPU (each kernel waits for the host's
//               next launch): max(device, enqueue) roughly, the figure earlier runs printed.
// Both planners validate their input; the GPU's kv_indices are compared with the host's.
// Allocation pages of alloc_page_size tokens, shuffled over the pool; the split rule is the
// decode backend's (33 target items = 132 SMs x 2 / 8 KV heads, chunks >= 256 tokens).
// host/gpu > 1: the GPU planner is faster in device time than the host planner in CPU time (the
// host planner's outputs would still have to be copied to the device: not included).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <numeric>

#include "core/check.h"
#include "cuda/cuda_check.h"
#include "pagedattn/cuda_planner.h"
#include "pagedattn/planner.h"
#include "tools/bench/cuda/bench_cuda_device.h"

namespace pagedattn::tools {
namespace {

TensorView i32_view(const cuda::DeviceBuffer& buffer, int64_t n) {
  return TensorView::contiguous(buffer.data(), DType::kI32, {n}, Device::cuda(0));
}

}  // namespace

nlohmann::json bench_planner(const PlannerBenchConfig& config, void* stream) {
  const int32_t alloc = config.alloc_page_size;
  PA_CHECK(alloc >= 1, "--alloc-page-size {}: expected >= 1", alloc);
  for (int32_t p : config.page_sizes) {
    PA_CHECK(p >= 1 && alloc % p == 0, "--page-size {} does not divide --alloc-page-size {}", p,
             alloc);
  }
  for (int32_t b : config.batches) PA_CHECK(b >= 1, "--batch {}: expected >= 1", b);
  for (int32_t l : config.kv_lens) PA_CHECK(l >= 1, "--kv-len {}: expected >= 1", l);
  for (const std::string& form : config.forms) {
    PA_CHECK(form == "block" || form == "slot", "--form '{}': expected block or slot", form);
  }
  fmt::print(
      "\nplanner: host plan() + split_kv_partition() (CPU wall) vs GPU plan_on_device() + "
      "split_kv_on_device() (device time, launches queued; enqueue = host time to issue them), "
      "A {}, shuffled pages, median of {}\n"
      "{:>6} {:>6} {:>8} {:>4} {:>10} {:>10} {:>10} {:>11} {:>9} {:>9}\n",
      alloc, config.reps, "form", "B", "kv_len", "P", "pages", "host_us", "gpu_us", "enqueue_us",
      "idle_us", "host/gpu");
  nlohmann::json rows = nlohmann::json::array();
  std::mt19937_64 rng(7);
  const auto s = static_cast<cudaStream_t>(stream);
  for (const std::string& form : config.forms) {
    const bool slot_form = form == "slot";
    for (int32_t batch : config.batches) {
      for (int32_t kv_len : config.kv_lens) {
        const int32_t blocks = (kv_len + alloc - 1) / alloc;
        const int64_t alloc_pages = int64_t{batch} * blocks;
        std::vector<int32_t> pool(alloc_pages);
        std::iota(pool.begin(), pool.end(), 0);
        std::shuffle(pool.begin(), pool.end(), rng);
        const int64_t row_stride = slot_form ? kv_len : blocks;
        std::vector<int32_t> table(static_cast<size_t>(batch * row_stride));
        for (int64_t r = 0; r < batch; ++r) {
          const int32_t* pages = pool.data() + r * blocks;
          int32_t* row = table.data() + r * row_stride;
          if (!slot_form) {
            std::copy(pages, pages + blocks, row);
            continue;
          }
          for (int64_t t = 0; t < kv_len; ++t) {
            row[t] = pages[t / alloc] * alloc + static_cast<int32_t>(t % alloc);
          }
        }
        const std::vector<int32_t> lens(batch, kv_len);
        const DeviceI32 d_table(table), d_lens(lens);
        for (int32_t page : config.page_sizes) {
          const int64_t pages = int64_t{batch} * ((kv_len + page - 1) / page);
          PlanStorage host(batch, pages);
          PlanInput input;
          if (slot_form) {
            input.table = SlotTableInput{table, row_stride};
          } else {
            input.table = BlockTableInput{table, row_stride};
          }
          input.num_reqs = batch;
          input.seq_lens = lens;
          input.alloc_page_size = alloc;
          input.page_size = page;
          input.num_alloc_pages = alloc_pages;
          const SplitKvConfig split{true, 33, std::max(1, 256 / page)};
          const int64_t capacity = split_kv_capacity(batch, pages, split);
          std::vector<int32_t> work_request(capacity), work_chunk(capacity), merge(batch + 1);
          std::vector<double> host_ns;
          for (int32_t rep = 0; rep < std::max(1, config.reps); ++rep) {
            const auto t0 = std::chrono::steady_clock::now();
            plan(input, host.buffers());
            split_kv_partition(std::span<const int32_t>(host.kv_indptr.data(), batch + 1), batch,
                               split, {work_request, work_chunk, merge});
            const auto t1 = std::chrono::steady_clock::now();
            host_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
          }
          std::sort(host_ns.begin(), host_ns.end());
          const double host_us = host_ns[host_ns.size() / 2] / 1e3;

          cuda::DeviceBuffer qo(4 * (batch + 1)), indptr(4 * (batch + 1)), indices(4 * pages),
              last(4 * batch), kv_lens(4 * batch), status(16), request(4 * capacity),
              chunk(4 * capacity), merge_d(4 * (batch + 1)), info(16);
          cuda::DevicePlanInput device_input;
          device_input.table = d_table.view;
          device_input.table.ndim = 2;
          device_input.table.shape = {batch, row_stride};
          device_input.table.strides = {row_stride, 1};
          device_input.slot_table = slot_form;
          device_input.seq_lens = d_lens.view;
          device_input.num_reqs = batch;
          device_input.alloc_page_size = alloc;
          device_input.page_size = page;
          device_input.num_alloc_pages = alloc_pages;
          const cuda::DevicePlanBuffers buffers{
              i32_view(qo, batch + 1), i32_view(indptr, batch + 1), i32_view(indices, pages),
              i32_view(last, batch),   i32_view(kv_lens, batch),    i32_view(status, 4)};
          const cuda::DeviceSplitKvBuffers split_buffers{
              i32_view(request, capacity), i32_view(chunk, capacity), i32_view(merge_d, batch + 1),
              i32_view(info, 4)};
          std::vector<double> enqueue_ns;
          const double gpu_ns = median_device_ns(
              [&] {
                const auto t0 = std::chrono::steady_clock::now();
                cuda::plan_on_device(device_input, buffers, stream);
                cuda::split_kv_on_device(i32_view(indptr, batch + 1), batch, split, split_buffers,
                                         stream);
                const auto t1 = std::chrono::steady_clock::now();
                enqueue_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
              },
              2, std::max(1, config.reps), true, stream);
          const double idle_ns = median_device_ns(
              [&] {
                cuda::plan_on_device(device_input, buffers, stream);
                cuda::split_kv_on_device(i32_view(indptr, batch + 1), batch, split, split_buffers,
                                         stream);
              },
              0, std::max(1, config.reps), false, stream);
          std::sort(enqueue_ns.begin(), enqueue_ns.end());
          const double enqueue_us = enqueue_ns[enqueue_ns.size() / 2] / 1e3;
          cuda::read_plan_status(i32_view(status, 4), stream);
          // The GPU's kv_indices must equal the host's (a cheap end-to-end check of the row).
          std::vector<int32_t> gpu_indices(pages);
          PA_CUDA_CHECK(cudaMemcpyAsync(gpu_indices.data(), indices.data(), 4 * pages,
                                        cudaMemcpyDeviceToHost, s));
          PA_CUDA_CHECK(cudaStreamSynchronize(s));
          const bool same =
              std::equal(gpu_indices.begin(), gpu_indices.end(), host.kv_indices.begin());
          fmt::print(
              "{:>6} {:>6} {:>8} {:>4} {:>10} {:>10.1f} {:>10.1f} {:>11.1f} {:>9.1f} {:>9.2f}{}\n",
              form, batch, kv_len, page, pages, host_us, gpu_ns / 1e3, enqueue_us, idle_ns / 1e3,
              host_us * 1e3 / gpu_ns, same ? "" : "  (GPU kv_indices differ from the host's!)");
          std::fflush(stdout);
          rows.push_back({{"form", form},
                          {"batch", batch},
                          {"kv_len", kv_len},
                          {"page_size", page},
                          {"alloc_page_size", alloc},
                          {"pages", pages},
                          {"host_us", host_us},
                          {"gpu_us", gpu_ns / 1e3},
                          {"gpu_enqueue_us", enqueue_us},
                          {"gpu_idle_us", idle_ns / 1e3},
                          {"host_over_gpu", host_us * 1e3 / gpu_ns},
                          {"indices_equal", same}});
        }
      }
    }
  }
  return rows;
}

}  // namespace pagedattn::tools
