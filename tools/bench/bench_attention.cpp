// `pagedattn bench decode|prefill|mla`: attention throughput on the paged KV cache, printed beside
// the machine's memory bandwidth measured in the same run.
//
// Each configuration (batch x KV length x page size, ...) is one generated case from the shared
// case table (tests/common/cases.h: shuffled pages, the target shapes as defaults). It is
// planned once, then run_* is timed alone (median of repeated samples, tools/cli/report.h).
// Figures:
//   KV GB/s   = bytes of KV read once (K and V, or the MLA latent) / median time;
//   GFLOP/s   = 2 * visible (query, key) pairs * heads * (Dqk + Dvo) / median time;
//   mem GB/s  = the CPU read ceiling (tools/bench/cpu_ceiling.h: median of passes over >= 2 GiB,
//               same threads, same run; measured again after the rows to show drift);
//   ratio     = KV GB/s / mem GB/s (the decode target is >= 0.6).
// `--device cuda` runs the issues' rows on device-generated data through run_cuda_rows()
// (tools/bench/bench_cuda_rows.h: the defaults are the issues' rows, --rows / --batch x --kv-len
// pick others, --page-size, --reps, MLA --qo-heads); `--device cuda --host-data` runs the generated
// host case above on the device instead (bench_attention_cuda(), tools/bench/bench_cuda.h). Without
// a usable device (or a CUDA build) both say "no usable CUDA device: <why>" and exit with 0.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/cases.h"
#include "core/check.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_simd.h"
#include "tools/bench/bench_cuda.h"
#include "tools/bench/bench_cuda_rows.h"
#include "tools/bench/cpu_ceiling.h"
#include "tools/cli/command.h"
#include "tools/cli/report.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pagedattn::tools {

// The default when no CUDA implementation is linked in (see bench_cuda.h).
[[gnu::weak]] CudaBenchResult bench_attention_cuda(const testing::CaseSpec&, uint64_t,
                                                   const TimingOptions&) {
  CudaBenchResult result;
  result.note =
      "no usable CUDA device: this build has no CUDA backend (configure with "
      "-DPAGEDATTN_CUDA=ON)";
  return result;
}

[[gnu::weak]] CudaRowsStatus run_cuda_rows(const CudaRowsOptions&) {
  return {false,
          "no usable CUDA device: this build has no CUDA backend (configure with "
          "-DPAGEDATTN_CUDA=ON)"};
}

namespace {

struct AttentionBenchOptions {
  OpKind op = OpKind::kDecode;
  std::string device = "cpu";
  std::vector<int32_t> batches;
  std::vector<int32_t> kv_lens;
  std::vector<int32_t> q_lens;
  std::vector<int32_t> page_sizes;
  std::vector<int32_t> qo_heads;  // empty: the target case's
  int32_t kv_heads = 0, head_dim = 0, head_dim_vo = 0;
  std::string q_dtype = "bf16", kv_dtype = "bf16", layout = "NHD";
  bool non_causal = false;
  int32_t threads = 0;
  double min_time = 0.5;
  uint64_t seed = 20261202;
  std::string json_path;
  // --device cuda (device-generated rows, bench_cuda_rows.h):
  std::string rows;  // empty: the rows, or --batch x --kv-len when given
  bool batch_given = false, kv_len_given = false, q_len_given = false, page_given = false;
  bool host_data = false;
  bool no_graphs = false;
  int32_t reps = 0;
  std::string l2_flush = "clean";
};

int32_t current_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

testing::CaseSpec make_spec(const AttentionBenchOptions& o, int32_t batch, int32_t kv_len,
                            int32_t q_len, int32_t page, int32_t qo_heads) {
  testing::CaseSpec spec = o.op == OpKind::kDecode    ? testing::decode_target_case()
                           : o.op == OpKind::kPrefill ? testing::prefill_target_case()
                                                      : testing::mla_decode_target_case();
  spec.op = o.op;
  const auto q_dtype = parse_dtype(o.q_dtype);
  const auto kv_dtype = parse_dtype(o.kv_dtype);
  PA_CHECK(q_dtype.has_value(), "--q-dtype '{}': not a dtype (f32, f16, bf16)", o.q_dtype);
  PA_CHECK(kv_dtype.has_value(), "--kv-dtype '{}': not a dtype (f32, f16, bf16, fp8_e4m3)",
           o.kv_dtype);
  PA_CHECK(o.layout == "NHD" || o.layout == "HND", "--layout '{}': expected NHD or HND", o.layout);
  spec.q_dtype = *q_dtype;
  spec.kv_dtype = *kv_dtype;
  spec.layout = o.layout == "NHD" ? KvLayout::kNHD : KvLayout::kHND;
  if (qo_heads > 0) spec.num_qo_heads = qo_heads;
  if (o.kv_heads > 0 && !is_mla(o.op)) spec.num_kv_heads = o.kv_heads;
  if (o.head_dim > 0) spec.head_dim_qk = o.head_dim;
  if (o.head_dim_vo > 0) spec.head_dim_vo = o.head_dim_vo;
  if (o.head_dim > 0 && o.head_dim_vo == 0 && !is_mla(o.op)) spec.head_dim_vo = o.head_dim;
  spec.page_size = page;
  spec.alloc_page_size = page;
  spec.spare_pages = 0;
  spec.causal = !o.non_causal;
  spec.kv_lens.assign(static_cast<size_t>(batch), kv_len);
  spec.q_lens.clear();
  if (o.op == OpKind::kPrefill || q_len > 1) {
    PA_CHECK(q_len <= kv_len, "--q-len {} exceeds --kv-len {}", q_len, kv_len);
    spec.q_lens.assign(static_cast<size_t>(batch), q_len);
    if (is_mla(o.op)) spec.op = OpKind::kMlaExtend;
  }
  if (spec.kv_dtype == DType::kFP8E4M3) spec.kv_scale = 0.5f;
  return spec;
}

struct Measured {
  double run_ns = 0, plan_ns = 0, bandwidth_gbs = 0;
};

// Copies of a case (same spec and seed, so one plan serves all) that together exceed twice the
// last-level cache: the timed calls cycle through them, so each call reads its KV from memory, not
// from a cache the previous call filled (a large L3, 300 MiB on the GPU host's Xeon, would
// otherwise hold most of a 268 MB case and flatter the ratio to the read ceiling; a B 1 x 4096
// case of 16.8 MB takes 36 copies there: at 8 copies it was served from the L3 and read above the
// DRAM ceiling).
std::vector<std::unique_ptr<testing::AttentionCase>> cpu_rotation(const testing::CaseSpec& spec,
                                                                  uint64_t seed, int64_t l3_bytes,
                                                                  int64_t max_copies) {
  std::vector<std::unique_ptr<testing::AttentionCase>> cases;
  cases.push_back(std::make_unique<testing::AttentionCase>(spec, seed));
  const int64_t kv = std::max<int64_t>(1, cases[0]->kv_bytes());
  const int64_t cache = l3_bytes > 0 ? l3_bytes : int64_t{64} << 20;
  const int64_t copies = std::clamp<int64_t>((2 * cache + kv - 1) / kv, 1, max_copies);
  while (static_cast<int64_t>(cases.size()) < copies) {
    cases.push_back(std::make_unique<testing::AttentionCase>(spec, seed));
  }
  return cases;
}

Measured run_cpu_case(const std::vector<std::unique_ptr<testing::AttentionCase>>& cases,
                      const TimingOptions& timing) {
  const testing::AttentionCase& c = *cases[0];
  const std::unique_ptr<Backend> backend = cpu::make_backend();
  const Support support = backend->supports(c.op_desc());
  PA_CHECK(support.ok, "cpu backend cannot run {}: {}", c.spec().name(), support.reason);
  WorkspaceLimits limits;
  limits.max_batch = c.batch_size();
  limits.max_qo_rows = c.num_rows();
  limits.max_pages = static_cast<int64_t>(c.kv_indices().size());
  limits.max_qo_heads = c.spec().num_qo_heads;
  limits.max_head_dim = c.spec().head_dim_qk;
  const std::unique_ptr<Workspace> workspace = backend->create_workspace(limits);
  Measured m;
  m.plan_ns = median_ns_per_call([&] { backend->plan(*workspace, c.op_desc(), c.meta()); },
                                 TimingOptions{.min_total_seconds = 0.05});
  size_t next = 0;
  auto pick = [&]() -> const testing::AttentionCase& { return *cases[next++ % cases.size()]; };
  switch (c.spec().op) {
    case OpKind::kDecode:
      m.run_ns = median_ns_per_call([&] { backend->run_decode(*workspace, pick().decode_args()); },
                                    timing);
      break;
    case OpKind::kPrefill:
      m.run_ns = median_ns_per_call(
          [&] { backend->run_prefill(*workspace, pick().prefill_args()); }, timing);
      break;
    default:
      m.run_ns =
          median_ns_per_call([&] { backend->run_mla(*workspace, pick().mla_args()); }, timing);
      break;
  }
  return m;
}

// --device cuda without --host-data: the issues' rows on device-generated data.
void run_cuda_device_rows(const AttentionBenchOptions& o) {
  CudaRowsOptions c;
  c.bench = o.op == OpKind::kDecode    ? CudaBench::kDecode
            : o.op == OpKind::kPrefill ? CudaBench::kPrefill
                                       : CudaBench::kMla;
  std::string rows = o.rows;
  if (rows.empty() && (o.batch_given || o.kv_len_given || o.q_len_given)) {
    PA_CHECK(o.batch_given && o.kv_len_given,
             "--device cuda: give both --batch and --kv-len (or --rows BxL,...)");
    const std::vector<int32_t> q_lens = o.q_len_given ? o.q_lens : std::vector<int32_t>{0};
    for (int32_t b : o.batches) {
      for (int32_t l : o.kv_lens) {
        for (int32_t q : q_lens) {
          PA_CHECK(o.op != OpKind::kMlaDecode || q <= 1,
                   "--device cuda: MLA rows are decode (q_len 1); --q-len {} needs --host-data", q);
          rows += fmt::format("{}{}x{}", rows.empty() ? "" : ",", b,
                              q > 0 && o.op == OpKind::kPrefill ? fmt::format("{}/{}", q, l)
                                                                : fmt::format("{}", l));
        }
      }
    }
  }
  if (!rows.empty()) c.rows = parse_batch_lens(rows, "--rows");
  for (const BatchLen& row : c.rows) {
    PA_CHECK(o.op == OpKind::kPrefill || (!row.ragged && row.q_len == 0),
             "--rows {}: {} rows are BxL", row.name(), op_name(o.op));
  }
  for (int32_t p : o.page_sizes) PA_CHECK(p >= 1, "--page-size {}: expected >= 1", p);
  PA_CHECK(o.reps >= 0, "--reps {}: expected >= 1", o.reps);
  if (o.op == OpKind::kMlaDecode) {
    for (int32_t h : o.qo_heads)
      PA_CHECK(h >= 1 && h <= 128, "--qo-heads {}: expected 1 .. 128", h);
    c.heads = o.qo_heads;
  } else if (o.op == OpKind::kPrefill) {
    // Prefill: one shape (default the issue's, 32 / 8 heads, head_dim 128), qk = vo.
    PA_CHECK(o.qo_heads.size() <= 1, "--device cuda: prefill takes one --qo-heads value");
    const int32_t hq = o.qo_heads.empty() ? 32 : o.qo_heads[0];
    const int32_t hkv = o.kv_heads > 0 ? o.kv_heads : 8;
    const int32_t d = o.head_dim > 0 ? o.head_dim : 128;
    PA_CHECK(hq >= 1 && hkv >= 1 && hq % hkv == 0,
             "--qo-heads {} / --kv-heads {}: expected query heads a multiple of the KV heads", hq,
             hkv);
    PA_CHECK(
        d == 64 || d == 128 || d == 256,
        "--head-dim {}: the device rows take 64, 128 or 256 (other shapes run with --host-data)",
        d);
    PA_CHECK(o.head_dim_vo == 0 || o.head_dim_vo == d,
             "--head-dim-vo {}: the device rows have head_dim_vo = head_dim ({}); other shapes run "
             "with --host-data",
             o.head_dim_vo, d);
    c.qo_heads = hq;
    c.kv_heads = hkv;
    c.head_dim = d;
  } else {
    PA_CHECK(o.qo_heads.empty() && o.kv_heads == 0 && o.head_dim == 0 && o.head_dim_vo == 0,
             "--device cuda: the {} rows have the issue's shape (32/8 heads, head_dim 128); "
             "other shapes run with --host-data",
             op_name(o.op));
  }
  const bool fp8_kv = o.op == OpKind::kPrefill && o.kv_dtype == "fp8_e4m3";
  PA_CHECK(o.q_dtype == "bf16" && (o.kv_dtype == "bf16" || fp8_kv) && o.layout == "NHD",
           "--device cuda: the rows are bf16 NHD (prefill: --kv-dtype fp8_e4m3 adds each row over "
           "an fp8 cache); other dtypes / layouts run with --host-data");
  c.fp8_kv = fp8_kv;
  if (o.page_given) c.page_sizes = o.page_sizes;
  c.reps = o.reps;
  c.causal = !o.non_causal;
  c.graphs = !o.no_graphs;
  c.l2_flush = o.l2_flush;
  c.json_path = o.json_path;
  const CudaRowsStatus status = run_cuda_rows(c);
  if (!status.ran) fmt::print("{}\n", status.note);
}

void run_bench(const AttentionBenchOptions& o) {
  PA_CHECK(o.device == "cpu" || o.device == "cuda", "--device '{}': expected cpu or cuda",
           o.device);
  const bool cuda = o.device == "cuda";
  if (cuda && !o.host_data) {
    run_cuda_device_rows(o);
    return;
  }
#ifdef _OPENMP
  if (o.threads > 0) omp_set_num_threads(o.threads);
#endif
  TimingOptions timing;
  timing.min_sample_seconds = 0;
  timing.min_samples = 7;
  timing.min_total_seconds = o.min_time;

  double cpu_bandwidth = 0, max_ratio = 0;
  CpuReadCeiling ceiling;  // tools/bench/cpu_ceiling.h: measured before and after the rows
  if (!cuda) {
    ceiling = measure_cpu_read_ceiling(o.min_time);
    cpu_bandwidth = ceiling.median_gbs;
    fmt::print("{}\ncpu backend: {} threads, simd {}\n{}\n", machine_description(),
               current_threads(), cpu::simd::active_isa(),
               describe_ceiling("before the rows", ceiling));
  }
  Table table({"op", "B", "q_len", "kv_len", "heads", "dims", "P", "q/kv", "layout", "run_us",
               "plan_us", "KV_MB", "KV_GB/s", "GFLOP/s", "mem_GB/s", "ratio"});
  nlohmann::json results = nlohmann::json::array();
  const std::vector<int32_t> q_lens = o.q_lens.empty() ? std::vector<int32_t>{1} : o.q_lens;
  const std::vector<int32_t> heads_list = o.qo_heads.empty() ? std::vector<int32_t>{0} : o.qo_heads;
  const auto total = static_cast<int64_t>(heads_list.size() * o.batches.size() * o.kv_lens.size() *
                                          q_lens.size() * o.page_sizes.size());
  Progress progress(total, stderr_is_terminal());
  for (int32_t heads : heads_list) {
    for (int32_t batch : o.batches) {
      for (int32_t kv_len : o.kv_lens) {
        for (int32_t q_len : q_lens) {
          for (int32_t page : o.page_sizes) {
            const testing::CaseSpec spec = make_spec(o, batch, kv_len, q_len, page, heads);
            progress.step(spec.name());
            // The CPU cycles through copies larger than its caches (cpu_rotation); CUDA mirrors
            // one case to the device and flushes the L2 itself.
            const std::vector<std::unique_ptr<testing::AttentionCase>> cases =
                cpu_rotation(spec, o.seed, cuda ? 0 : ceiling.l3_bytes, cuda ? 1 : 64);
            const testing::AttentionCase& c = *cases[0];
            Measured m;
            if (cuda) {
              const CudaBenchResult r = bench_attention_cuda(spec, o.seed, timing);
              if (!r.available) {
                fmt::print("{}\n", r.note);
                return;
              }
              m.run_ns = r.median_ns;
              m.bandwidth_gbs = r.device_bandwidth_gbs;
            } else {
              m = run_cpu_case(cases, timing);
              m.bandwidth_gbs = cpu_bandwidth;
            }
            const double kv_gbs = static_cast<double>(c.kv_bytes()) / m.run_ns;
            const double gflops = c.flops() / m.run_ns;
            const double ratio = m.bandwidth_gbs > 0 ? kv_gbs / m.bandwidth_gbs : 0;
            max_ratio = std::max(max_ratio, ratio);
            const std::string dims = spec.head_dim_qk == spec.head_dim_vo
                                         ? fmt::format("{}", spec.head_dim_qk)
                                         : fmt::format("{}/{}", spec.head_dim_qk, spec.head_dim_vo);
            table.add_row(
                {std::string(op_name(spec.op)), fmt::format("{}", batch), fmt::format("{}", q_len),
                 fmt::format("{}", kv_len),
                 fmt::format("{}/{}", spec.num_qo_heads, spec.num_kv_heads), dims,
                 fmt::format("{}", page),
                 fmt::format("{}/{}", dtype_name(spec.q_dtype), dtype_name(spec.kv_dtype)),
                 o.layout, fmt::format("{:.1f}", m.run_ns / 1e3),
                 cuda ? "-" : fmt::format("{:.1f}", m.plan_ns / 1e3),
                 fmt::format("{:.1f}", static_cast<double>(c.kv_bytes()) / 1e6),
                 fmt::format("{:.1f}", kv_gbs), fmt::format("{:.1f}", gflops),
                 fmt::format("{:.1f}", m.bandwidth_gbs), ratio_text(ratio)});
            results.push_back({{"op", op_name(spec.op)},
                               {"case", spec.name()},
                               {"batch", batch},
                               {"q_len", q_len},
                               {"kv_len", kv_len},
                               {"num_qo_heads", spec.num_qo_heads},
                               {"num_kv_heads", spec.num_kv_heads},
                               {"head_dim_qk", spec.head_dim_qk},
                               {"head_dim_vo", spec.head_dim_vo},
                               {"page_size", page},
                               {"q_dtype", dtype_name(spec.q_dtype)},
                               {"kv_dtype", dtype_name(spec.kv_dtype)},
                               {"layout", o.layout},
                               {"run_us_median", m.run_ns / 1e3},
                               {"plan_us_median", m.plan_ns / 1e3},
                               {"kv_bytes", c.kv_bytes()},
                               {"kv_gbs", kv_gbs},
                               {"gflops", gflops},
                               {"memory_bandwidth_gbs", m.bandwidth_gbs},
                               {"ratio_to_memory_bandwidth", ratio}});
          }
        }
      }
    }
  }
  fmt::print("{}", table.str());
  if (!cuda)
    fmt::print("{}", ceiling_footer(ceiling, measure_cpu_read_ceiling(o.min_time), max_ratio));
  if (!o.json_path.empty()) {
    const nlohmann::json document = {{"benchmark", op_name(o.op)},
                                     {"device", o.device},
                                     {"machine", machine_description()},
                                     {"timestamp", utc_timestamp()},
                                     {"threads", current_threads()},
                                     {"simd", cpu::simd::active_isa()},
                                     {"results", results}};
    std::ofstream out(o.json_path);
    PA_CHECK(out.good(), "--json {}: cannot open for writing", o.json_path);
    out << document.dump(2) << "\n";
  }
}

void add_one(CLI::App& bench, OpKind op, const char* name, const char* description) {
  auto options = std::make_shared<AttentionBenchOptions>();
  options->op = op;
  if (op == OpKind::kDecode) {
    options->batches = {1, 16};
    options->kv_lens = {4096};
    options->page_sizes = {16};
  } else if (op == OpKind::kPrefill) {
    options->batches = {4};
    options->kv_lens = {2048};
    options->q_lens = {512};
    options->page_sizes = {16};
  } else {
    options->batches = {1, 16};
    options->kv_lens = {4096};
    options->q_lens = {1};
    options->page_sizes = {64};
  }
  CLI::App* cmd = bench.add_subcommand(name, description);
  cmd->add_option("--device", options->device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--batch", options->batches, "Batch sizes")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--kv-len", options->kv_lens, "KV lengths per request (prefix + new tokens)")
      ->delimiter(',')
      ->capture_default_str();
  if (op != OpKind::kDecode) {
    cmd->add_option("--q-len", options->q_lens, "Query rows per request (MLA: 1 = decode)")
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_flag("--non-causal", options->non_causal, "Every query row sees the whole KV");
  }
  cmd->add_option("--page-size", options->page_sizes,
                  "Attention page sizes P (--device cuda: default the issue's, e.g. 16,1)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--qo-heads", options->qo_heads,
                  "Query heads, one or a list (default: the target case's; MLA on cuda: 128,16)")
      ->delimiter(',');
  if (op != OpKind::kMlaDecode) {
    cmd->add_option("--kv-heads", options->kv_heads, "KV heads");
    cmd->add_option("--head-dim", options->head_dim, "head_dim (qk)");
    cmd->add_option("--head-dim-vo", options->head_dim_vo, "head_dim of V (default: head_dim)");
  }
  cmd->add_option("--q-dtype", options->q_dtype, "f32, f16, bf16")->capture_default_str();
  cmd->add_option("--kv-dtype", options->kv_dtype, "f32, f16, bf16, fp8_e4m3")
      ->capture_default_str();
  cmd->add_option("--layout", options->layout, "NHD or HND")->capture_default_str();
  cmd->add_option("--threads", options->threads, "CPU threads (default: OpenMP's)");
  cmd->add_option("--min-time", options->min_time, "Seconds of samples per figure")
      ->capture_default_str();
  cmd->add_option("--json", options->json_path, "Also write the results as JSON to FILE");
  const char* rows_help =
      op == OpKind::kPrefill
          ? "--device cuda: rows BxL (L new tokens), BxQ/L (Q new over L), "
            "raggedB/L; default 1x8192,1x32768,16x2048,ragged16/4096 and the extend "
            "rows 1x512/8192,1x512/32768,8x256/8192"
      : op == OpKind::kDecode ? "--device cuda: rows BxL; default the issue's six "
                                "(1x8192 ... 256x32768)"
                              : "--device cuda: rows BxL for every --qo-heads; default per "
                                "heads the issue's (H 128: 64|128 x 4096|8192; H 16: 16x1024, "
                                "16x4096, 128x4096, 64x16384)";
  cmd->add_option("--rows", options->rows, rows_help);
  cmd->add_option("--reps", options->reps,
                  "--device cuda: timed samples per row (median; default 20, prefill 10)");
  cmd->add_flag("--host-data", options->host_data,
                "--device cuda: time the host-generated case of --batch/--kv-len/... instead of "
                "the device-generated rows");
  cmd->add_option("--l2-flush", options->l2_flush,
                  "--device cuda: before each sample, clean (a streaming read: the L2 holds "
                  "clean lines of another buffer), dirty (a memset: its dirty lines are written "
                  "back inside the timed call) or off")
      ->check(CLI::IsMember({"clean", "dirty", "off"}))
      ->capture_default_str();
  if (op == OpKind::kDecode) {
    cmd->add_flag("--no-graphs", options->no_graphs,
                  "--device cuda: skip the CUDA-graph step timing");
  }
  cmd->callback([options, cmd] {
    options->batch_given = cmd->count("--batch") > 0;
    options->kv_len_given = cmd->count("--kv-len") > 0;
    options->q_len_given =
        cmd->get_option_no_throw("--q-len") != nullptr && cmd->count("--q-len") > 0;
    options->page_given = cmd->count("--page-size") > 0;
    run_bench(*options);
  });
}

void add_bench_decode_command(CLI::App& bench) {
  add_one(bench, OpKind::kDecode, "decode",
          "Decode attention: KV GB/s beside the measured memory bandwidth");
}
void add_bench_prefill_command(CLI::App& bench) {
  add_one(bench, OpKind::kPrefill, "prefill", "Prefill / extend attention: GFLOP/s and KV GB/s");
}
void add_bench_mla_command(CLI::App& bench) {
  add_one(bench, OpKind::kMlaDecode, "mla",
          "MLA decode (--q-len 1) or extend (--q-len > 1) over the latent cache");
}

PAGEDATTN_CLI_COMMAND("bench decode", add_bench_decode_command);
PAGEDATTN_CLI_COMMAND("bench prefill", add_bench_prefill_command);
PAGEDATTN_CLI_COMMAND("bench mla", add_bench_mla_command);

}  // namespace
}  // namespace pagedattn::tools
