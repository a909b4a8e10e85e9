// libFuzzer entry point for the safetensors header parser: any byte sequence must give a header or
// a pagedattn::Error, never a crash, a read outside the input or undefined behaviour. Not part of
// the test build (tests/model/*.cpp only); build and run it with clang:
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -Isrc/model \
//     tests/model/fuzz/safetensors_header_fuzzer.cpp src/model/checkpoint/safetensors_header.cpp \
//     src/core/*.cpp -lfmt -o safetensors_fuzzer
//   ./safetensors_fuzzer -max_len=4096 corpus/   # seed corpus: tests/data/model/*/*.safetensors
//
// The gtest SafetensorsFuzz.MutatedHeadersNeverCrash runs the same property in CI without clang.
#include <cstddef>
#include <cstdint>
#include <span>

#include "pagedattn/error.h"
#include "pagedattn/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto header = pagedattn::model::parse_safetensors_header(
        std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz");
    // A header that parses tiles the data section exactly.
    uint64_t covered = 0;
    for (const auto& tensor : header.tensors) {
      if (tensor.data_begin != covered) __builtin_trap();
      covered = tensor.data_end;
    }
    if (header.data_offset + covered != size) __builtin_trap();
  } catch (const pagedattn::Error&) {
  }
  return 0;
}
