// Backend selection over a local registry of fake backends (the whole matrix of operation x
// device x spec), spec parsing, PAGEDATTN_BACKEND, and the built-in registry (an explicit CUDA
// choice on a machine that cannot serve it is an error saying why; unknown names list the known).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "common/scoped_env.h"
#include "common/test_util.h"
#include "pagedattn/error.h"
#include "pagedattn/registry.h"

namespace pagedattn {
namespace {

// A backend that serves what its predicate allows; never runs anything.
class FakeBackend final : public Backend {
 public:
  FakeBackend(std::string name, DeviceType device, std::function<Support(const OpDesc&)> rule)
      : name_(std::move(name)), device_(device), rule_(std::move(rule)) {}
  std::string_view name() const override { return name_; }
  DeviceType device_type() const override { return device_; }
  Support supports(const OpDesc& op) const override { return rule_(op); }
  std::string describe() const override { return "fake"; }
  std::unique_ptr<Workspace> create_workspace(const WorkspaceLimits&) const override {
    return nullptr;
  }
  void plan(Workspace&, const OpDesc&, const StepMetadata&) const override {}
  void run_decode(Workspace&, const DecodeArgs&) const override {}
  void run_prefill(Workspace&, const PrefillArgs&) const override {}
  void run_mla(Workspace&, const MlaArgs&) const override {}

 private:
  std::string name_;
  DeviceType device_;
  std::function<Support(const OpDesc&)> rule_;
};

Support decode_only(const OpDesc& op) {
  return is_decode_like(op.op) ? Support::yes()
                               : Support::no(fmt::format("no {} kernel", op_name(op.op)));
}
Support no_mla(const OpDesc& op) {
  return is_mla(op.op) ? Support::no("MLA is not implemented") : Support::yes();
}
Support everything(const OpDesc&) { return Support::yes(); }
Support nothing(const OpDesc&) { return Support::no("device lost"); }

// Priority order: fast_gpu (decode only), gpu (no MLA), fast_cpu (decode only), cpu (all).
Registry make_fake_registry() {
  Registry registry;
  registry.add(std::make_unique<FakeBackend>("fast_gpu", DeviceType::kCUDA, decode_only));
  registry.add(std::make_unique<FakeBackend>("gpu", DeviceType::kCUDA, no_mla));
  registry.add(std::make_unique<FakeBackend>("fast_cpu", DeviceType::kCPU, decode_only));
  registry.add(std::make_unique<FakeBackend>("cpu", DeviceType::kCPU, everything));
  registry.add(std::make_unique<FakeBackend>("broken", DeviceType::kCPU, nothing));
  return registry;
}

OpDesc op_on(OpKind kind, Device device) {
  OpDesc op;
  op.op = kind;
  op.device = device;
  return op;
}

struct SelectCase {
  const char* spec;
  OpKind op;
  DeviceType device;
  const char* expected;               // backend name, or "" for an error
  std::vector<std::string> in_error;  // substrings of the error
};

std::string select_name(const ::testing::TestParamInfo<SelectCase>& info) {
  std::string spec = info.param.spec;
  for (char& c : spec) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return fmt::format("{}_{}_on_{}_{}", info.index, spec.empty() ? "empty" : spec,
                     op_name(info.param.op),
                     info.param.device == DeviceType::kCUDA ? "cuda" : "cpu");
}

class SelectMatrix : public ::testing::TestWithParam<SelectCase> {};

TEST_P(SelectMatrix, ChoosesOrExplains) {
  const SelectCase& c = GetParam();
  const Registry registry = make_fake_registry();
  const Device device = c.device == DeviceType::kCUDA ? Device::cuda(0) : Device::cpu();
  const Selection selection = Selection::parse(c.spec);
  if (std::string(c.expected).empty()) {
    try {
      const Backend& chosen = select_backend(registry, selection, op_on(c.op, device));
      ADD_FAILURE() << "chose " << chosen.name() << ", expected an error";
    } catch (const Error& error) {
      for (const std::string& needle : c.in_error) {
        EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
            << "'" << error.what() << "' lacks '" << needle << "'";
      }
    }
  } else {
    EXPECT_EQ(select_backend(registry, selection, op_on(c.op, device)).name(), c.expected);
  }
}

using K = OpKind;
using testing::ScopedEnv;
constexpr auto kCpu = DeviceType::kCPU;
constexpr auto kCuda = DeviceType::kCUDA;

INSTANTIATE_TEST_SUITE_P(
    Registry, SelectMatrix,
    ::testing::Values(
        // auto: first of the device's backends that supports, in priority order.
        SelectCase{"auto", K::kDecode, kCuda, "fast_gpu", {}},
        SelectCase{"auto", K::kPrefill, kCuda, "gpu", {}},
        SelectCase{"auto", K::kMlaDecode, kCuda, "fast_gpu", {}},
        SelectCase{"auto",
                   K::kMlaExtend,
                   kCuda,
                   "",
                   {"no backend can run mla_extend", "fast_gpu: no mla_extend kernel",
                    "gpu: MLA is not implemented"}},
        SelectCase{"auto", K::kDecode, kCpu, "fast_cpu", {}},
        SelectCase{"auto", K::kPrefill, kCpu, "cpu", {}},
        SelectCase{"auto", K::kMlaExtend, kCpu, "cpu", {}},
        SelectCase{"", K::kPrefill, kCpu, "cpu", {}},
        // explicit: served, or an error naming backend, operation and reason.
        SelectCase{"cpu", K::kDecode, kCpu, "cpu", {}},
        SelectCase{"gpu", K::kPrefill, kCuda, "gpu", {}},
        SelectCase{"gpu", K::kMlaDecode, kCuda, "", {"'gpu'", "mla_decode", "MLA is not"}},
        SelectCase{"fast_cpu", K::kPrefill, kCpu, "", {"'fast_cpu'", "prefill", "no prefill"}},
        SelectCase{"broken", K::kDecode, kCpu, "", {"'broken'", "decode", "device lost"}},
        SelectCase{"gpu", K::kDecode, kCpu, "", {"'gpu'", "runs on cuda", "on cpu"}},
        SelectCase{"cpu", K::kDecode, kCuda, "", {"'cpu'", "runs on cpu", "cuda:0"}},
        // unknown: lists the known ones.
        SelectCase{"tpu",
                   K::kDecode,
                   kCpu,
                   "",
                   {"'tpu'", "not known", "auto, fast_gpu, gpu, fast_cpu, cpu, broken"}},
        // per role: prefill governs prefill and MLA extend, decode governs decode and MLA decode.
        SelectCase{"prefill=cpu,decode=fast_cpu", K::kPrefill, kCpu, "cpu", {}},
        SelectCase{"prefill=cpu,decode=fast_cpu", K::kMlaExtend, kCpu, "cpu", {}},
        SelectCase{"prefill=cpu,decode=fast_cpu", K::kDecode, kCpu, "fast_cpu", {}},
        SelectCase{"prefill=cpu,decode=fast_cpu", K::kMlaDecode, kCpu, "fast_cpu", {}},
        SelectCase{"decode=cpu", K::kDecode, kCpu, "cpu", {}},
        SelectCase{"decode=cpu", K::kPrefill, kCpu, "cpu", {}},
        SelectCase{
            "decode=cpu, prefill=fast_cpu", K::kPrefill, kCpu, "", {"'fast_cpu'", "prefill"}},
        SelectCase{"prefill=gpu,decode=fast_gpu", K::kDecode, kCuda, "fast_gpu", {}}),
    select_name);

TEST(Registry, SpecParsing) {
  EXPECT_EQ(Selection::parse("").decode, "auto");
  EXPECT_EQ(Selection::parse("  cuda ").prefill, "cuda");
  const Selection split = Selection::parse("prefill=cuda, decode = cpu");
  EXPECT_EQ(split.prefill, "cuda");
  EXPECT_EQ(split.decode, "cpu");
  EXPECT_EQ(split.for_op(OpKind::kMlaExtend), "cuda");
  EXPECT_EQ(split.for_op(OpKind::kMlaDecode), "cpu");
  const Selection one = Selection::parse("decode=cpu");
  EXPECT_EQ(one.prefill, "auto");
  // Each message quotes the spec and says what in it is wrong.
  const std::pair<const char*, const char*> bad_specs[] = {
      {"prefill=", "'' is not a backend name for role 'prefill'"},
      {"=cpu", "unknown role ''"},
      {"verify=cpu", "unknown role 'verify'"},
      {"prefill=a,prefill=b", "role 'prefill' given twice"},
      {"CPU", "expected 'auto', a backend name"},
      {"cpu,decode=cuda", "item 'cpu' is not ROLE=NAME"},
      {"cuda cpu", "expected 'auto', a backend name"},
      {"prefill=cpu,", "item '' is not ROLE=NAME"}};
  for (const auto& [bad, why] : bad_specs) {
    EXPECT_EQ(testing::error_containing([&] { Selection::parse(bad); },
                                        {fmt::format("backend spec '{}'", bad), why}),
              "")
        << bad;
  }
  try {
    Selection::parse("verify=cpu");
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("unknown role 'verify'"), std::string::npos);
  }
}

TEST(Registry, EnvironmentVariable) {
  ScopedEnv env("PAGEDATTN_BACKEND", std::nullopt);
  EXPECT_EQ(Selection::from_env().decode, "auto");
  env.set("PAGEDATTN_BACKEND", "prefill=cuda,decode=cpu");
  EXPECT_EQ(Selection::from_env().prefill, "cuda");
  EXPECT_EQ(Selection::from_env().decode, "cpu");
  env.set("PAGEDATTN_BACKEND", "");
  EXPECT_EQ(Selection::from_env().prefill, "auto");
  env.set("PAGEDATTN_BACKEND", "bogus=1");
  try {
    Selection::from_env();
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("PAGEDATTN_BACKEND"), std::string::npos);
  }
}

TEST(Registry, AddRejectsDuplicatesNullAndAuto) {
  Registry registry = make_fake_registry();
  EXPECT_EQ(testing::error_containing(
                [&] {
                  registry.add(std::make_unique<FakeBackend>("cpu", DeviceType::kCPU, everything));
                },
                {"a backend named 'cpu' is already registered"}),
            "");
  EXPECT_EQ(testing::error_containing(
                [&] {
                  registry.add(std::make_unique<FakeBackend>("auto", DeviceType::kCPU, everything));
                },
                {"'auto' is reserved"}),
            "");
  EXPECT_EQ(testing::error_containing([&] { registry.add(nullptr); }, {"backend is null"}), "");
  EXPECT_EQ(registry.find("nope"), nullptr);
  EXPECT_EQ(registry.names().size(), 5u);
}

TEST(Registry, BuiltinListsCudaThenCpu) {
  const Registry& registry = Registry::builtin();
#ifdef PAGEDATTN_WITH_CUDA
  EXPECT_EQ(registry.names(), (std::vector<std::string>{"cuda", "cuda_generic", "cpu"}));
#else
  EXPECT_EQ(registry.names(), (std::vector<std::string>{"cuda", "cpu"}));
#endif
  EXPECT_EQ(&registry, &Registry::builtin());
  EXPECT_EQ(registry.find("cpu")->device_type(), DeviceType::kCPU);
  EXPECT_EQ(registry.find("cuda")->device_type(), DeviceType::kCUDA);
}

TEST(Registry, BuiltinExplicitCudaSaysWhyItCannotServe) {
  const Registry& registry = Registry::builtin();
  const OpDesc op = op_on(OpKind::kDecode, Device::cuda(0));
  const Support support = registry.find("cuda")->supports(op);
  if (support) GTEST_SKIP() << "a usable CUDA device is present: explicit cuda can serve";
  EXPECT_FALSE(support.reason.empty());
#ifndef PAGEDATTN_WITH_CUDA
  EXPECT_EQ(support.reason,
            "pagedattn was built without CUDA (configure with -DPAGEDATTN_CUDA=ON)");
#endif
  try {
    select_backend(registry, Selection::parse("cuda"), op);
    ADD_FAILURE() << "explicit cuda was accepted";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'cuda'"), std::string::npos) << message;
    EXPECT_NE(message.find("decode"), std::string::npos) << message;
    EXPECT_NE(message.find(support.reason), std::string::npos) << message;
  }
  // The same for a CPU-resident operation: the unavailability is the reason given.
  EXPECT_THROW(
      select_backend(registry, Selection::parse("cuda"), op_on(OpKind::kPrefill, Device::cpu())),
      Error);
}

TEST(Registry, BuiltinUnknownNameListsKnownBackends) {
  try {
    select_backend(Registry::builtin(), Selection::parse("rocm"),
                   op_on(OpKind::kDecode, Device::cpu()));
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
#ifdef PAGEDATTN_WITH_CUDA
    const std::string known = "known backends: auto, cuda, cuda_generic, cpu";
#else
    const std::string known = "known backends: auto, cuda, cpu";
#endif
    EXPECT_NE(std::string(error.what()).find(known), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace pagedattn
