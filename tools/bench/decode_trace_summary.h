// `bench decode --device cuda`'s table of the decode kernel's phases (bench_cuda_device.cpp),
// apart from the CUDA code so that test_tools checks it: a DecodeTrace (one step's phase stamps,
// include/pagedattn/cuda_graph.h) summarised per phase, each time taken from the moment the
// previous layer's last CTA ended.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/cuda_graph.h"

namespace pagedattn::tools {

struct DecodePhaseRow {
  std::string phase;
  // Medians over the layers after the first of, among the layer's CTAs that read a work item and
  // reached the phase: the earliest, the median and the latest stamp, in us after the previous
  // layer's last CTA ended (negative: before it, under programmatic dependent launch).
  double first_us = 0, median_us = 0, last_us = 0;
  int64_t ctas = 0;  // the median over those layers of the CTAs that reached the phase
};

struct DecodeTraceSummary {
  std::vector<DecodePhaseRow> phases;  // DecodeTrace's phases, in order
  int64_t working_ctas = 0;            // median over the layers of CTAs that read a work item
  int64_t idle_ctas = 0;               // ... and of the grid's CTAs past the partition's items
  double layer_us = 0;  // median over the layers after the first of last end - last end before
  int32_t layers = 0;   // layers summarised (all but the first); 0: nothing to summarise
  // The SM clock while the kernels ran: the median over the summarised layers' working CTAs that
  // lived at least 2 us of (end - start cycles) / (end - start ns), in GHz; 0 without clocks.
  double sm_clock_ghz = 0;
};

// Medians of an even count: the mean of the middle two.
DecodeTraceSummary summarize_decode_trace(const cuda::DecodeTrace& trace);

}  // namespace pagedattn::tools
