// Bad checkpoints: a fixture copied to a temporary directory and broken one way at a time (a
// tensor removed, added, reshaped, retyped, a file truncated or lying about its offsets, fp8
// quantization, a missing shard, an unknown architecture). Each must fail in Checkpoint::open with
// an Error naming the file, the tensor and expected vs got; the known-harmless extras must load.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "checkpoint_test_util.h"
#include "pagedattn/checkpoint.h"
#include "pagedattn/error.h"

namespace pagedattn::model {
namespace {

using namespace checkpoint_testing;
using nlohmann::json;
namespace fs = std::filesystem;

// The tensors of a safetensors file as the test writer's input, in file order.
std::vector<TensorBytes> read_tensors(const fs::path& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::vector<TensorBytes> tensors;
  for (const SafetensorsTensorInfo& info : file.tensors()) {
    const auto bytes = file.bytes(info);
    tensors.push_back({info.name, std::string(safetensors_dtype_name(info.dtype)), info.shape,
                       std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())});
  }
  return tensors;
}

// A copy of fixture `name` whose model.safetensors passed through `edit`.
class BrokenFixture {
 public:
  explicit BrokenFixture(std::string_view name) { copy_fixture(name, dir_.path()); }
  const fs::path& path() const { return dir_.path(); }
  void edit_tensors(const std::function<void(std::vector<TensorBytes>&)>& edit,
                    const std::string& file = "model.safetensors") {
    std::vector<TensorBytes> tensors = read_tensors(dir_.path() / file);
    edit(tensors);
    write_bytes(dir_.path() / file, make_safetensors(tensors));
  }
  void edit_config(const std::function<void(json&)>& edit) {
    json config = json::parse(read_bytes(dir_.path() / "config.json"));
    edit(config);
    write_bytes(dir_.path() / "config.json", config.dump(2));
  }
  // The Error message of Checkpoint::open ("" when it loads).
  std::string open_error() const {
    try {
      Checkpoint::open(dir_.path());
    } catch (const Error& error) {
      return error.what();
    }
    return "";
  }
  std::string file(const std::string& name = "model.safetensors") const {
    return (dir_.path() / name).string();
  }

 private:
  TempDir dir_;
};

TensorBytes* find(std::vector<TensorBytes>& tensors, std::string_view name) {
  for (TensorBytes& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  ADD_FAILURE() << "no tensor " << name;
  static TensorBytes none;
  return &none;
}

TEST(CheckpointErrors, MissingTensor) {
  BrokenFixture fixture("qwen2_f32");
  fixture.edit_tensors([](std::vector<TensorBytes>& tensors) {
    std::erase_if(tensors, [](const TensorBytes& t) {
      return t.name == "model.layers.1.mlp.down_proj.weight" || t.name == "lm_head.weight";
    });
  });
  EXPECT_CONTAINS(fixture.open_error(),
                  fixture.path().string() +
                      ": Qwen2ForCausalLM checkpoint is missing 2 "
                      "tensor(s): model.layers.1.mlp.down_proj.weight [64, 128], lm_head.weight "
                      "[384, 64]");
}

TEST(CheckpointErrors, UnexpectedTensorIsListedWithItsFile) {
  BrokenFixture fixture("qwen2_f32");
  fixture.edit_tensors([](std::vector<TensorBytes>& tensors) {
    tensors.push_back({"model.layers.0.self_attn.extra.weight", "F32", {2}, f32_bytes(2)});
  });
  EXPECT_CONTAINS(fixture.open_error(),
                  "1 unexpected tensor(s) for Qwen2ForCausalLM with this config.json: "
                  "model.layers.0.self_attn.extra.weight (in " +
                      fixture.file() + ")");
}

TEST(CheckpointErrors, HarmlessExtrasLoad) {
  BrokenFixture fixture("qwen3_bf16");  // tied: a stored lm_head.weight is ignored
  fixture.edit_tensors([](std::vector<TensorBytes>& tensors) {
    tensors.push_back({"model.rotary_emb.inv_freq", "F32", {16}, f32_bytes(16)});
    tensors.push_back({"lm_head.weight", "BF16", {416, 64}, std::string(416 * 64 * 2, '\0')});
  });
  EXPECT_EQ(fixture.open_error(), "");
  const Checkpoint checkpoint = Checkpoint::open(fixture.path());
  EXPECT_EQ(checkpoint.weights().lm_head.data, checkpoint.weights().embed_tokens.data);
}

TEST(CheckpointErrors, WrongShapeNamesFileTensorAndBothShapes) {
  BrokenFixture fixture("qwen2_f32");
  fixture.edit_config([](json& config) { config["intermediate_size"] = 96; });
  EXPECT_CONTAINS(fixture.open_error(),
                  fixture.file() +
                      ": tensor "
                      "'model.layers.0.mlp.gate_proj.weight': shape [128, 64], expected [96, 64]");
}

TEST(CheckpointErrors, WrongDtypeNamesFileTensorAndBothDtypes) {
  BrokenFixture fixture("qwen2_f32");
  fixture.edit_tensors([](std::vector<TensorBytes>& tensors) {
    TensorBytes* norm = find(tensors, "model.norm.weight");
    norm->dtype = "F16";
    norm->data.resize(norm->data.size() / 2);
  });
  EXPECT_CONTAINS(
      fixture.open_error(),
      fixture.file() +
          ": tensor 'model.norm.weight': dtype "
          "f16, expected f32 (the checkpoint's dtype, that of model.embed_tokens.weight)");
}

TEST(CheckpointErrors, DtypeWithoutAViewIsRefused) {
  BrokenFixture fixture("qwen2_f32");
  fixture.edit_tensors([](std::vector<TensorBytes>& tensors) {
    TensorBytes* norm = find(tensors, "model.norm.weight");
    norm->dtype = "I8";
    norm->data.resize(norm->data.size() / 4);
  });
  EXPECT_CONTAINS(
      fixture.open_error(),
      fixture.file() + ": tensor 'model.norm.weight': dtype I8, expected F32, F16 or BF16");
}

TEST(CheckpointErrors, CorrectionBiasMayBeF32ButNotTheRouter) {
  BrokenFixture fixture("deepseek_v3_bf16");
  const auto to_f32 = [](TensorBytes* tensor) {
    std::string wide;
    for (size_t i = 0; i < tensor->data.size(); i += 2) {
      wide += std::string(2, '\0') + tensor->data.substr(i, 2);  // bf16 -> f32: low half zero
    }
    tensor->dtype = "F32";
    tensor->data = wide;
  };
  fixture.edit_tensors([&](std::vector<TensorBytes>& tensors) {
    to_f32(find(tensors, "model.layers.1.mlp.gate.e_score_correction_bias"));
  });
  EXPECT_EQ(fixture.open_error(), "");
  fixture.edit_tensors([&](std::vector<TensorBytes>& tensors) {
    to_f32(find(tensors, "model.layers.2.mlp.gate.weight"));
  });
  EXPECT_CONTAINS(fixture.open_error(),
                  "tensor 'model.layers.2.mlp.gate.weight': dtype f32, expected bf16");
}

TEST(CheckpointErrors, MultiTokenPredictionLayersAreIgnored) {
  BrokenFixture fixture("deepseek_v3_bf16");  // 3 layers, num_nextn_predict_layers 1
  fixture.edit_tensors([](std::vector<TensorBytes>& tensors) {
    tensors.push_back({"model.layers.3.enorm.weight", "BF16", {64}, std::string(128, '\0')});
  });
  EXPECT_EQ(fixture.open_error(), "");
  fixture.edit_tensors([](std::vector<TensorBytes>& tensors) {
    tensors.push_back({"model.layers.4.enorm.weight", "BF16", {64}, std::string(128, '\0')});
  });
  EXPECT_CONTAINS(fixture.open_error(),
                  "unexpected tensor(s) for DeepseekV3ForCausalLM with this "
                  "config.json: model.layers.4.enorm.weight");
}

TEST(CheckpointErrors, TruncatedFile) {
  BrokenFixture fixture("llama3_bf16");
  const std::string bytes = read_bytes(fixture.file());
  write_bytes(fixture.file(), bytes.substr(0, bytes.size() - 100));
  EXPECT_CONTAINS(fixture.open_error(), fixture.file() + ": tensor ");
  EXPECT_CONTAINS(fixture.open_error(), "run past the data section");
}

TEST(CheckpointErrors, HeaderThatLiesAboutOffsets) {
  BrokenFixture fixture("llama3_bf16");
  std::string bytes = read_bytes(fixture.file());
  const size_t at = bytes.find("\"data_offsets\":[0,");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 18, "\"data_offsets\":[2,");  // same length: the header length stays true
  write_bytes(fixture.file(), bytes);
  EXPECT_CONTAINS(fixture.open_error(), fixture.file() + ": tensor ");
  EXPECT_CONTAINS(fixture.open_error(), "data_offsets [2, ");
}

TEST(CheckpointErrors, Fp8BlockQuantizationIsNotSupportedYet) {
  {
    BrokenFixture fixture("deepseek_v3_bf16");
    fixture.edit_config([](json& config) {
      config["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
    });
    EXPECT_CONTAINS(fixture.open_error(),
                    "config.json has a quantization_config (quant_method "
                    "'fp8'): fp8 block-quantized weights are not supported yet");
  }
  {
    BrokenFixture fixture("deepseek_v3_bf16");
    fixture.edit_tensors([](std::vector<TensorBytes>& tensors) {
      tensors.push_back(
          {"model.layers.0.self_attn.kv_b_proj.weight_scale_inv", "F32", {1, 1}, f32_bytes(1)});
    });
    EXPECT_CONTAINS(fixture.open_error(),
                    fixture.file() +
                        ": tensor "
                        "'model.layers.0.self_attn.kv_b_proj.weight_scale_inv' (F32): fp8 "
                        "block-quantized weights are not supported yet");
  }
  {
    BrokenFixture fixture("deepseek_v3_bf16");
    fixture.edit_tensors([](std::vector<TensorBytes>& tensors) {
      TensorBytes* weight = find(tensors, "model.layers.0.self_attn.o_proj.weight");
      weight->dtype = "F8_E4M3";
      weight->data.resize(weight->data.size() / 2);
    });
    EXPECT_CONTAINS(fixture.open_error(),
                    "'model.layers.0.self_attn.o_proj.weight' (F8_E4M3): "
                    "fp8 block-quantized weights are not supported yet");
  }
}

TEST(CheckpointErrors, UnknownArchitecture) {
  BrokenFixture fixture("llama3_bf16");
  fixture.edit_config([](json& config) { config["architectures"] = {"GPT2LMHeadModel"}; });
  EXPECT_CONTAINS(fixture.open_error(),
                  "architectures [GPT2LMHeadModel] is not supported "
                  "(supported: LlamaForCausalLM, Qwen2ForCausalLM");
}

TEST(CheckpointErrors, MissingShardAndMissingFiles) {
  {
    BrokenFixture fixture("llama_linear_f16_sharded");
    fs::remove(fixture.path() / "model-00002-of-00004.safetensors");
    EXPECT_CONTAINS(fixture.open_error(),
                    fixture.file("model-00002-of-00004.safetensors") + ": cannot open");
  }
  {
    BrokenFixture fixture("llama_linear_f16_sharded");
    json index = json::parse(read_bytes(fixture.path() / "model.safetensors.index.json"));
    index["weight_map"].erase("model.norm.weight");
    write_bytes(fixture.path() / "model.safetensors.index.json", index.dump());
    EXPECT_CONTAINS(fixture.open_error(),
                    "tensor 'model.norm.weight' is not listed for this shard");
  }
  {
    BrokenFixture fixture("qwen2_f32");
    fs::remove(fixture.path() / "model.safetensors");
    EXPECT_CONTAINS(fixture.open_error(), "no model.safetensors or model.safetensors.index.json");
  }
  {
    BrokenFixture fixture("qwen2_f32");
    fs::remove(fixture.path() / "config.json");
    EXPECT_CONTAINS(fixture.open_error(), "config.json: cannot open");
  }
  EXPECT_THROW(Checkpoint::open(fixture_dir("no_such_model")), Error);
}

}  // namespace
}  // namespace pagedattn::model
