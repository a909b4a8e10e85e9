// RoPE: reading the parameters from either config style, and the inverse frequencies and scales
// they imply, in float64, following transformers 5's modeling_rope_utils:
//   default  inv[i] = theta^(-2i / d), i < d / 2 (d = rotary_dim)
//   linear   inv[i] / factor
//   llama3   wavelength w = 2 pi / inv[i]; w > L / low_freq_factor: inv / factor; w < L /
//            high_freq_factor: inv; between: (1 - s) inv / factor + s inv with
//            s = (L / w - low) / (high - low), L = original_max_position_embeddings
//   yarn     ramp r[i] = clamp((i - lo) / (hi - lo), 0, 1) over the correction range [lo, hi] of
//            beta_fast / beta_slow rotations (floored / ceiled unless truncate is false);
//            inv = theta^(-2i/d) (r / factor + (1 - r))
// Config styles: transformers 5 writes rope_parameters {rope_type, rope_theta, factor, ...}; the
// hub's older files write rope_theta at the top level and rope_scaling {type | rope_type, ...}.
#include <cmath>
#include <numbers>

#include "checkpoint/config_parse.h"
#include "core/check.h"
#include "pagedattn/model_config.h"

namespace pagedattn::model {

using nlohmann::json;

std::string_view rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
  }
  return "?";
}

namespace {

double get_mscale(double scale, double mscale = 1.0) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// The dimension (fractional) whose wavelength makes `rotations` turns over `context` positions.
double correction_dim(double rotations, double dim, double theta, double context) {
  return dim * std::log(context / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
}

}  // namespace

std::vector<double> RopeConfig::inverse_frequencies() const {
  PA_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rope: rotary_dim {} must be positive and even",
           rotary_dim);
  const int64_t half = rotary_dim / 2;
  const double dim = static_cast<double>(rotary_dim);
  std::vector<double> inv(half);
  for (int64_t i = 0; i < half; ++i) inv[i] = std::pow(theta, -2.0 * static_cast<double>(i) / dim);

  switch (type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear:
      for (double& f : inv) f /= factor;
      break;
    case RopeType::kLlama3: {
      const double context = static_cast<double>(original_max_position_embeddings);
      const double low_wavelength = context / low_freq_factor;
      const double high_wavelength = context / high_freq_factor;
      for (double& f : inv) {
        const double wavelength = 2.0 * std::numbers::pi / f;
        if (wavelength > low_wavelength) {
          f /= factor;
        } else if (wavelength >= high_wavelength) {
          const double smooth =
              (context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
          f = (1.0 - smooth) * f / factor + smooth * f;
        }
      }
      break;
    }
    case RopeType::kYarn: {
      const double context = static_cast<double>(original_max_position_embeddings);
      double low = correction_dim(beta_fast, dim, theta, context);
      double high = correction_dim(beta_slow, dim, theta, context);
      if (truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1.0);
      if (low == high) high += 0.001;  // as transformers: no division by zero
      for (int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1.0 - ramp;  // weight of the unscaled frequency
        inv[i] = inv[i] / factor * (1.0 - extrapolation) + inv[i] * extrapolation;
      }
      break;
    }
  }
  return inv;
}

double RopeConfig::attention_scaling() const {
  if (type != RopeType::kYarn) return 1.0;
  if (attention_factor_override) return *attention_factor_override;
  if (mscale && mscale_all_dim)
    return get_mscale(factor, *mscale) / get_mscale(factor, *mscale_all_dim);
  return get_mscale(factor);
}

double ModelConfig::softmax_scale() const {
  if (!mla) return 1.0 / std::sqrt(static_cast<double>(head_dim));
  double scale = 1.0 / std::sqrt(static_cast<double>(mla->qk_head_dim()));
  // transformers' yarn_apply_mscale (and DeepSeek's reference): any scaled RoPE with a non-zero
  // mscale_all_dim multiplies the scale by mscale^2.
  if (rope.type != RopeType::kDefault && rope.mscale_all_dim) {
    const double mscale = get_mscale(rope.factor, *rope.mscale_all_dim);
    scale *= mscale * mscale;
  }
  return scale;
}

namespace detail {

RopeConfig parse_rope(const JsonFields& config, int64_t head_dim, int64_t max_position_embeddings,
                      RopeLayout layout) {
  const std::string& source = config.source();
  RopeConfig rope;
  rope.layout = layout;

  // Where the parameters are: transformers 5's rope_parameters (flat, or one entry per layer type
  // of which only full_attention is supported), else the hub's rope_scaling + rope_theta.
  const json* params = nullptr;
  std::string where = "rope_scaling";
  if (const json* rope_parameters = config.find("rope_parameters")) {
    PA_CHECK(rope_parameters->is_object(), "{}: rope_parameters is {}, expected an object", source,
             JsonFields::describe(*rope_parameters));
    params = rope_parameters;
    where = "rope_parameters";
    if (!rope_parameters->contains("rope_type") && !rope_parameters->contains("type") &&
        !rope_parameters->contains("rope_theta")) {
      for (const auto& [key, value] : rope_parameters->items()) {
        PA_CHECK(key == "full_attention",
                 "{}: rope_parameters has an entry for layer type '{}'; only "
                 "full_attention layers are supported",
                 source, key);
      }
      PA_CHECK(rope_parameters->contains("full_attention"),
               "{}: rope_parameters is empty, expected rope_type / rope_theta", source);
      params = &(*rope_parameters)["full_attention"];
      where = "rope_parameters.full_attention";
      PA_CHECK(params->is_object(), "{}: {} is {}, expected an object", source, where,
               JsonFields::describe(*params));
    }
  } else if (const json* scaling = config.find("rope_scaling")) {
    PA_CHECK(scaling->is_object(), "{}: rope_scaling is {}, expected an object or null", source,
             JsonFields::describe(*scaling));
    params = scaling;
  }
  static const json kEmpty = json::object();
  const JsonFields fields(params != nullptr ? *params : kEmpty, source + ": " + where);

  std::string type = "default";
  if (auto value = fields.optional_string("rope_type")) {
    type = *value;
  } else if (auto legacy = fields.optional_string("type")) {
    type = *legacy;
  }
  if (type == "default") {
    rope.type = RopeType::kDefault;
  } else if (type == "linear") {
    rope.type = RopeType::kLinear;
  } else if (type == "llama3") {
    rope.type = RopeType::kLlama3;
  } else if (type == "yarn") {
    rope.type = RopeType::kYarn;
  } else {
    PA_FAIL(
        "{}: {}.rope_type is '{}', which is not supported (supported: default, linear, llama3, "
        "yarn)",
        source, where, type);
  }

  rope.theta =
      fields.optional_number("rope_theta").value_or(config.number_or("rope_theta", 10000.0));
  PA_CHECK(rope.theta > 1.0, "{}: rope_theta is {}, expected a number > 1", source, rope.theta);
  rope.partial_rotary_factor = fields.optional_number("partial_rotary_factor")
                                   .value_or(config.number_or("partial_rotary_factor", 1.0));
  PA_CHECK(rope.partial_rotary_factor > 0.0 && rope.partial_rotary_factor <= 1.0,
           "{}: partial_rotary_factor is {}, expected a number in (0, 1]", source,
           rope.partial_rotary_factor);
  rope.rotary_dim =
      static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
  PA_CHECK(rope.rotary_dim >= 2 && rope.rotary_dim % 2 == 0,
           "{}: the rotary dimension head_dim {} x partial_rotary_factor {} = {} must be even and "
           ">= 2",
           source, head_dim, rope.partial_rotary_factor, rope.rotary_dim);

  if (rope.type == RopeType::kDefault) return rope;

  // The pre-training context: a top-level original_max_position_embeddings wins (as in
  // transformers' standardize_rope_params), then the RoPE entry's, then max_position_embeddings.
  const auto original = config.optional_int("original_max_position_embeddings", 1)
                            ? config.optional_int("original_max_position_embeddings", 1)
                            : fields.optional_int("original_max_position_embeddings", 1);
  rope.original_max_position_embeddings = original.value_or(max_position_embeddings);

  if (rope.type == RopeType::kYarn && !fields.has("factor")) {
    PA_CHECK(rope.original_max_position_embeddings > 0 && max_position_embeddings > 0,
             "{}: yarn without factor needs max_position_embeddings and "
             "original_max_position_embeddings",
             source);
    rope.factor = static_cast<double>(max_position_embeddings) /
                  static_cast<double>(rope.original_max_position_embeddings);
  } else {
    rope.factor = fields.required_number("factor");
  }
  PA_CHECK(rope.factor > 0.0, "{}: {}.factor is {}, expected a positive number", source, where,
           rope.factor);

  if (rope.type == RopeType::kLlama3) {
    rope.low_freq_factor = fields.required_number("low_freq_factor");
    rope.high_freq_factor = fields.required_number("high_freq_factor");
    PA_CHECK(rope.low_freq_factor > 0.0 && rope.high_freq_factor > rope.low_freq_factor,
             "{}: llama3 low_freq_factor {} and high_freq_factor {}: expected 0 < low < high",
             source, rope.low_freq_factor, rope.high_freq_factor);
    PA_CHECK(original.has_value(),
             "{}: {}.original_max_position_embeddings is missing (llama3 "
             "needs it)",
             source, where);
  }
  if (rope.type == RopeType::kYarn) {
    PA_CHECK(rope.original_max_position_embeddings > 0,
             "{}: yarn needs original_max_position_embeddings or max_position_embeddings", source);
    // transformers: `get("beta_fast") or 32`, so 0 and null mean the default too.
    const double beta_fast = fields.number_or("beta_fast", 0.0);
    const double beta_slow = fields.number_or("beta_slow", 0.0);
    rope.beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;
    rope.beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
    PA_CHECK(rope.beta_fast > 0.0 && rope.beta_slow > 0.0,
             "{}: yarn beta_fast {} and beta_slow {} must be positive", source, rope.beta_fast,
             rope.beta_slow);
    const double mscale = fields.number_or("mscale", 0.0);
    const double mscale_all_dim = fields.number_or("mscale_all_dim", 0.0);
    if (mscale != 0.0) rope.mscale = mscale;
    if (mscale_all_dim != 0.0) rope.mscale_all_dim = mscale_all_dim;
    rope.attention_factor_override = fields.optional_number("attention_factor");
    rope.truncate = fields.bool_or("truncate", true);
  } else {
    // transformers' yarn_apply_mscale looks at mscale_all_dim for any scaled type.
    const double mscale_all_dim = fields.number_or("mscale_all_dim", 0.0);
    if (mscale_all_dim != 0.0) rope.mscale_all_dim = mscale_all_dim;
  }
  return rope;
}

}  // namespace detail
}  // namespace pagedattn::model
