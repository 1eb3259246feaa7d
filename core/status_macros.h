#ifndef CORE_STATUS_MACROS_H_
#define CORE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "glog/logging.h"

// Returns from the enclosing function when expr (an absl::Status) is not OK.
#define MCC_RETURN_IF_ERROR(expr)              \
  do {                                         \
    const ::absl::Status _mcc_status = (expr); \
    if (!_mcc_status.ok()) return _mcc_status; \
  } while (0)

#define MCC_STATUS_CONCAT_INNER(a, b) a##b
#define MCC_STATUS_CONCAT(a, b) MCC_STATUS_CONCAT_INNER(a, b)

// MCC_ASSIGN_OR_RETURN(Tensor t, MakeTensor()); returns the error if any.
#define MCC_ASSIGN_OR_RETURN(lhs, expr)                                       \
  MCC_ASSIGN_OR_RETURN_IMPL(MCC_STATUS_CONCAT(_mcc_statusor_, __LINE__), lhs, \
                            expr)
#define MCC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// Dies with the status message when expr is not OK: for invariants only.
#define MCC_CHECK_OK(expr)                             \
  do {                                                 \
    const ::absl::Status _mcc_status = (expr);         \
    CHECK(_mcc_status.ok()) << _mcc_status.ToString(); \
  } while (0)

#endif  // CORE_STATUS_MACROS_H_
