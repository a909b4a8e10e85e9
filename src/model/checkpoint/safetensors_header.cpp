// The safetensors header parser: 8-byte little-endian length N, N bytes of JSON, then the data
// section. Validation is strict and happens before anything is trusted:
//   1. N fits in the file (and under 100 MB, the format's own limit), the JSON nests at most
//      kMaxDepth deep (checked by a scan before parsing, so hostile nesting costs nothing),
//      parses, is an object, and has no duplicate keys;
//   2. every entry is {"dtype", "shape", "data_offsets"} and nothing else, with a known dtype,
//      non-negative integer extents and offsets; shape product x dtype size (overflow-checked)
//      equals end - begin;
//   3. sorted by begin, the tensors tile [0, data size) exactly: no gap, no overlap, no tail.
// Only the bytes given are read, so any input ends in a header or an Error.
#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "core/check.h"
#include "pagedattn/safetensors.h"

namespace pagedattn::model {

using nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // safetensors' own limit
constexpr int kMaxDepth = 8;  // a valid header nests 3 deep ({ "t": { "shape": [ ] } })

struct DTypeInfo {
  SafetensorsDType dtype;
  std::string_view name;
  int64_t size;
  std::optional<DType> pagedattn_dtype;
};

constexpr DTypeInfo kDTypes[] = {
    {SafetensorsDType::kBool, "BOOL", 1, std::nullopt},
    {SafetensorsDType::kU8, "U8", 1, std::nullopt},
    {SafetensorsDType::kI8, "I8", 1, std::nullopt},
    {SafetensorsDType::kI16, "I16", 2, std::nullopt},
    {SafetensorsDType::kU16, "U16", 2, std::nullopt},
    {SafetensorsDType::kI32, "I32", 4, DType::kI32},
    {SafetensorsDType::kU32, "U32", 4, std::nullopt},
    {SafetensorsDType::kI64, "I64", 8, DType::kI64},
    {SafetensorsDType::kU64, "U64", 8, std::nullopt},
    {SafetensorsDType::kF16, "F16", 2, DType::kF16},
    {SafetensorsDType::kBF16, "BF16", 2, DType::kBF16},
    {SafetensorsDType::kF32, "F32", 4, DType::kF32},
    {SafetensorsDType::kF64, "F64", 8, std::nullopt},
    {SafetensorsDType::kF8E4M3, "F8_E4M3", 1, DType::kFP8E4M3},
    {SafetensorsDType::kF8E5M2, "F8_E5M2", 1, std::nullopt},
    {SafetensorsDType::kF8E8M0, "F8_E8M0", 1, std::nullopt},
};

const DTypeInfo& info_of(SafetensorsDType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[0];
}

std::string known_dtype_names() {
  std::string names;
  for (const DTypeInfo& info : kDTypes) {
    if (!names.empty()) names += ", ";
    names += info.name;
  }
  return names;
}

// Deepest nesting of [ and { outside strings; stops counting once past the limit.
int nesting_depth(std::string_view text) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > kMaxDepth) return deepest;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

uint64_t read_u64_le(const std::byte* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint64_t>(bytes[i]);
  return value;
}

// A non-negative JSON integer, or nullopt.
std::optional<uint64_t> as_u64(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(value.get<int64_t>());
  }
  return std::nullopt;
}

SafetensorsTensorInfo parse_entry(const std::string& label, const std::string& name,
                                  const json& entry, uint64_t data_size) {
  PA_CHECK(!name.empty(), "{}: a tensor has an empty name", label);
  PA_CHECK(entry.is_object(),
           "{}: tensor '{}': entry is {}, expected an object with dtype, shape "
           "and data_offsets",
           label, name, entry.type_name());
  for (const auto& [key, value] : entry.items()) {
    PA_CHECK(key == "dtype" || key == "shape" || key == "data_offsets",
             "{}: tensor '{}': unexpected field '{}' (expected dtype, shape, data_offsets)", label,
             name, key);
  }
  PA_CHECK(entry.contains("dtype") && entry.contains("shape") && entry.contains("data_offsets"),
           "{}: tensor '{}': expected dtype, shape and data_offsets", label, name);

  SafetensorsTensorInfo tensor;
  tensor.name = name;
  const json& dtype = entry["dtype"];
  PA_CHECK(dtype.is_string(), "{}: tensor '{}': dtype is {}, expected a string", label, name,
           dtype.type_name());
  const auto parsed = parse_safetensors_dtype(dtype.get<std::string>());
  PA_CHECK(parsed.has_value(), "{}: tensor '{}': unknown dtype '{}' (known: {})", label, name,
           dtype.get<std::string>(), known_dtype_names());
  tensor.dtype = *parsed;

  const json& shape = entry["shape"];
  PA_CHECK(shape.is_array(), "{}: tensor '{}': shape is {}, expected a list of extents", label,
           name, shape.type_name());
  PA_CHECK(shape.size() <= static_cast<size_t>(kMaxDims),
           "{}: tensor '{}': {} dimensions, at most "
           "{} are supported",
           label, name, shape.size(), kMaxDims);
  uint64_t elements = 1;
  bool overflow = false;
  for (const json& extent : shape) {
    const auto value = as_u64(extent);
    PA_CHECK(
        value.has_value() && *value <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
        "{}: tensor '{}': shape holds {}, expected non-negative integers", label, name,
        extent.dump());
    tensor.shape.push_back(static_cast<int64_t>(*value));
    if (*value != 0 && elements > std::numeric_limits<uint64_t>::max() / *value) overflow = true;
    elements *= *value;
  }
  const uint64_t element_size = static_cast<uint64_t>(safetensors_dtype_size(tensor.dtype));
  if (elements > std::numeric_limits<uint64_t>::max() / element_size) overflow = true;

  const json& offsets = entry["data_offsets"];
  PA_CHECK(offsets.is_array() && offsets.size() == 2,
           "{}: tensor '{}': data_offsets is {}, expected [begin, end]", label, name,
           offsets.dump().substr(0, 80));
  const auto begin = as_u64(offsets[0]);
  const auto end = as_u64(offsets[1]);
  PA_CHECK(begin && end && *begin <= *end,
           "{}: tensor '{}': data_offsets {} must be non-negative integers with begin <= end",
           label, name, offsets.dump().substr(0, 80));
  PA_CHECK(*end <= data_size,
           "{}: tensor '{}': data_offsets [{}, {}] run past the data section "
           "of {} bytes (truncated file?)",
           label, name, *begin, *end, data_size);
  PA_CHECK(!overflow && elements * element_size == *end - *begin,
           "{}: tensor '{}': data_offsets [{}, {}] span {} bytes, expected {} (shape {} x {} "
           "bytes of {})",
           label, name, *begin, *end, *end - *begin,
           overflow ? std::string("more than 2^64") : std::to_string(elements * element_size),
           tensor.shape_str(), element_size, safetensors_dtype_name(tensor.dtype));
  tensor.data_begin = *begin;
  tensor.data_end = *end;
  return tensor;
}

}  // namespace

std::string_view safetensors_dtype_name(SafetensorsDType dtype) { return info_of(dtype).name; }

std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

int64_t safetensors_dtype_size(SafetensorsDType dtype) { return info_of(dtype).size; }

std::optional<DType> to_dtype(SafetensorsDType dtype) { return info_of(dtype).pagedattn_dtype; }

std::string SafetensorsTensorInfo::shape_str() const {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) text += ", ";
    text += std::to_string(shape[d]);
  }
  return text + "]";
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file_bytes,
                                           std::string_view file_label) {
  const std::string label(file_label);
  PA_CHECK(file_bytes.size() >= 8,
           "{}: {} bytes, too short for a safetensors file (expected an "
           "8-byte header length, the header and the data)",
           label, file_bytes.size());
  SafetensorsHeader header;
  header.header_size = read_u64_le(file_bytes.data());
  const uint64_t available = file_bytes.size() - 8;
  PA_CHECK(header.header_size <= available,
           "{}: header length {} exceeds the {} bytes after it "
           "(truncated file, or not a safetensors file)",
           label, header.header_size, available);
  PA_CHECK(header.header_size <= kMaxHeaderBytes,
           "{}: header length {} exceeds the format's "
           "limit of {} bytes",
           label, header.header_size, kMaxHeaderBytes);
  PA_CHECK(header.header_size >= 2, "{}: header length {} is too short for a JSON object", label,
           header.header_size);
  header.data_offset = 8 + header.header_size;
  const uint64_t data_size = file_bytes.size() - header.data_offset;

  const std::string_view text(reinterpret_cast<const char*>(file_bytes.data()) + 8,
                              header.header_size);
  PA_CHECK(nesting_depth(text) <= kMaxDepth, "{}: header JSON nests deeper than {} levels", label,
           kMaxDepth);
  // Duplicate top-level keys would silently shadow each other: refuse them while parsing.
  std::unordered_set<std::string> keys;
  std::string duplicate;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        !keys.insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  const json document = json::parse(text.begin(), text.end(), on_event, false);
  PA_CHECK(!document.is_discarded(), "{}: header is not valid JSON", label);
  PA_CHECK(duplicate.empty(), "{}: tensor '{}' appears twice in the header", label, duplicate);
  PA_CHECK(document.is_object(), "{}: header is a JSON {}, expected an object", label,
           document.type_name());

  for (const auto& [name, entry] : document.items()) {
    if (name == "__metadata__") {
      PA_CHECK(entry.is_object(), "{}: __metadata__ is {}, expected an object of strings", label,
               entry.type_name());
      for (const auto& [key, value] : entry.items()) {
        PA_CHECK(value.is_string(), "{}: __metadata__['{}'] is {}, expected a string", label, key,
                 value.type_name());
        header.metadata.emplace_back(key, value.get<std::string>());
      }
      continue;
    }
    header.tensors.push_back(parse_entry(label, name, entry, data_size));
  }

  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return a.data_begin != b.data_begin ? a.data_begin < b.data_begin
                                                  : a.data_end < b.data_end;
            });
  uint64_t covered = 0;
  const SafetensorsTensorInfo* previous = nullptr;
  for (const SafetensorsTensorInfo& tensor : header.tensors) {
    PA_CHECK(tensor.data_begin >= covered,
             "{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' (which ends at {})", label,
             tensor.name, tensor.data_begin, tensor.data_end, previous ? previous->name : "",
             covered);
    PA_CHECK(tensor.data_begin == covered,
             "{}: tensor '{}': data_offsets [{}, {}] leave a gap of {} bytes after {}", label,
             tensor.name, tensor.data_begin, tensor.data_end, tensor.data_begin - covered,
             previous ? "tensor '" + previous->name + "'" : std::string("the header"));
    covered = tensor.data_end;
    previous = &tensor;
  }
  PA_CHECK(covered == data_size,
           "{}: the tensors cover {} bytes of the {}-byte data section "
           "(expected exactly; the file has {} unclaimed bytes at the end)",
           label, covered, data_size, data_size - covered);
  return header;
}

}  // namespace pagedattn::model
