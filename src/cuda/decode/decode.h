// Batch decode on CUDA: what it supports, its plan (the split-KV partition on the device) and its
// run (validation, the split-KV kernel, the merge). Host entry points, no CUDA types.
#pragma once

#include "cuda/workspace.h"
#include "pagedattn/backend.h"

namespace pagedattn::cuda {

Support supports_decode(const OpDesc& op);

// Enqueues the partition of meta.kv_indptr into the workspace on workspace.stream.
void plan_decode(CudaWorkspace& workspace, const OpDesc& op, const StepMetadata& meta);

// Validates `args` (Error naming the argument; nothing enqueued) and enqueues the decode kernel
// and, for split requests, the merge kernel on args.stream.
void run_decode(CudaWorkspace& workspace, const DecodeArgs& args);

}  // namespace pagedattn::cuda
