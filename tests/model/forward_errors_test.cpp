// Bad steps get an Error that names the request and the problem, and leave the KV pool as it was
// (every check runs before the first layer stores anything); KvPool sizing from a byte budget.
#include <gtest/gtest.h>

#include <cstring>

#include "model/model_fixture.h"
#include "pagedattn/checkpoint.h"
#include "pagedattn/error.h"

namespace pagedattn::model {
namespace {

// Every byte of every layer's cache.
std::vector<char> snapshot(const KvPool& pool) {
  std::vector<char> bytes;
  for (int64_t layer = 0; layer < pool.num_layers(); ++layer) {
    const TensorView views[2] = {
        pool.is_mla() ? pool.layer_latent(layer).ckv : pool.layer_kv(layer).k,
        pool.is_mla() ? TensorView{} : pool.layer_kv(layer).v};
    for (const TensorView& v : views) {
      if (!v.defined()) continue;
      // HostKvCache / HostMlaCache buffers are contiguous from the view's start (for MLA, the
      // ckv view's rows are [rank + rope] wide: read the whole buffer).
      const int64_t elements = v.shape[0] * v.strides[0];
      const char* data = static_cast<const char*>(v.data);
      bytes.insert(bytes.end(), data, data + elements * dtype_size(v.dtype));
    }
  }
  return bytes;
}

void expect_error(Model& model, KvPool& pool, const Step& step, const std::string& fragment) {
  const std::vector<char> before = snapshot(pool);
  try {
    model.forward(step, pool);
    ADD_FAILURE() << "expected an error containing \"" << fragment << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_TRUE(before == snapshot(pool))
      << "the pool changed for a rejected step (" << fragment << ")";
}

class ForwardErrors : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardErrors, BadStepsAreRejectedBeforeAnyStore) {
  const testing::Fixture fixture = testing::Fixture::load(GetParam());
  const Checkpoint checkpoint = Checkpoint::open(fixture.directory);
  Model model(checkpoint.config(), checkpoint.weights(), testing::cpu_options());
  KvPoolConfig config;
  config.alloc_page_size = 4;
  config.dtype = DType::kF32;
  config.num_pages = 8;
  KvPool pool = model.make_kv_pool(config);
  // A valid first step so that the pool holds something.
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  const std::vector<int32_t> table = {6, 2};
  Step ok;
  ok.requests.push_back({prompt, 0, {}, table});
  model.forward(ok, pool);

  const std::vector<int32_t> one = {7}, none = {};
  const std::vector<int32_t> short_table = {6};
  const std::vector<int32_t> bad_page = {6, 8};
  const std::vector<int32_t> bad_token = {static_cast<int32_t>(fixture.vocab)};
  const std::vector<int32_t> far_position = {1 << 20};
  Step s;
  s.requests = {{one, 5, {}, table}, {none, 0, {}, table}};
  expect_error(model, pool, s, "request 1 has no new tokens");
  s.requests = {{prompt, 4, {}, short_table}};
  expect_error(model, pool, s, "request 0 has 9 tokens");
  s.requests = {{one, 5, {}, bad_page}};
  expect_error(model, pool, s, "block_table[0][1] = 8: page id out of range");
  s.requests = {{bad_token, 5, {}, table}};
  expect_error(model, pool, s, "outside the vocabulary");
  s.requests = {{one, 5, far_position, table}};
  expect_error(model, pool, s, "position 1048576");
  RequestStep too_many_rows{prompt, 4, {}, table};
  too_many_rows.tokens = std::span<const int32_t>(prompt).first(2);
  too_many_rows.num_logit_rows = 3;
  s.requests = {too_many_rows};
  expect_error(model, pool, s, "request 0 wants 3 logit rows of 2 new tokens");
  too_many_rows.num_logit_rows = 0;
  s.requests = {too_many_rows};
  expect_error(model, pool, s, "request 0 wants 0 logit rows");
  s.requests = {{one, 5, {}, table}};
  s.sampling = {ops::RowSampling{}, ops::RowSampling{}};
  expect_error(model, pool, s, "sampling has 2 entries for 1 logits rows");
  ops::RowSampling bad_top_p;
  bad_top_p.sample = true;
  bad_top_p.top_p = 0.0;
  s.sampling = {bad_top_p};
  expect_error(model, pool, s, "top_p 0");
  s.sampling = {};
  s.requests = {};
  expect_error(model, pool, s, "no requests");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ForwardErrors,
                         ::testing::Values("qwen3_bf16", "deepseek_v2_f16"),
                         [](const auto& info) { return info.param; });

TEST(KvPool, SizedFromAByteBudget) {
  const Checkpoint checkpoint = Checkpoint::open(testing::Fixture::load("qwen3_bf16").directory);
  const ModelConfig& c = checkpoint.config();
  KvPoolConfig config;
  config.alloc_page_size = 16;
  config.page_size = 4;
  config.dtype = DType::kBF16;
  const int64_t page = KvPool::bytes_per_page(c, 16, DType::kBF16);
  EXPECT_EQ(page, 2 * c.num_key_value_heads * c.head_dim * 16 * 2 * c.num_hidden_layers);
  config.byte_budget = 10 * page + page / 2;
  const KvPool pool(c, config);
  EXPECT_EQ(pool.num_pages(), 10);
  EXPECT_EQ(pool.bytes(), 10 * page);
  EXPECT_EQ(pool.layer_kv(0).page_size, 4);
  config.byte_budget = page - 1;
  EXPECT_THROW(KvPool(c, config), Error);
  config.byte_budget = 10 * page;
  config.page_size = 3;
  EXPECT_THROW(KvPool(c, config), Error);
}

// Pools are told apart by id, not address (CUDA graphs are keyed by it): every pool a new one,
// a moved pool keeps its own.
TEST(KvPool, EachPoolHasItsOwnIdAndAMoveKeepsIt) {
  const Checkpoint checkpoint = Checkpoint::open(testing::Fixture::load("qwen3_bf16").directory);
  KvPoolConfig config;
  config.num_pages = 2;
  config.dtype = DType::kF32;
  KvPool first(checkpoint.config(), config);
  const uint64_t id = first.id();
  KvPool moved = std::move(first);
  EXPECT_EQ(moved.id(), id);
  const KvPool second(checkpoint.config(), config);
  EXPECT_NE(second.id(), id);
  EXPECT_NE(second.id(), 0u);
}

// Model::launch / collect (overlap scheduling) are for a model on CUDA: on the CPU, can_launch is
// false and both are an Error that says so; the pool is untouched.
TEST(ModelLaunch, OnTheCpuLaunchAndCollectSaySo) {
  const testing::Fixture fixture = testing::Fixture::load("qwen3_bf16");
  const Checkpoint checkpoint = Checkpoint::open(fixture.directory);
  Model model(checkpoint.config(), checkpoint.weights(), testing::cpu_options());
  EXPECT_FALSE(model.can_launch());
  KvPoolConfig config;
  config.alloc_page_size = 4;
  config.dtype = DType::kF32;
  config.num_pages = 4;
  KvPool pool = model.make_kv_pool(config);
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> table = {1};
  Step step;
  step.requests.push_back({prompt, 0, {}, table});
  const std::vector<char> before = snapshot(pool);
  try {
    model.launch(step, pool);
    ADD_FAILURE() << "launch on the CPU did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("launch: a model on cpu runs its steps with forward"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(before == snapshot(pool));
  try {
    std::vector<ops::SampledToken> tokens(1);
    model.collect(tokens);
    ADD_FAILURE() << "collect on the CPU did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("collect: a model on cpu launches nothing"),
              std::string::npos)
        << e.what();
  }
}

// ModelOptions::device: "cuda" where no CUDA device can be used (CI) or in a build without CUDA is
// an Error that says which; "auto" with a CPU backend named stays on the CPU; a CPU model's pool
// is on the CPU; an unknown device is named.
TEST(ModelDevice, CudaWithoutAUsableDeviceSaysWhy) {
  const Checkpoint checkpoint = Checkpoint::open(testing::Fixture::load("llama3_bf16").directory);
  ModelOptions options;
  options.device = "cuda";
  try {
    const Model model(checkpoint.config(), checkpoint.weights(), options);
    EXPECT_EQ(model.device(), Device::cuda(0));  // a usable GPU: the CUDA model was built
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("model: device cuda"), std::string::npos) << message;
#ifdef PAGEDATTN_WITH_CUDA
    EXPECT_NE(message.find("CUDA device"), std::string::npos) << message;
#else
    EXPECT_NE(message.find("needs pagedattn built with CUDA"), std::string::npos) << message;
#endif
  }
  options.device = "tpu";
  try {
    resolve_model_device(options);
    ADD_FAILURE() << "device tpu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'tpu'"), std::string::npos) << e.what();
  }
}

TEST(ModelDevice, AutoStaysOnTheCpuWhenTheBackendSpecNamesTheCpu) {
  ModelOptions options;
  options.backend = "cpu";
  EXPECT_EQ(resolve_model_device(options), Device::cpu());
  options.backend = "prefill=cpu,decode=auto";
  EXPECT_EQ(resolve_model_device(options), Device::cpu());
#ifndef PAGEDATTN_WITH_CUDA
  options.backend = "auto";
  EXPECT_EQ(resolve_model_device(options), Device::cpu());
#endif
  const Checkpoint checkpoint = Checkpoint::open(testing::Fixture::load("qwen3_bf16").directory);
  const Model model(checkpoint.config(), checkpoint.weights(), testing::cpu_options());
  EXPECT_EQ(model.device(), Device::cpu());
  EXPECT_EQ(model.max_step_tokens(), 0);
  KvPoolConfig pool_config;
  pool_config.num_pages = 4;
  pool_config.device = Device::cuda(0);  // make_kv_pool puts the pool on the model's device
  EXPECT_EQ(model.make_kv_pool(pool_config).device(), Device::cpu());
}

#ifndef PAGEDATTN_WITH_CUDA
TEST(KvPool, OnCudaNeedsACudaBuild) {
  const Checkpoint checkpoint = Checkpoint::open(testing::Fixture::load("qwen3_bf16").directory);
  KvPoolConfig config;
  config.num_pages = 4;
  config.device = Device::cuda(0);
  try {
    KvPool pool(checkpoint.config(), config);
    ADD_FAILURE() << "a CUDA pool in a build without CUDA";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs pagedattn built with CUDA"), std::string::npos)
        << e.what();
  }
}
#endif

}  // namespace
}  // namespace pagedattn::model
