// Memory-mapped safetensors files: one `model.safetensors`, or the shards that
// `model.safetensors.index.json` lists, opened read-only with mmap and exposed as non-owning
// TensorViews into the mapping (no copy of the checkpoint is made).
//
// File layout (https://github.com/huggingface/safetensors): an 8-byte little-endian header length
// N, N bytes of JSON {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "string", ...}}, then the data section; offsets are relative to its
// start. The parser is strict: N within the file, a JSON object of objects, known dtypes, shapes of
// non-negative integers whose product times the dtype size equals end - begin (checked against
// overflow), offsets in range, and the tensors tiling the data section exactly (sorted by begin:
// no gap, no overlap, ending at the file's end). Every error names the file and the tensor and
// what was expected. The parser never reads outside the bytes it is given, so any byte sequence
// gives either a header or an Error (it is fuzzed: tests/model/safetensors_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pagedattn/dtype.h"
#include "pagedattn/tensor.h"

namespace pagedattn::model {

// Every dtype the safetensors format names. Only some have a pagedattn DType (to_dtype); the others
// are parsed and validated but cannot be viewed.
enum class SafetensorsDType : uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
};
std::string_view safetensors_dtype_name(SafetensorsDType dtype);  // as in the file: "BF16"
std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view name);
int64_t safetensors_dtype_size(SafetensorsDType dtype);  // bytes per element
// F32, F16, BF16, F8_E4M3, I32, I64 map to a DType; the rest have none.
std::optional<DType> to_dtype(SafetensorsDType dtype);

struct SafetensorsTensorInfo {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;  // may be empty (a scalar: one element)
  uint64_t data_begin = 0;     // byte offsets relative to the start of the data section
  uint64_t data_end = 0;
  uint64_t byte_size() const { return data_end - data_begin; }
  std::string shape_str() const;  // "[4, 32]"
};

struct SafetensorsHeader {
  uint64_t header_size = 0;                    // N: the JSON's bytes
  uint64_t data_offset = 0;                    // 8 + N: where the data section starts in the file
  std::vector<SafetensorsTensorInfo> tensors;  // sorted by data_begin
  std::vector<std::pair<std::string, std::string>> metadata;  // __metadata__, in file order
};

// Parses and validates the header of a whole safetensors file held in `file_bytes`; `file_label`
// names the file in errors. Throws Error; never reads outside `file_bytes`.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file_bytes,
                                           std::string_view file_label);

// One safetensors file, mapped read-only for the object's lifetime. Move-only; views stay valid
// while the object (or the object it was moved into) lives.
class SafetensorsFile {
 public:
  // Maps `path` and parses its header. Throws Error naming the path (missing, unreadable, empty,
  // truncated, invalid header).
  static SafetensorsFile open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::filesystem::path& path() const;
  const SafetensorsHeader& header() const;
  const std::vector<SafetensorsTensorInfo>& tensors() const { return header().tensors; }
  // nullptr when absent.
  const SafetensorsTensorInfo* find(std::string_view name) const;
  // A contiguous CPU view of the tensor's bytes in the mapping (a scalar is a [1] view). Throws
  // for a dtype without a pagedattn DType, naming the file, the tensor and the dtype.
  TensorView view(const SafetensorsTensorInfo& tensor) const;
  std::span<const std::byte> bytes(const SafetensorsTensorInfo& tensor) const;
  uint64_t file_size() const;

 private:
  struct State;
  explicit SafetensorsFile(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Where a tensor lives across the files of a checkpoint.
struct TensorLocation {
  const SafetensorsFile* file = nullptr;
  const SafetensorsTensorInfo* info = nullptr;
};

// The safetensors files of a model directory: `model.safetensors`, or every shard named in
// `model.safetensors.index.json` ("weight_map": tensor -> file). The index must agree with the
// shards: each listed tensor is in the named shard, each shard tensor is listed, no name twice,
// shard names are plain file names inside the directory. Move-only.
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open(const std::filesystem::path& directory);

  SafetensorsCheckpoint(SafetensorsCheckpoint&&) noexcept;
  SafetensorsCheckpoint& operator=(SafetensorsCheckpoint&&) noexcept;
  ~SafetensorsCheckpoint();

  const std::filesystem::path& directory() const;
  const std::vector<SafetensorsFile>& files() const;
  std::optional<TensorLocation> find(std::string_view name) const;
  // The tensor's view; throws Error naming the tensor and the directory when absent.
  TensorView view(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  size_t tensor_count() const;

 private:
  struct State;
  explicit SafetensorsCheckpoint(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace pagedattn::model
