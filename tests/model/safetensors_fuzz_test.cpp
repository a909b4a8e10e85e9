// Fuzzing the safetensors header parser: mutated valid files and grammar-generated headers with
// lying values, thousands each with a printed seed (PAGEDATTN_TEST_SEED reproduces). Every input
// must end in a header or an Error, never a crash; CI runs this under ASan + UBSan. A libFuzzer
// entry point for longer runs is tests/model/fuzz/safetensors_header_fuzzer.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "checkpoint_test_util.h"
#include "pagedattn/error.h"
#include "pagedattn/safetensors.h"

namespace pagedattn::model {
namespace {

using namespace checkpoint_testing;

std::span<const std::byte> as_bytes(const std::string& text) {
  return std::span(reinterpret_cast<const std::byte*>(text.data()), text.size());
}

uint32_t fuzz_seed(const char* test) {
  uint32_t seed = std::random_device{}();
  if (const char* env = std::getenv("PAGEDATTN_TEST_SEED"); env != nullptr && *env != '\0') {
    seed = static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  }
  std::printf("%s seed %u (PAGEDATTN_TEST_SEED=%u reproduces)\n", test, seed, seed);
  return seed;
}

// Mutates a valid file's header region (and sometimes its length field or size) and parses it:
// every outcome must be a header or an Error. A header that parses must still be self-consistent.
TEST(SafetensorsFuzz, MutatedHeadersNeverCrash) {
  std::mt19937 random(fuzz_seed("SafetensorsFuzz.MutatedHeadersNeverCrash"));
  const std::string valid =
      make_safetensors({{"model.embed_tokens.weight", "BF16", {4, 2}, std::string(16, '\1')},
                        {"model.norm.weight", "F32", {2}, f32_bytes(2)},
                        {"lm_head.weight", "F16", {4, 2}, std::string(16, '\2')}},
                       {{"format", "pt"}});
  const std::string tokens[] = {"{",
                                "}",
                                "[",
                                "]",
                                ",",
                                ":",
                                "\"",
                                "0",
                                "-1",
                                "1e999",
                                "18446744073709551615",
                                "99999999999999999999",
                                "\"F32\"",
                                "\"data_offsets\"",
                                "\"shape\"",
                                "null",
                                "true",
                                "\\u0000",
                                "\\"};
  int parsed = 0;
  int rejected = 0;
  for (int iteration = 0; iteration < 4000; ++iteration) {
    std::string file = valid;
    const int mutations = 1 + static_cast<int>(random() % 4);
    for (int m = 0; m < mutations; ++m) {
      const size_t header_end = std::min(file.size(), size_t{8} + 200);
      const size_t position = random() % std::max<size_t>(header_end, 1);
      switch (random() % 7) {
        case 0:  // random byte
          if (!file.empty()) file[position % file.size()] = static_cast<char>(random());
          break;
        case 1:  // truncation
          file.resize(random() % (file.size() + 1));
          break;
        case 2:  // lying length field
          if (file.size() >= 8) {
            const uint64_t length =
                random() % 3 == 0 ? ~uint64_t{0} - random() % 16 : random() % (file.size() + 64);
            for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((length >> (8 * i)) & 0xff);
          }
          break;
        case 3:  // splice a JSON token
          if (position < file.size()) file.insert(position, tokens[random() % std::size(tokens)]);
          break;
        case 4:  // delete a run
          if (position < file.size()) file.erase(position, 1 + random() % 8);
          break;
        case 5:  // a digit changed (offsets and extents that lie)
          for (size_t i = position; i < file.size() && i < position + 40; ++i) {
            if (file[i] >= '0' && file[i] <= '9') {
              file[i] = static_cast<char>('0' + random() % 10);
              break;
            }
          }
          break;
        default:  // deep nesting
          if (position < file.size()) file.insert(position, std::string(1 + random() % 200, '['));
          break;
      }
    }
    try {
      const SafetensorsHeader header = parse_safetensors_header(as_bytes(file), "fuzz");
      uint64_t covered = 0;
      for (const SafetensorsTensorInfo& tensor : header.tensors) {
        ASSERT_EQ(tensor.data_begin, covered);
        covered = tensor.data_end;
      }
      ASSERT_EQ(header.data_offset + covered, file.size());
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    }
  }
  std::printf("SafetensorsFuzz: %d parsed, %d rejected\n", parsed, rejected);
  EXPECT_GT(rejected, 0);
}

// Headers generated from the format's grammar with values that lie (dtypes, extents near 2^63 and
// 2^64, offsets out of range, overlapping or leaving gaps, data sections too short or too long), so
// that most inputs get past JSON parsing into the validation. Whatever parses must tile the data
// section exactly and agree with shape x dtype size.
TEST(SafetensorsFuzz, GeneratedHeadersNeverCrash) {
  std::mt19937_64 random(fuzz_seed("SafetensorsFuzz.GeneratedHeadersNeverCrash"));
  const char* dtypes[] = {"F32", "F16", "BF16", "I64", "BOOL", "F8_E4M3", "F64", "X", ""};
  const uint64_t extremes[] = {0,
                               1,
                               2,
                               3,
                               255,
                               65536,
                               4294967296ull,
                               9223372036854775807ull,
                               9223372036854775808ull,
                               18446744073709551615ull};
  const auto number = [&]() -> uint64_t {
    return random() % 4 == 0 ? extremes[random() % std::size(extremes)] : random() % 64;
  };
  int parsed = 0;
  for (int iteration = 0; iteration < 4000; ++iteration) {
    std::string header = "{";
    uint64_t offset = 0;
    const int count = static_cast<int>(random() % 5);
    for (int t = 0; t < count; ++t) {
      const char* dtype = dtypes[random() % std::size(dtypes)];
      const auto size = parse_safetensors_dtype(dtype);
      std::string shape;
      uint64_t elements = 1;
      const int dims = static_cast<int>(random() % 4);
      for (int d = 0; d < dims; ++d) {
        const uint64_t extent = random() % 3 == 0 ? number() : 1 + random() % 4;
        if (d > 0) shape += ',';
        shape += std::to_string(extent);
        elements *= extent;
      }
      uint64_t begin = offset;
      uint64_t end = offset + elements * (size ? safetensors_dtype_size(*size) : 1);
      if (random() % 4 == 0) begin = number();
      if (random() % 4 == 0) end = number();
      offset = end;
      header +=
          fmt::format("{}\"t{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                      t ? "," : "", random() % 3, dtype, shape, begin, end);
    }
    header += "}";
    uint64_t data_size = offset < 4096 ? offset : random() % 64;
    if (random() % 4 == 0) data_size = random() % 64;
    const std::string file = make_safetensors_raw(header, std::string(data_size, '\0'));
    try {
      const SafetensorsHeader parsed_header = parse_safetensors_header(as_bytes(file), "fuzz");
      uint64_t covered = 0;
      for (const SafetensorsTensorInfo& tensor : parsed_header.tensors) {
        ASSERT_EQ(tensor.data_begin, covered);
        uint64_t elements = 1;
        for (int64_t extent : tensor.shape) elements *= static_cast<uint64_t>(extent);
        ASSERT_EQ(tensor.byte_size(), elements * safetensors_dtype_size(tensor.dtype));
        covered = tensor.data_end;
      }
      ASSERT_EQ(parsed_header.data_offset + covered, file.size());
      ++parsed;
    } catch (const Error&) {
    }
  }
  std::printf("SafetensorsFuzz.Generated: %d of 4000 parsed\n", parsed);
  EXPECT_GT(parsed, 0);
}

}  // namespace
}  // namespace pagedattn::model
