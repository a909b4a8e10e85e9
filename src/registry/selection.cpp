// Backend selection: parsing a spec ("auto", "cpu", "prefill=cuda,decode=cpu") and choosing the
// backend for an operation under the rule of registry.h.
//
// auto:     the first backend of the operation's device type whose supports() says yes; if none
//           can, the error lists each candidate with its reason.
// explicit: the named backend or an Error naming it, the operation and the reason (its own
//           supports() reason first, else a device-type mismatch).
#include <cstdlib>

#include "core/check.h"
#include "pagedattn/registry.h"

namespace pagedattn {
namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string_view device_type_name(DeviceType type) {
  return type == DeviceType::kCUDA ? "cuda" : "cpu";
}

}  // namespace

Selection Selection::parse(std::string_view spec) {
  const std::string_view whole = trim(spec);
  Selection selection;
  if (whole.empty()) return selection;
  if (whole.find('=') == std::string_view::npos) {
    PA_CHECK(valid_name(whole),
             "backend spec '{}': expected 'auto', a backend name (lower case letters, digits, "
             "'_', '-'), or 'prefill=NAME,decode=NAME'",
             spec);
    selection.prefill = selection.decode = std::string(whole);
    return selection;
  }
  bool seen_prefill = false, seen_decode = false;
  std::string_view rest = whole;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    const size_t equals = item.find('=');
    PA_CHECK(equals != std::string_view::npos,
             "backend spec '{}': item '{}' is not ROLE=NAME (expected prefill=NAME,decode=NAME)",
             spec, item);
    const std::string_view role = trim(item.substr(0, equals));
    const std::string_view name = trim(item.substr(equals + 1));
    PA_CHECK(valid_name(name), "backend spec '{}': '{}' is not a backend name for role '{}'", spec,
             name, role);
    if (role == "prefill") {
      PA_CHECK(!seen_prefill, "backend spec '{}': role 'prefill' given twice", spec);
      seen_prefill = true;
      selection.prefill = std::string(name);
    } else if (role == "decode") {
      PA_CHECK(!seen_decode, "backend spec '{}': role 'decode' given twice", spec);
      seen_decode = true;
      selection.decode = std::string(name);
    } else {
      PA_FAIL("backend spec '{}': unknown role '{}', expected 'prefill' or 'decode'", spec, role);
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return selection;
}

// PAGEDATTN_BACKEND (ARCHITECTURE.md, "Switches": every environment switch the library reads).
Selection Selection::from_env() {
  const char* value = std::getenv("PAGEDATTN_BACKEND");
  if (value == nullptr || *value == '\0') return Selection{};
  try {
    return parse(value);
  } catch (const Error& error) {
    PA_FAIL("PAGEDATTN_BACKEND: {}", error.what());
  }
}

const Backend& select_backend(const Registry& registry, const Selection& selection,
                              const OpDesc& op) {
  const std::string& name = selection.for_op(op.op);
  if (name == "auto") {
    std::string reasons;
    for (const auto& backend : registry.backends()) {
      if (backend->device_type() != op.device.type) continue;
      const Support support = backend->supports(op);
      if (support) return *backend;
      reasons += fmt::format("\n  {}: {}", backend->name(), support.reason);
    }
    PA_FAIL("no backend can run {} ({}){}", op_name(op.op), op.str(),
            reasons.empty() ? fmt::format("\n  no backend is registered for device type {}",
                                          device_type_name(op.device.type))
                            : reasons);
  }
  const Backend* backend = registry.find(name);
  if (backend == nullptr) {
    PA_FAIL("backend '{}' (chosen for {}) is not known; known backends: auto, {}", name,
            op_name(op.op), fmt::join(registry.names(), ", "));
  }
  const Support support = backend->supports(op);
  PA_CHECK(support.ok, "backend '{}' cannot run {} ({}): {}", name, op_name(op.op), op.str(),
           support.reason);
  PA_CHECK(backend->device_type() == op.device.type,
           "backend '{}' cannot run {} ({}): it runs on {} devices, the operation's tensors are "
           "on {}",
           name, op_name(op.op), op.str(), device_type_name(backend->device_type()),
           op.device.str());
  return *backend;
}

}  // namespace pagedattn
