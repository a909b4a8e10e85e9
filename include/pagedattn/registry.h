// The backend registry and the selection rule.
//
// The registry is filled explicitly in one place (register_builtin_backends, src/registry), in
// priority order per device. Selection:
//   "auto"  walks the backends for the operation's device in order and takes the first whose
//           supports() says yes, silently;
//   a name  takes that backend; if it cannot serve the operation, Error names the backend, the
//           operation and the reason. An unknown name lists the known ones.
// A selection spec is "auto", a name ("cpu", "cuda"), or per role "prefill=cuda,decode=cpu";
// prefill also governs MLA extend, decode also MLA decode. The environment variable
// PAGEDATTN_BACKEND supplies the spec when the caller gives none.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/backend.h"

namespace pagedattn {

class Registry {
 public:
  void add(std::unique_ptr<Backend> backend);
  std::span<const std::unique_ptr<Backend>> backends() const { return backends_; }
  const Backend* find(std::string_view name) const;
  std::vector<std::string> names() const;

  // The registry of the built-in backends, in priority order (built once).
  static const Registry& builtin();

 private:
  std::vector<std::unique_ptr<Backend>> backends_;
};

// Fills `registry` with the built-in backends (CUDA first when compiled in: "cuda", then the
// "cuda_generic" fallback; then CPU).
void register_builtin_backends(Registry& registry);

struct Selection {
  std::string prefill = "auto";
  std::string decode = "auto";

  // Parses a spec (see above); throws Error on a malformed one.
  static Selection parse(std::string_view spec);
  // PAGEDATTN_BACKEND, or "auto" when unset or empty.
  static Selection from_env();
  const std::string& for_op(OpKind op) const { return is_decode_like(op) ? decode : prefill; }
};

// The backend that will run `op` under `selection`; throws Error as described above.
const Backend& select_backend(const Registry& registry, const Selection& selection,
                              const OpDesc& op);

}  // namespace pagedattn
