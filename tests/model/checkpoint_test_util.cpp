// Test support for the checkpoint loader (see checkpoint_test_util.h).
#include "checkpoint_test_util.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace pagedattn::model::checkpoint_testing {

namespace fs = std::filesystem;

::testing::AssertionResult contains_text(const std::string& text, std::string_view part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "expected the text to contain\n  \"" << part << "\"\nbut it is\n  \"" << text << "\"";
}

fs::path fixture_dir(std::string_view name) {
  return fs::path(__FILE__).parent_path().parent_path() / "data" / "model" / std::string(name);
}

const std::vector<std::string>& fixture_cases() {
  static const std::vector<std::string> cases = {
      "llama3_bf16",      "llama_linear_f16_sharded", "qwen2_f32", "qwen3_bf16", "deepseek_v2_f16",
      "deepseek_v3_bf16", "deepseek_v3_mla512_bf16"};
  return cases;
}

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "pagedattn_ckpt_XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code error;
  fs::remove_all(path_, error);
}

std::string read_bytes(const fs::path& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream text;
  text << stream.rdbuf();
  return text.str();
}

void write_bytes(const fs::path& path, std::string_view bytes) {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  stream.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!stream) throw std::runtime_error("cannot write " + path.string());
}

void copy_fixture(std::string_view name, const fs::path& destination) {
  for (const auto& entry : fs::directory_iterator(fixture_dir(name))) {
    fs::copy_file(entry.path(), destination / entry.path().filename(),
                  fs::copy_options::overwrite_existing);
  }
}

std::string make_safetensors_raw(std::string_view header_json, std::string_view data) {
  std::string header(header_json);
  while (header.size() % 8 != 0) header.push_back(' ');
  std::string file(8, '\0');
  uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return file + header + std::string(data);
}

std::string make_safetensors(const std::vector<TensorBytes>& tensors,
                             const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::string header = "{";
  std::string data;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i) {
      header += fmt::format("{}\"{}\":\"{}\"", i ? "," : "", metadata[i].first, metadata[i].second);
    }
    header += "}";
  }
  for (const TensorBytes& tensor : tensors) {
    if (header.size() > 1) header += ",";
    header += fmt::format("\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          tensor.name, tensor.dtype, fmt::join(tensor.shape, ","), data.size(),
                          data.size() + tensor.data.size());
    data += tensor.data;
  }
  header += "}";
  return make_safetensors_raw(header, data);
}

std::string f32_bytes(int64_t count, float start, float step) {
  std::string bytes(static_cast<size_t>(count) * 4, '\0');
  for (int64_t i = 0; i < count; ++i) {
    const float value = start + step * static_cast<float>(i);
    std::memcpy(bytes.data() + 4 * i, &value, 4);
  }
  return bytes;
}

}  // namespace pagedattn::model::checkpoint_testing
