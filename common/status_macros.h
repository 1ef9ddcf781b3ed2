// Status propagation macros.
//
// Debian's abseil (20220623) ships absl::Status but not the RETURN_IF_ERROR /
// ASSIGN_OR_RETURN helpers, so pdserve defines its own, prefixed PD_ to avoid
// clashing with any later abseil that brings them.
//
// Header-only; no state, so thread-safety does not apply.
#ifndef PDSERVE_COMMON_STATUS_MACROS_H_
#define PDSERVE_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status); returns it from the enclosing function
// when it is not OK.
#define PD_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status pd_status_ = (expr);      \
    if (!pd_status_.ok()) return pd_status_; \
  } while (false)

#define PD_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define PD_STATUS_MACROS_CONCAT_(a, b) PD_STATUS_MACROS_CONCAT_INNER_(a, b)

// `PD_ASSIGN_OR_RETURN(lhs, expr)`: evaluates `expr` (an absl::StatusOr<T>);
// returns its status when not OK, otherwise moves the value into `lhs`, which
// may be a declaration (`auto x`) or an existing variable.
#define PD_ASSIGN_OR_RETURN(lhs, expr)                                        \
  PD_ASSIGN_OR_RETURN_IMPL_(PD_STATUS_MACROS_CONCAT_(pd_statusor_, __LINE__), \
                            lhs, expr)

#define PD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)     \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // PDSERVE_COMMON_STATUS_MACROS_H_
