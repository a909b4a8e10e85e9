// Device-side helpers for benchmarks and large tests: random fills generated on the GPU (a
// counter-based hash, so a fill is reproducible from its seed and independent of the launch
// shape), a streaming read used to measure the memory-bandwidth ceiling and an empty link of a
// kernel chain (the launch floor of a CUDA-graph step). Host API, no CUDA types.
#pragma once

#include <cstdint>

#include "pagedattn/tensor.h"

namespace pagedattn::cuda {

// Fills a contiguous device view (f32, f16, bf16, fp8_e4m3, i32 excluded) with values uniform in
// [lo, hi); fp8 stores value / fp8_scale.
void fill_uniform_device(const TensorView& view, uint64_t seed, float lo, float hi, void* stream,
                         float fp8_scale = 1.0f);

// Reads `bytes` (a multiple of 16) from `data` once with 16-byte loads across the whole GPU;
// `sink` (device, 16 bytes) receives a value that depends on every byte so nothing is elided.
void stream_read(const void* data, int64_t bytes, void* sink, void* stream);

// One link of a chain of dependent kernels, the floor of a step of many small kernels: `ctas` CTAs
// of 128 threads launched as the library launches its kernels (launch_kernel: programmatic
// dependent launch where the device has it), each waiting on its predecessor, then thread 0 of
// each CTA reading one word of `words` (device, at least `ctas` u32) and writing it back plus one:
// one dependent global round trip, the least any attention kernel does (read q, write out).
void dependent_link(int ctas, uint32_t* words, void* stream);

}  // namespace pagedattn::cuda
