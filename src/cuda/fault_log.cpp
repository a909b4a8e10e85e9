// FaultLog (fault_log.h): the mapped record, its claim word and the host's report of a fault the
// kernels recorded (guard.cuh writes it).
#include "cuda/fault_log.h"

#include <cuda_runtime_api.h>

#include "core/check.h"
#include "cuda/cuda_check.h"

namespace pagedattn::cuda {

FaultLog::FaultLog() : claim_(sizeof(int32_t)) {
  PA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&record_), sizeof(FaultRecord),
                              cudaHostAllocMapped | cudaHostAllocPortable));
  *record_ = FaultRecord{};
  record_->generation = 1;  // the claim word starts at 0 = generation - 1: the next fault wins
  PA_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_record_), record_, 0));
  PA_CUDA_CHECK(cudaMemset(claim_.data(), 0, sizeof(int32_t)));
}

FaultLog::~FaultLog() {
  if (record_ != nullptr) cudaFreeHost(record_);  // no throw from a destructor
}

MetadataGuard FaultLog::guard(OpKind op) const {
  MetadataGuard g;
  g.record = device_record_;
  g.claim = claim_.as<int32_t>();
  g.op = static_cast<int32_t>(op);
  return g;
}

void FaultLog::check() {
  volatile FaultRecord* live = record_;
  if (live->code == kFaultNone) return;
  FaultRecord fault;
  fault.code = live->code;
  fault.op = live->op;
  fault.request = live->request;
  fault.generation = live->generation;
  fault.index = live->index;
  fault.value = live->value;
  fault.limit = live->limit;
  // Cleared before the throw: the next fault (claim: generation -> generation + 1) is recorded.
  live->code = kFaultNone;
  live->generation = fault.generation + 1;
  throw_error(describe_fault(fault));
}

std::string describe_fault(const FaultRecord& f) {
  const std::string_view op = op_name(static_cast<OpKind>(f.op));
  const int32_t r = f.request;
  constexpr std::string_view kZeroRows = "the request's rows were written as 0 / -inf";
  switch (f.code) {
    case kFaultPageOutOfRange:
      return fmt::format(
          "{}: meta.kv_indices[{}] = {} of request {} is outside the pool's {} attention pages; "
          "it was not read, and the request's rows that needed it were written as 0 / -inf",
          op, f.index, f.value, r, f.limit);
    case kFaultKvIndptrDecreasing:
      return fmt::format("{}: meta.kv_indptr decreases at request {} ({} then {}); {}", op, r,
                         f.index, f.value, kZeroRows);
    case kFaultKvIndptrPastIndices:
      return fmt::format(
          "{}: meta.kv_indptr gives request {} the pages [{}, {}) of meta.kv_indices, which has {} "
          "entries; {}",
          op, r, f.index, f.value, f.limit, kZeroRows);
    case kFaultLastPageLen:
      return fmt::format(
          "{}: meta.kv_last_page_len[{}] = {} is out of range (expected [{}, {}] for a request "
          "with {} pages); {}",
          op, r, f.value, f.index > 0 ? 1 : 0, f.limit, f.index, kZeroRows);
    case kFaultQoIndptr:
      return fmt::format(
          "{}: meta.qo_indptr gives request {} the query rows [{}, {}) (expected an ordered range "
          "within q's {} rows); nothing was written for the request",
          op, r, f.index, f.value, f.limit);
    case kFaultQLenOverMax:
      return fmt::format(
          "{}: request {} has {} query rows, more than meta.max_q_len = {} (the bound the launch "
          "was sized by); nothing was written for the request",
          op, r, f.value, f.limit);
    case kFaultQLenOverKvLen:
      return fmt::format(
          "{}: request {} has {} query rows but {} KV tokens (expected q_len <= kv_len: a "
          "request's new tokens are the last of its KV); {}",
          op, r, f.value, f.limit, kZeroRows);
    default:
      return fmt::format("{}: unknown metadata fault code {} (request {}, index {}, value {})", op,
                         f.code, r, f.index, f.value);
  }
}

}  // namespace pagedattn::cuda
