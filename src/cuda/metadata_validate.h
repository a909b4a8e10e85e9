// Validating mode of the CUDA backends (WorkspaceLimits::validate_metadata): the step's metadata
// copied from the device to the host (a stream synchronisation) and checked by
// check_metadata_values (planner/metadata_check.h), with the CPU backend's messages, before
// anything is launched. Host code only.
#pragma once

#include "pagedattn/backend.h"
#include "planner/metadata_check.h"

namespace pagedattn::cuda {

// Checks meta's views (int32 on `device`, contiguous, long enough for batch_size), copies the
// arrays (on `stream`; kv_indices up to kv_indptr[batch_size]), waits, and checks them against
// `bounds`. `with_qo`: qo_indptr is part of the check (prefill and MLA, where it is required;
// decode's identity when it is defined). Throws Error naming the first bad entry.
void validate_on_host(const StepMetadata& meta, const MetadataBounds& bounds, bool with_qo,
                      Device device, void* stream);

}  // namespace pagedattn::cuda
