// The exactly-once audit (--audit-dir): every rank records every sample it trains on, so that
// mpi_scripts/check-audit.py can prove that each sample was used exactly once per epoch across failures,
// resizes and relaunches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sinew::train {

/// Appends one line per micro-batch to DIR/audit-<host>-<pid>.txt: "GEN EPOCH STEP DATA_EPOCH i1 i2 ...".
/// GEN is the restart generation, EPOCH the membership epoch. Unbuffered (one write per line), so that a
/// killed rank's records up to its death are on disk. Default-constructed: records nothing.
class AuditLog {
 public:
  AuditLog() = default;
  /// Creates DIR if needed; throws InvalidArgument naming --audit-dir if the file cannot be created.
  explicit AuditLog(const std::string& dir);
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;
  AuditLog(AuditLog&& o) noexcept;
  AuditLog& operator=(AuditLog&& o) noexcept;
  ~AuditLog();

  /// Throws DataError if the write fails.
  void record(int generation, std::uint64_t membership_epoch, std::int64_t step, std::int64_t data_epoch,
              const std::vector<std::size_t>& indices);

 private:
  int fd_ = -1;
  std::string line_;
};

}  // namespace sinew::train
