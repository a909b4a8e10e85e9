// Test support for the checkpoint loader: the fixture folders under tests/data/model/, temporary
// directories, and a safetensors writer written independently of the parser under test (it lays
// out the format from its specification: 8-byte little-endian length, JSON padded with spaces to a
// multiple of 8, data), so that tests can build valid files and then break them on purpose.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace pagedattn::model::checkpoint_testing {

// Success when `text` contains `part`; the failure shows both.
::testing::AssertionResult contains_text(const std::string& text, std::string_view part);
#define EXPECT_CONTAINS(text, part) \
  EXPECT_TRUE(::pagedattn::model::checkpoint_testing::contains_text((text), (part)))

// tests/data/model/<name> (found from this file's path, so tests run from any directory).
std::filesystem::path fixture_dir(std::string_view name = "");
// The seven transformers fixtures.
const std::vector<std::string>& fixture_cases();

// A fresh directory under the system temp directory, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

std::string read_bytes(const std::filesystem::path& path);
void write_bytes(const std::filesystem::path& path, std::string_view bytes);
// Copies every file of a fixture folder into `destination`.
void copy_fixture(std::string_view name, const std::filesystem::path& destination);

struct TensorBytes {
  std::string name;
  std::string dtype;  // as in the file: "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::string data;  // raw little-endian bytes
};

// A safetensors file of `tensors` laid out in order, with optional __metadata__ entries.
std::string make_safetensors(const std::vector<TensorBytes>& tensors,
                             const std::vector<std::pair<std::string, std::string>>& metadata = {});
// A file from a literal header (padded to 8) and data section.
std::string make_safetensors_raw(std::string_view header_json, std::string_view data);
// `count` float32 values start, start + step, ... as bytes.
std::string f32_bytes(int64_t count, float start = 0.0f, float step = 1.0f);

}  // namespace pagedattn::model::checkpoint_testing
