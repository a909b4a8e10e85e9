// Memory-mapped safetensors files and the set of them a model directory holds.
//
// SafetensorsFile maps the whole file read-only (PROT_READ, MAP_PRIVATE) and parses its header in
// place; tensor views point into the mapping, so nothing is copied and pages are read on first
// touch. SafetensorsCheckpoint opens `model.safetensors`, or every shard the index names, and keeps
// one name -> (file, tensor) map; the index and the shards must agree exactly.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/check.h"
#include "pagedattn/safetensors.h"

namespace pagedattn::model {

using nlohmann::json;

// ---- SafetensorsFile ----

struct SafetensorsFile::State {
  std::filesystem::path path;
  void* mapping = nullptr;
  size_t size = 0;
  SafetensorsHeader header;
  std::unordered_map<std::string, size_t> by_name;  // index into header.tensors

  ~State() {
    if (mapping != nullptr) munmap(mapping, size);
  }
  const std::byte* bytes() const { return static_cast<const std::byte*>(mapping); }
};

SafetensorsFile::SafetensorsFile(std::unique_ptr<State> state) : state_(std::move(state)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  auto state = std::make_unique<State>();
  state->path = path;
  const std::string name = path.string();
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  PA_CHECK(fd >= 0, "{}: cannot open ({})", name, std::strerror(errno));
  struct stat info {};
  const int stat_result = ::fstat(fd, &info);
  const int stat_errno = errno;
  if (stat_result != 0 || !S_ISREG(info.st_mode) || info.st_size < 8) {
    ::close(fd);
    PA_CHECK(stat_result == 0, "{}: cannot stat ({})", name, std::strerror(stat_errno));
    PA_FAIL("{}: {}, expected a safetensors file (at least 8 bytes)", name,
            S_ISREG(info.st_mode) ? fmt::format("{} bytes", info.st_size) : "not a regular file");
  }
  state->size = static_cast<size_t>(info.st_size);
  void* mapping = ::mmap(nullptr, state->size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  PA_CHECK(mapping != MAP_FAILED, "{}: cannot map {} bytes ({})", name, state->size,
           std::strerror(map_errno));
  state->mapping = mapping;

  state->header = parse_safetensors_header(std::span(state->bytes(), state->size), name);
  for (size_t i = 0; i < state->header.tensors.size(); ++i) {
    state->by_name.emplace(state->header.tensors[i].name, i);
  }
  return SafetensorsFile(std::move(state));
}

const std::filesystem::path& SafetensorsFile::path() const { return state_->path; }
const SafetensorsHeader& SafetensorsFile::header() const { return state_->header; }
uint64_t SafetensorsFile::file_size() const { return state_->size; }

const SafetensorsTensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = state_->by_name.find(std::string(name));
  return it == state_->by_name.end() ? nullptr : &state_->header.tensors[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const SafetensorsTensorInfo& tensor) const {
  return std::span(state_->bytes() + state_->header.data_offset + tensor.data_begin,
                   tensor.byte_size());
}

TensorView SafetensorsFile::view(const SafetensorsTensorInfo& tensor) const {
  const std::optional<DType> dtype = to_dtype(tensor.dtype);
  PA_CHECK(dtype.has_value(),
           "{}: tensor '{}' has dtype {}, which has no pagedattn dtype (viewable: "
           "F32, F16, BF16, F8_E4M3, I32, I64)",
           state_->path.string(), tensor.name, safetensors_dtype_name(tensor.dtype));
  TensorView view;
  // The mapping is read-only: writing through this pointer faults. TensorView has no const data.
  view.data = const_cast<std::byte*>(bytes(tensor).data());
  view.dtype = *dtype;
  view.device = Device::cpu();
  if (tensor.shape.empty()) {
    view.ndim = 1;
    view.shape[0] = 1;
    view.strides[0] = 1;
    return view;
  }
  view.ndim = static_cast<int32_t>(tensor.shape.size());
  int64_t stride = 1;
  for (int d = view.ndim - 1; d >= 0; --d) {
    view.shape[d] = tensor.shape[d];
    view.strides[d] = stride;
    stride *= tensor.shape[d];
  }
  return view;
}

// ---- SafetensorsCheckpoint ----

struct SafetensorsCheckpoint::State {
  std::filesystem::path directory;
  std::vector<SafetensorsFile> files;
  std::unordered_map<std::string, TensorLocation> by_name;
};

SafetensorsCheckpoint::SafetensorsCheckpoint(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
SafetensorsCheckpoint::SafetensorsCheckpoint(SafetensorsCheckpoint&&) noexcept = default;
SafetensorsCheckpoint& SafetensorsCheckpoint::operator=(SafetensorsCheckpoint&&) noexcept = default;
SafetensorsCheckpoint::~SafetensorsCheckpoint() = default;

namespace {

// weight_map of model.safetensors.index.json: tensor name -> shard file name.
std::map<std::string, std::string> read_index(const std::filesystem::path& index_path) {
  const std::string label = index_path.string();
  std::ifstream stream(index_path, std::ios::binary);
  PA_CHECK(stream.good(), "{}: cannot open", label);
  std::ostringstream text;
  text << stream.rdbuf();
  const std::string content = text.str();
  const json document = json::parse(content, nullptr, false);
  PA_CHECK(!document.is_discarded() && document.is_object(), "{}: not a JSON object", label);
  PA_CHECK(document.contains("weight_map") && document["weight_map"].is_object(),
           "{}: expected a \"weight_map\" object (tensor name -> shard file)", label);
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, file] : document["weight_map"].items()) {
    PA_CHECK(file.is_string(), "{}: weight_map['{}'] is {}, expected a file name", label, name,
             file.type_name());
    const std::string shard = file.get<std::string>();
    // Plain names only: an index must not reach outside the model directory.
    PA_CHECK(!shard.empty() && shard != "." && shard != ".." &&
                 shard.find('/') == std::string::npos && shard.find('\\') == std::string::npos,
             "{}: weight_map['{}'] is '{}', expected a file name inside the model directory", label,
             name, shard);
    weight_map.emplace(name, shard);
  }
  PA_CHECK(!weight_map.empty(), "{}: weight_map is empty", label);
  return weight_map;
}

}  // namespace

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::filesystem::path& directory) {
  auto state = std::make_unique<State>();
  state->directory = directory;
  const std::filesystem::path index_path = directory / "model.safetensors.index.json";
  const std::filesystem::path single_path = directory / "model.safetensors";
  std::error_code error;

  if (std::filesystem::exists(index_path, error)) {
    const std::map<std::string, std::string> weight_map = read_index(index_path);
    std::vector<std::string> shards;
    for (const auto& [name, shard] : weight_map) shards.push_back(shard);
    std::sort(shards.begin(), shards.end());
    shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
    state->files.reserve(shards.size());  // TensorLocation points at these: no reallocation
    std::map<std::string, const SafetensorsFile*> by_shard;
    for (const std::string& shard : shards) {
      state->files.push_back(SafetensorsFile::open(directory / shard));
      by_shard[shard] = &state->files.back();
    }
    for (const auto& [name, shard] : weight_map) {
      const SafetensorsFile* file = by_shard[shard];
      const SafetensorsTensorInfo* info = file->find(name);
      PA_CHECK(info != nullptr, "{}: tensor '{}' is listed in {} but absent from that shard",
               file->path().string(), name, index_path.filename().string());
      state->by_name.emplace(name, TensorLocation{file, info});
    }
    for (const SafetensorsFile& file : state->files) {
      for (const SafetensorsTensorInfo& tensor : file.tensors()) {
        const auto it = weight_map.find(tensor.name);
        PA_CHECK(it != weight_map.end() && directory / it->second == file.path(),
                 "{}: tensor '{}' is not listed for this shard in {}", file.path().string(),
                 tensor.name, index_path.filename().string());
      }
    }
  } else if (std::filesystem::exists(single_path, error)) {
    state->files.push_back(SafetensorsFile::open(single_path));
    const SafetensorsFile* file = &state->files.back();
    for (const SafetensorsTensorInfo& tensor : file->tensors()) {
      state->by_name.emplace(tensor.name, TensorLocation{file, &tensor});
    }
  } else {
    PA_FAIL(
        "{}: no model.safetensors or model.safetensors.index.json (expected a Hugging Face "
        "model directory)",
        directory.string());
  }
  return SafetensorsCheckpoint(std::move(state));
}

const std::filesystem::path& SafetensorsCheckpoint::directory() const { return state_->directory; }
const std::vector<SafetensorsFile>& SafetensorsCheckpoint::files() const { return state_->files; }
size_t SafetensorsCheckpoint::tensor_count() const { return state_->by_name.size(); }

std::optional<TensorLocation> SafetensorsCheckpoint::find(std::string_view name) const {
  const auto it = state_->by_name.find(std::string(name));
  if (it == state_->by_name.end()) return std::nullopt;
  return it->second;
}

TensorView SafetensorsCheckpoint::view(std::string_view name) const {
  const std::optional<TensorLocation> location = find(name);
  PA_CHECK(location.has_value(), "{}: no tensor '{}' in the checkpoint", state_->directory.string(),
           name);
  return location->file->view(*location->info);
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> names;
  names.reserve(state_->by_name.size());
  for (const auto& [name, location] : state_->by_name) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace pagedattn::model
