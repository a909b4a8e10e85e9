// The host side of the CUDA kernels' metadata guards (common/guard.h): the record of the first
// violation, in host-mapped pinned memory (cudaHostAlloc, cudaHostAllocMapped), its claim word in
// device memory, and the report: check() throws pagedattn::Error naming the violation and clears
// it. One per workspace (CudaWorkspace, the cuda_generic backend's workspace). Host code only.
#pragma once

#include <string>

#include "cuda/common/guard.h"
#include "cuda/workspace.h"
#include "pagedattn/backend.h"

namespace pagedattn::cuda {

class FaultLog {
 public:
  FaultLog();  // allocates on the current device
  ~FaultLog();
  FaultLog(const FaultLog&) = delete;
  FaultLog& operator=(const FaultLog&) = delete;

  // The guard of a call of `op`, pointing at this log; the caller fills the sizes.
  MetadataGuard guard(OpKind op) const;

  // Throws Error describing the recorded violation (if any) and clears the record first, so that
  // the next violation is recorded again. Reads host memory: call once the kernels that may write
  // it are complete (after a stream or event synchronisation), never during a capture's replay.
  void check();

 private:
  FaultRecord* record_ = nullptr;         // host pointer (mapped)
  FaultRecord* device_record_ = nullptr;  // the device's pointer to the same memory
  DeviceBuffer claim_;                    // int32
};

// The message of a recorded fault: the call, the array entry and its value, what was expected,
// and what the kernels wrote for the request ("decode: meta.kv_indices[37] = 4096 of request 2 is
// outside the pool's 4096 attention pages; ...").
std::string describe_fault(const FaultRecord& record);

}  // namespace pagedattn::cuda
