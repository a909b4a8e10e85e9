// Internal pieces of config.json parsing shared by config.cpp and config_rope.cpp.
#pragma once

#include <cstdint>

#include "checkpoint/json_fields.h"
#include "pagedattn/model_config.h"

namespace pagedattn::model::detail {

// Reads RoPE from rope_parameters, or rope_theta + rope_scaling; `head_dim` is the width RoPE
// applies to before partial_rotary_factor (qk_rope_head_dim for MLA).
RopeConfig parse_rope(const JsonFields& config, int64_t head_dim, int64_t max_position_embeddings,
                      RopeLayout layout);

}  // namespace pagedattn::model::detail
