// The safetensors parser and mapping: valid files (views into the mapping, values as written by the
// independent test writer; the fixtures' tensors as Python's safetensors listed them), every error
// class with its message, and the sharded index rules. Fuzzing: safetensors_fuzz_test.cpp.
#include "pagedattn/safetensors.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint_test_util.h"
#include "pagedattn/error.h"

namespace pagedattn::model {
namespace {

using namespace checkpoint_testing;

std::span<const std::byte> as_bytes(const std::string& text) {
  return std::span(reinterpret_cast<const std::byte*>(text.data()), text.size());
}

// The Error message from parsing `file` ("" when it parses).
std::string parse_error(const std::string& file) {
  try {
    parse_safetensors_header(as_bytes(file), "test.safetensors");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(Safetensors, ParsesAndViewsIntoTheMapping) {
  TempDir dir;
  const std::string file =
      make_safetensors({{"b.weight", "F32", {2, 3}, f32_bytes(6, 1.0f)},
                        {"a.bias", "BF16", {4}, std::string("\x80\x3f\x00\x40\x40\x40\x80\x40", 8)},
                        {"scalar", "F32", {}, f32_bytes(1, 7.5f)},
                        {"empty", "F16", {0, 5}, ""}},
                       {{"format", "pt"}});
  write_bytes(dir.path() / "model.safetensors", file);
  const SafetensorsFile mapped = SafetensorsFile::open(dir.path() / "model.safetensors");

  ASSERT_EQ(mapped.tensors().size(), 4u);
  ASSERT_EQ(mapped.header().metadata.size(), 1u);
  EXPECT_EQ(mapped.header().metadata[0].second, "pt");
  EXPECT_EQ(mapped.file_size(), file.size());

  const SafetensorsTensorInfo* weight = mapped.find("b.weight");
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->dtype, SafetensorsDType::kF32);
  EXPECT_EQ(weight->shape_str(), "[2, 3]");
  const TensorView view = mapped.view(*weight);
  EXPECT_EQ(view.dtype, DType::kF32);
  EXPECT_EQ(view.ndim, 2);
  EXPECT_EQ(view.shape[0], 2);
  EXPECT_EQ(view.shape[1], 3);
  EXPECT_EQ(view.strides[0], 3);
  EXPECT_EQ(view.strides[1], 1);
  EXPECT_TRUE(view.device == Device::cpu());
  // A view into the mapping: the bytes at the offsets the writer chose, not a copy.
  const std::byte* base = mapped.bytes(*mapped.find("b.weight")).data();
  EXPECT_EQ(static_cast<const void*>(base), view.data);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(view.data_as<const float>()[i], 1.0f + i);

  const TensorView bias = mapped.view(*mapped.find("a.bias"));
  EXPECT_EQ(bias.dtype, DType::kBF16);
  const float expected_bias[] = {1.0f, 2.0f, 3.0f, 4.0f};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(bf16_to_float(bias.data_as<const uint16_t>()[i]), expected_bias[i]);
  }
  const TensorView scalar = mapped.view(*mapped.find("scalar"));
  EXPECT_EQ(scalar.ndim, 1);
  EXPECT_EQ(scalar.shape[0], 1);
  EXPECT_EQ(*scalar.data_as<const float>(), 7.5f);
  EXPECT_EQ(mapped.view(*mapped.find("empty")).numel(), 0);
  EXPECT_EQ(mapped.find("missing"), nullptr);
}

TEST(Safetensors, EveryDTypeIsKnownWithItsSize) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"BOOL", 1}, {"U8", 1},      {"I8", 1},      {"I16", 2},    {"U16", 2},  {"I32", 4},
      {"U32", 4},  {"I64", 8},     {"U64", 8},     {"F16", 2},    {"BF16", 2}, {"F32", 4},
      {"F64", 8},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}};
  for (const auto& [name, size] : sizes) {
    const auto dtype = parse_safetensors_dtype(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    EXPECT_EQ(safetensors_dtype_size(*dtype), size) << name;
    EXPECT_EQ(safetensors_dtype_name(*dtype), name);
  }
  EXPECT_FALSE(parse_safetensors_dtype("F4").has_value());
  EXPECT_EQ(to_dtype(SafetensorsDType::kBF16), DType::kBF16);
  EXPECT_FALSE(to_dtype(SafetensorsDType::kF64).has_value());
}

TEST(Safetensors, ViewOfAnUnviewableDTypeNamesFileTensorAndDType) {
  TempDir dir;
  write_bytes(dir.path() / "x.safetensors",
              make_safetensors({{"mask", "BOOL", {8}, std::string(8, '\1')}}));
  const SafetensorsFile mapped = SafetensorsFile::open(dir.path() / "x.safetensors");
  try {
    mapped.view(*mapped.find("mask"));
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_CONTAINS(error.what(), "x.safetensors: tensor 'mask' has dtype BOOL");
  }
}

struct BadHeader {
  const char* label;
  std::string file;
  const char* message;
};

TEST(Safetensors, BadHeadersGetSpecificErrors) {
  const std::string one = f32_bytes(1);
  const auto entry = [](const char* name, const char* dtype, const char* shape, uint64_t begin,
                        uint64_t end) {
    return fmt::format("\"{}\":{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}", name,
                       dtype, shape, begin, end);
  };
  std::string lying_length = make_safetensors_raw("{}", "");
  lying_length[0] = '\x7f';  // header length 127, file far shorter
  std::string huge_length = make_safetensors_raw("{}", "");
  std::memset(huge_length.data(), 0xff, 8);
  const std::string deep = std::string(64, '[') + std::string(64, ']');
  const BadHeader cases[] = {
      {"too short", "abc", "3 bytes, too short"},
      {"length past the end", lying_length, "header length 127 exceeds the 8 bytes after it"},
      {"huge length", huge_length, "header length 18446744073709551615 exceeds"},
      {"not json", make_safetensors_raw("{\"a\":", ""), "header is not valid JSON"},
      {"not an object", make_safetensors_raw("[1,2]", ""),
       "header is a JSON array, expected an object"},
      {"deep nesting", make_safetensors_raw(deep, ""), "nests deeper than 8 levels"},
      {"unknown dtype", make_safetensors_raw("{" + entry("w", "F48", "[1]", 0, 4) + "}", one),
       "tensor 'w': unknown dtype 'F48'"},
      {"span mismatch", make_safetensors_raw("{" + entry("w", "F32", "[2]", 0, 4) + "}", one),
       "tensor 'w': data_offsets [0, 4] span 4 bytes, expected 8 (shape [2] x 4 bytes of F32)"},
      {"offsets past the end",
       make_safetensors_raw("{" + entry("w", "F32", "[2]", 0, 8) + "}", one),
       "tensor 'w': data_offsets [0, 8] run past the data section of 4 bytes"},
      {"begin after end", make_safetensors_raw("{" + entry("w", "F32", "[1]", 4, 0) + "}", one),
       "begin <= end"},
      {"negative extent", make_safetensors_raw("{" + entry("w", "F32", "[-1]", 0, 4) + "}", one),
       "shape holds -1, expected non-negative integers"},
      {"overflowing shape",
       make_safetensors_raw("{" + entry("w", "F32", "[4294967296,4294967296]", 0, 4) + "}", one),
       "expected more than 2^64"},
      {"overlap",
       make_safetensors_raw(
           "{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[1]", 4, 8) + "}",
           f32_bytes(2)),
       "tensor 'b': data_offsets [4, 8] overlap tensor 'a'"},
      {"gap", make_safetensors_raw("{" + entry("a", "F32", "[1]", 4, 8) + "}", f32_bytes(2)),
       "tensor 'a': data_offsets [4, 8] leave a gap of 4 bytes after the header"},
      {"tail bytes", make_safetensors_raw("{" + entry("a", "F32", "[1]", 0, 4) + "}", f32_bytes(2)),
       "4 unclaimed bytes at the end"},
      {"extra field",
       make_safetensors_raw("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
                            "\"x\":1}}",
                            one),
       "tensor 'w': unexpected field 'x'"},
      {"missing field", make_safetensors_raw("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", one),
       "tensor 'w': expected dtype, shape and data_offsets"},
      {"duplicate name",
       make_safetensors_raw(
           "{" + entry("w", "F32", "[1]", 0, 4) + "," + entry("w", "F32", "[1]", 4, 8) + "}",
           f32_bytes(2)),
       "tensor 'w' appears twice"},
      {"metadata not strings", make_safetensors_raw("{\"__metadata__\":{\"a\":1}}", ""),
       "__metadata__['a'] is number, expected a string"},
      {"seven dimensions",
       make_safetensors_raw("{" + entry("w", "F32", "[1,1,1,1,1,1,1]", 0, 4) + "}", one),
       "7 dimensions, at most 6"},
      {"offsets not a pair",
       make_safetensors_raw("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", one),
       "data_offsets is [0], expected [begin, end]"},
  };
  for (const BadHeader& bad : cases) {
    const std::string message = parse_error(bad.file);
    EXPECT_CONTAINS(message, bad.message) << bad.label;
    EXPECT_CONTAINS(message, "test.safetensors") << bad.label;
  }
}

TEST(Safetensors, OpenNamesTheFileWhenMissingEmptyOrTruncated) {
  TempDir dir;
  const auto open_error = [](const std::filesystem::path& path) -> std::string {
    try {
      SafetensorsFile::open(path);
    } catch (const Error& error) {
      return error.what();
    }
    return "";
  };
  EXPECT_CONTAINS(open_error(dir.path() / "none.safetensors"), "none.safetensors: cannot open");
  write_bytes(dir.path() / "empty.safetensors", "");
  EXPECT_CONTAINS(open_error(dir.path() / "empty.safetensors"),
                  "empty.safetensors: 0 bytes, expected a safetensors file");
  const std::string whole = make_safetensors({{"w", "F32", {16}, f32_bytes(16)}});
  write_bytes(dir.path() / "cut.safetensors", whole.substr(0, whole.size() - 10));
  EXPECT_CONTAINS(open_error(dir.path() / "cut.safetensors"),
                  "cut.safetensors: tensor 'w': data_offsets [0, 64] run past the data "
                  "section of 54 bytes (truncated file?)");
}

// ---- sharded directories ----

void write_index(const std::filesystem::path& dir, const nlohmann::json& weight_map) {
  write_bytes(dir / "model.safetensors.index.json",
              nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
}

std::string checkpoint_error(const std::filesystem::path& dir) {
  try {
    SafetensorsCheckpoint::open(dir);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(SafetensorsCheckpoint, ShardsFromTheIndex) {
  TempDir dir;
  write_bytes(dir.path() / "a.safetensors",
              make_safetensors({{"x", "F32", {2}, f32_bytes(2, 5.0f)}}));
  write_bytes(dir.path() / "b.safetensors", make_safetensors({{"y", "F32", {1}, f32_bytes(1, 9.0f)},
                                                              {"z", "F32", {1}, f32_bytes(1)}}));
  write_index(dir.path(), {{"x", "a.safetensors"}, {"y", "b.safetensors"}, {"z", "b.safetensors"}});
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(dir.path());
  EXPECT_EQ(checkpoint.files().size(), 2u);
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(checkpoint.view("x").data_as<const float>()[1], 6.0f);
  EXPECT_EQ(checkpoint.view("y").data_as<const float>()[0], 9.0f);
  EXPECT_EQ(checkpoint.find("y")->file->path().filename(), "b.safetensors");
  EXPECT_FALSE(checkpoint.find("w").has_value());
  EXPECT_THROW(checkpoint.view("w"), Error);

  // The index must agree with the shards, both ways, and stay inside the directory.
  write_index(dir.path(), {{"x", "a.safetensors"}, {"y", "b.safetensors"}});
  EXPECT_CONTAINS(checkpoint_error(dir.path()),
                  "b.safetensors: tensor 'z' is not listed for this shard");
  write_index(dir.path(), {{"x", "a.safetensors"},
                           {"y", "b.safetensors"},
                           {"z", "b.safetensors"},
                           {"w", "a.safetensors"}});
  EXPECT_CONTAINS(checkpoint_error(dir.path()),
                  "a.safetensors: tensor 'w' is listed in model.safetensors.index.json but "
                  "absent from that shard");
  write_index(dir.path(), {{"x", "../a.safetensors"}});
  EXPECT_CONTAINS(checkpoint_error(dir.path()),
                  "weight_map['x'] is '../a.safetensors', expected a file name inside");
  write_index(dir.path(), {{"x", "c.safetensors"}});
  EXPECT_CONTAINS(checkpoint_error(dir.path()), "c.safetensors: cannot open");
  write_bytes(dir.path() / "model.safetensors.index.json", "{\"weight_map\": 3}");
  EXPECT_CONTAINS(checkpoint_error(dir.path()), "expected a \"weight_map\" object");
}

TEST(SafetensorsCheckpoint, EmptyDirectoryIsAnError) {
  TempDir dir;
  EXPECT_CONTAINS(checkpoint_error(dir.path()),
                  "no model.safetensors or model.safetensors.index.json");
}

// Every fixture's tensors as Python's safetensors listed them (expected.json "tensors").
TEST(SafetensorsCheckpoint, FixturesMatchPythonsListing) {
  for (const std::string& name : fixture_cases()) {
    SCOPED_TRACE(name);
    const auto expected = nlohmann::json::parse(read_bytes(fixture_dir(name) / "expected.json"));
    const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(fixture_dir(name));
    const auto& tensors = expected["tensors"];
    ASSERT_EQ(checkpoint.tensor_count(), tensors.size());
    for (const auto& [tensor, info] : tensors.items()) {
      const auto location = checkpoint.find(tensor);
      ASSERT_TRUE(location.has_value()) << tensor;
      EXPECT_EQ(location->file->path().filename().string(), info[0].get<std::string>()) << tensor;
      EXPECT_EQ(std::string(safetensors_dtype_name(location->info->dtype)),
                info[1].get<std::string>());
      EXPECT_EQ(location->info->shape, info[2].get<std::vector<int64_t>>()) << tensor;
    }
  }
}

}  // namespace
}  // namespace pagedattn::model
